"""``did you mean``: the suggestion every "unknown name" error ends with."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: object, choices: Iterable[object]) -> str:
    """``" (did you mean 'dtr'?)"`` for the choice closest to ``word``, or ``""`` when none is close."""
    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
