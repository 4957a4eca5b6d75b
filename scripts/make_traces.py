"""Regenerate the trace corpus in traces/: one FLOP-cost log per corpus model.

    python scripts/make_traces.py            # the whole corpus
    python scripts/make_traces.py lstm unet  # some models (the manifest keeps the others)

Writes traces/<model>-b<batch>.jsonl.gz, rewrites traces/manifest.json (the DTR
artifact's shape plus provenance fields) and the table in traces/README.md between
its marker comments.  Needs torch (pip install torch==2.13.0).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dtrlab.trace import zoo
from dtrlab.trace.capture import record

TRACES = Path(__file__).resolve().parent.parent / "traces"
# Zoo models in the corpus, in manifest order. Full-depth DenseNet-121 is left out:
# DTR simulations of it take close to a minute at a half budget.
CORPUS = ("resnet32", "densenet45", "transformer", "unet", "lstm", "treelstm", "unroll_gan")
COST = "flops"  # deterministic: the same torch version regenerates identical files
TABLE_BEGIN, TABLE_END = "<!-- traces:begin -->", "<!-- traces:end -->"


def capture(name: str) -> dict:
    workload = zoo.build(name)
    recording = record(workload.module, workload.inputs, loss_fn=workload.loss_fn, cost=COST)
    log = f"{name}-b{workload.batch}.jsonl.gz"
    recording.write(TRACES / log)
    title = zoo.MODELS[name].title
    return {
        "name": f"{title} ({workload.batch})",
        "title": f"{title} ({workload.batch})",
        "desc": workload.desc,
        "log": log,
        "has_start": True,
        "model": name,
        "batch_size": workload.batch,
        "input_shape": workload.input_shape,
        "torch_version": recording.meta["torch_version"],
        "cost_model": COST,
        "ops": recording.op_count,
        "peak_live_bytes": recording.peak_live_bytes,
        "command": f"dtrlab capture {name} --batch {workload.batch} --cost {COST} --out traces/{log}",
    }


def write_table(entries: list[dict]) -> None:
    readme = TRACES / "README.md"
    text = readme.read_text()
    head, rest = text.split(TABLE_BEGIN)
    _, tail = rest.split(TABLE_END)
    rows = ["| log | model | batch | input | ops | peak live bytes | torch | cost |",
            "| --- | --- | --- | --- | ---: | ---: | --- | --- |"]
    rows += [f"| `{e['log']}` | {e['title']} | {e['batch_size']} | {e['input_shape']} | {e['ops']} | "
             f"{e['peak_live_bytes']:,} | {e['torch_version']} | {e['cost_model']} |" for e in entries]
    readme.write_text(head + TABLE_BEGIN + "\n" + "\n".join(rows) + "\n" + TABLE_END + tail)


def main(names: list[str]) -> None:
    manifest_path = TRACES / "manifest.json"
    entries = {e["model"]: e for e in json.loads(manifest_path.read_text())["models"]} if manifest_path.exists() else {}
    for name in names or CORPUS:
        entries[name] = capture(name)
        print(json.dumps({k: entries[name][k] for k in ("log", "ops", "peak_live_bytes")}), flush=True)
    ordered = [entries[name] for name in CORPUS if name in entries]
    manifest_path.write_text(json.dumps({"models": ordered}, indent=2) + "\n")
    write_table(ordered)


if __name__ == "__main__":
    main(sys.argv[1:])
