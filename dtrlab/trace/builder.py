"""Build simrd logs in code: small hand-made graphs for tests, teaching and synthetic studies.

>>> log = LogBuilder()
>>> log.constant("x", 10)
>>> log.call("f", ["x"], [("a", 10)], time=1)
>>> trace = log.trace("tiny")

The builder writes the same JSON-lines records the DTR logger writes, and
:meth:`trace` parses them with the regular loader, so a hand-built trace goes
through exactly the code path of a real log.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from .model import Trace
from .simrd_log import parse_lines


class LogBuilder:
    """Accumulates log records; every method appends one instruction (and its MEMORY/ALIAS lines)."""

    def __init__(self, start: bool = True):
        self.records: list[dict] = []
        if start:
            self.annotate("START")

    def annotate(self, annotation: str) -> None:
        self.records.append({"INSTRUCTION": "ANNOTATE", "ANNOTATION": annotation})

    def backward(self) -> None:
        self.annotate("BACKWARD")

    def constant(self, name: str, size: int) -> None:
        self.records.append({"INSTRUCTION": "CONSTANT", "NAME": name})
        self.records.append({"INSTRUCTION": "MEMORY", "NAME": name, "MEMORY": str(size)})

    def call(self, op: str, args: Sequence[str], results: Sequence[tuple], time: int) -> None:
        """``results``: ``(name, size)`` or ``(name, size, alias_index)`` per output."""
        self.records.append({"INSTRUCTION": "CALL", "NAME": op, "ARGS": list(args),
                             "RESULT": [r[0] for r in results], "TIME": str(time)})
        for result in results:
            name, size = result[0], result[1]
            alias = result[2] if len(result) > 2 else -1
            self.records.append({"INSTRUCTION": "MEMORY", "NAME": name, "MEMORY": str(size)})
            self.records.append({"INSTRUCTION": "ALIAS", "NAME": name, "ALIAS": str(alias)})

    def mutate(self, op: str, args: Sequence[str], mutated: Sequence[int], time: int) -> None:
        self.records.append({"INSTRUCTION": "MUTATE", "NAME": op, "ARGS": list(args),
                             "MUTATE": list(mutated), "TIME": str(time)})

    def copy(self, destination: str, source: str) -> None:
        self.records.append({"INSTRUCTION": "COPY", "DST": destination, "SRC": source})

    def copy_from(self, destination: str, source: str) -> None:
        self.records.append({"INSTRUCTION": "COPY_FROM", "DST": destination, "SRC": source})

    def release(self, *names: str) -> None:
        for name in names:
            self.records.append({"INSTRUCTION": "RELEASE", "NAME": name})

    def lines(self) -> list[str]:
        return [json.dumps(record) for record in self.records]

    def write(self, path) -> None:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(self.lines()) + "\n")

    def trace(self, name: str = "built") -> Trace:
        return parse_lines(self.lines(), source=f"<{name}>", name=name)
