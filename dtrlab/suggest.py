"""``did you mean``: the suggestion every "unknown name" error ends with."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping


def did_you_mean(word: object, choices: Iterable[object], meaning: Mapping[str, str] | None = None) -> str:
    """``" (did you mean 'dtr'?)"`` for the choice closest to ``word``, case aside (``a100-80gb`` is
    ``A100-80GB``, not the ``H100-80GB`` a case-sensitive match picks), or ``""`` when none is close.
    ``meaning`` maps a choice to the name suggested for it (``"llama"`` -> ``"hf:llama"``: what users type,
    and what they mean)."""
    by_folded = {}
    for choice in map(str, choices):
        by_folded.setdefault(choice.casefold(), choice)
    close = difflib.get_close_matches(str(word).casefold(), list(by_folded), n=1)
    if not close:
        return ""
    choice = by_folded[close[0]]
    return f" (did you mean {(meaning or {}).get(choice, choice)!r}?)"
