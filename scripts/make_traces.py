"""Regenerate the trace corpora: traces/ (small zoo models) and traces/models/ (today's models).

    python scripts/make_traces.py                  # the zoo corpus
    python scripts/make_traces.py lstm unet        # some zoo models (the manifest keeps the others)
    python scripts/make_traces.py --models         # the modern corpus in traces/models/
    python scripts/make_traces.py --models gpt2    # some of it

Writes <dir>/<name>.jsonl.gz, rewrites <dir>/manifest.json (the DTR artifact's shape
plus provenance fields: the command that regenerates each file and the package
versions; for the modern corpus also each log's sha256 and compressed size) and the table in traces/README.md between its marker comments. Every
model is recorded on the meta device (no tensor data). Needs the torch extra; the
modern corpus also the models extra (pip install -e '.[torch,models]').
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dtrlab.integrity import sha256_file
from dtrlab.trace import zoo
from dtrlab.trace.capture import capture, package_versions

TRACES = Path(__file__).resolve().parent.parent / "traces"
MODELS = TRACES / "models"
# Zoo models in the corpus, in manifest order. Full-depth DenseNet-121 is left out:
# DTR simulations of it take close to a minute at a half budget.
CORPUS = ("resnet32", "densenet45", "transformer", "unet", "lstm", "treelstm", "unroll_gan")
COST = "flops"  # deterministic: the same torch version regenerates identical files
TABLE_BEGIN, TABLE_END = "<!-- traces:begin -->", "<!-- traces:end -->"
MODELS_TABLE_BEGIN, MODELS_TABLE_END = "<!-- models:begin -->", "<!-- models:end -->"

# The modern corpus (traces/models/): name -> (source, options, title). Training sizes
# as published or commonly used; bfloat16 parameters and activations; costs are
# roofline times on an A100 (dtrlab.trace.costs).
MODERN = {
    "gpt2": ("hf:gpt2", {"batch": 8, "seq": 1024}, "GPT-2 small"),
    "gpt2-medium": ("hf:gpt2-medium", {"batch": 8, "seq": 1024}, "GPT-2 medium"),
    "llama-1b": ("hf:llama", {"batch": 4, "seq": 2048}, "Llama 3.2 1B-shaped decoder"),
    "bert-base": ("hf:bert-base", {"batch": 32, "seq": 512}, "BERT-base"),
    "vit_b_16": ("torchvision:vit_b_16", {"batch": 64}, "ViT-B/16"),
    "resnet50": ("torchvision:resnet50", {"batch": 64}, "ResNet-50"),
    "sd-unet": ("diffusers:sd-unet", {"batch": 8}, "Stable Diffusion U-Net"),
    "olmoe": ("hf:olmoe", {"batch": 4, "seq": 4096}, "OLMoE-1B-7B-shaped MoE decoder"),
    "dit-xl-2": ("diffusers:dit-xl-2", {"batch": 32}, "DiT-XL/2"),
    "llama-1b-8k": ("hf:llama", {"batch": 1, "seq": 8192}, "Llama 3.2 1B-shaped decoder, 8k context"),
}
MODERN_COST, MODERN_DTYPE = "roofline:A100", "bfloat16"


def record_zoo(name: str) -> dict:
    recording = capture(name, cost=COST)
    batch = recording.meta["batch"]
    log = f"{name}-b{batch}.jsonl.gz"
    recording.write(TRACES / log)
    title = zoo.MODELS[name].title
    return {
        "name": f"{title} ({batch})",
        "title": f"{title} ({batch})",
        "desc": recording.meta["desc"],
        "log": log,
        "has_start": True,
        "model": name,
        "batch_size": batch,
        "input_shape": recording.meta["input_shape"],
        "torch_version": recording.meta["torch_version"],
        "cost_model": COST,
        "ops": recording.op_count,
        "peak_live_bytes": recording.peak_live_bytes,
        "command": f"dtrlab capture {name} --batch {batch} --cost {COST} --out traces/{log}",
    }


def record_modern(name: str) -> dict:
    import torch

    source, options, title = MODERN[name]
    recording = capture(source, cost=MODERN_COST, dtype=getattr(torch, MODERN_DTYPE), **options)
    batch = recording.meta["batch"]
    log = f"{name}-b{batch}" + (f"-s{options['seq']}" if "seq" in options else "") + ".jsonl.gz"
    recording.write(MODELS / log)
    flags = " ".join(f"--{key} {value}" for key, value in options.items())
    return {
        "name": f"{title} ({batch})",
        "title": f"{title} ({batch})",
        "desc": recording.meta["desc"],
        "log": log,
        "has_start": True,
        "model": name,
        "source": source,
        "batch_size": batch,
        "input_shape": recording.meta["input_shape"],
        "dtype": MODERN_DTYPE,
        "device": recording.meta["device"],
        "torch_version": recording.meta["torch_version"],
        "versions": package_versions(),
        "cost_model": MODERN_COST,
        "ops": recording.op_count,
        "peak_live_bytes": recording.peak_live_bytes,
        "command": f"dtrlab capture {source} {flags} --dtype {MODERN_DTYPE} --cost {MODERN_COST} "
                   f"--out traces/models/{log}",
    }


def write_table(entries: list[dict], begin: str, end: str) -> None:
    readme = TRACES / "README.md"
    text = readme.read_text()
    head, rest = text.split(begin)
    _, tail = rest.split(end)
    rows = ["| log | model | batch | input | ops | peak live bytes | torch | cost |",
            "| --- | --- | --- | --- | ---: | ---: | --- | --- |"]
    rows += [f"| `{e['log']}` | {e['title']} | {e['batch_size']} | {e['input_shape']} | {e['ops']} | "
             f"{e['peak_live_bytes']:,} | {e['torch_version']} | {e['cost_model']} |" for e in entries]
    readme.write_text(head + begin + "\n" + "\n".join(rows) + "\n" + end + tail)


def main(argv: list[str]) -> None:
    modern = "--models" in argv
    names = [a for a in argv if a != "--models"]
    directory, corpus, make = (MODELS, MODERN, record_modern) if modern else (TRACES, CORPUS, record_zoo)
    unknown = sorted(set(names) - set(corpus))
    if unknown:
        sys.exit(f"unknown {'modern ' if modern else ''}corpus models {unknown}; known: {', '.join(corpus)}")
    manifest_path = directory / "manifest.json"
    entries = {e["model"]: e for e in json.loads(manifest_path.read_text())["models"]} if manifest_path.exists() else {}
    for name in names or corpus:
        entries[name] = make(name)
        print(json.dumps({k: entries[name][k] for k in ("log", "ops", "peak_live_bytes")}), flush=True)
    ordered = [entries[name] for name in corpus if name in entries]
    if modern:  # each log's checksum and size, from the file as it is (also for the entries not regenerated)
        for entry in ordered:
            entry.update(sha256=sha256_file(MODELS / entry["log"]), bytes=(MODELS / entry["log"]).stat().st_size)
    manifest_path.write_text(json.dumps({"models": ordered}, indent=2) + "\n")
    write_table(ordered, *((MODELS_TABLE_BEGIN, MODELS_TABLE_END) if modern else (TABLE_BEGIN, TABLE_END)))


if __name__ == "__main__":
    main(sys.argv[1:])
