"""Progress for every stage of dtrlab (sweeps, capture, the knob census, check, frontier, search), by one rule:

* on a terminal (the stream is a tty), or in a Jupyter kernel, a tqdm bar (``tqdm.auto``: a widget in a
  notebook);
* anywhere else (a pipe, a file, a CI log), no bar: one line per stage when it ends, such as
  ``check resnet32-b8: 6/6 census in 12.4 s (msps @ flat)``. A bar redrawn with carriage returns is
  debris there (``dtrlab check ... | tail`` showed nested bar fragments), and a line per stage says the
  same thing.

:func:`progress_bar` is the only place a bar is made; it takes tqdm's arguments, and what it returns has
the part of tqdm's interface dtrlab uses (``update``, ``n``, ``total``, ``set_description``,
``set_postfix``, ``set_postfix_str``, ``refresh``, ``write``, ``close``, iteration, ``with``).
"""

from __future__ import annotations

import sys
import time


def progress_bar(iterable=None, *, desc: str = "", total=None, unit: str = "it", disable: bool = False,
                 file=None, **options):
    """A progress display for one stage writing to ``file`` (default stderr): tqdm's bar where the stream
    is a terminal or a Jupyter kernel, else a :class:`StageLine` (one line when the stage ends).
    ``options`` go to tqdm (``initial`` is honoured by both)."""
    stream = sys.stderr if file is None else file
    if disable or interactive(stream):
        from tqdm.auto import tqdm  # here: a command's start-up does not pay for it (tests/test_cli_startup.py)

        return tqdm(iterable, desc=desc, total=total, unit=unit, disable=disable, file=file, **options)
    return StageLine(iterable, desc=desc, total=total, unit=unit, file=stream, initial=options.get("initial", 0))


def interactive(stream) -> bool:
    """Whether ``stream`` is a terminal, or this process is a Jupyter kernel (where tqdm draws a widget)."""
    isatty = getattr(stream, "isatty", None)
    if isatty is not None and isatty():
        return True
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class StageLine:
    """tqdm's interface without a bar: counts, and writes one line to ``file`` when the stage closes
    (``desc: n/total unit in S s (postfix)``); :meth:`write` passes a line through."""

    def __init__(self, iterable=None, *, desc: str = "", total=None, unit: str = "it", file=None,
                 initial: int = 0):
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.file = sys.stderr if file is None else file
        self.n = initial
        self.postfix = ""
        self.start = time.monotonic()
        self.closed = False
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            self.total = len(iterable)

    def __iter__(self):
        for item in self.iterable:
            yield item
            self.n += 1
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def set_postfix(self, ordered_dict=None, refresh: bool = True, **values) -> None:
        values = {**(ordered_dict or {}), **values}
        self.postfix = ", ".join(f"{key}={value}" for key, value in values.items())

    def refresh(self) -> None:
        """Nothing to redraw: the line is written when the stage closes."""

    def write(self, text: str) -> None:
        print(text, file=self.file, flush=True)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        postfix = f" ({self.postfix})" if self.postfix else ""
        label = f"{self.desc}: " if self.desc else ""
        self.write(f"{label}{count} {self.unit} in {time.monotonic() - self.start:.1f} s{postfix}")
