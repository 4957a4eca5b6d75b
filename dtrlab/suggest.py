"""``did you mean``: the suggestion every "unknown name" error ends with."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


def did_you_mean(word: object, choices: Iterable[object], meaning: Mapping[str, str] | None = None) -> str:
    """``" (did you mean 'dtr'?)"`` for the choice closest to ``word``, or ``""`` when none is close.
    ``meaning`` maps a choice to the name suggested for it (``"llama"`` -> ``"hf:llama"``: what users type,
    and what they mean)."""
    close = difflib.get_close_matches(str(word), [str(choice) for choice in choices], n=1)
    if not close:
        return ""
    return f" (did you mean {(meaning or {}).get(close[0], close[0])!r}?)"
