"""The model sources' names (``dtrlab.trace.models``), kept free of torch so that the command line can
refuse a misspelt source, with a suggestion, before it imports torch (seconds)."""

from __future__ import annotations

from ..suggest import did_you_mean

#: The prefixes of the libraries' sources; any other ``package.module:function`` is a user's own.
SCHEMES = ("torchvision", "hf", "diffusers")
#: The small models of :mod:`dtrlab.trace.zoo` (its ``MODELS``' keys; tests/test_cli_startup.py checks they agree).
ZOO_NAMES = ("resnet32", "densenet121", "densenet45", "transformer", "unet", "lstm", "treelstm", "unroll_gan")
HF_NAMES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "bert-base", "bert-large", "llama", "olmoe")
DIFFUSERS_NAMES = ("sd-unet", "dit-xl-2")
#: The libraries whose model names are listed here: the names, and what the library calls them.
_LISTED = {"hf": (HF_NAMES, "presets"), "diffusers": (DIFFUSERS_NAMES, "models")}


class ModelSourceError(ValueError):
    """A model source that does not name, build or run a model; the message names the model and the cause."""


def describe_sources() -> str:
    return (f"zoo models ({', '.join(sorted(ZOO_NAMES))}), torchvision:NAME (e.g. torchvision:resnet50), "
            f"hf:NAME ({', '.join(HF_NAMES)}), diffusers:NAME ({', '.join(DIFFUSERS_NAMES)}) "
            "or package.module:function")


def check_source(source: str) -> None:
    """Refuse, with the closest source, a zoo name, ``hf:`` or ``diffusers:`` name that names no model.
    ``torchvision:`` names and ``module:function`` sources are checked when they are built (their names
    need the import)."""
    scheme, colon, name = source.partition(":")
    if not colon:
        if source in ZOO_NAMES:
            return
        known = f"sources: {describe_sources()}"
    elif scheme in _LISTED:
        if name in _LISTED[scheme][0]:
            return
        known = f"{scheme}: {_LISTED[scheme][1]} are {', '.join(_LISTED[scheme][0])}"
    else:
        return
    # What users type for each source: its full name, and a library's name without its prefix ("llama").
    spellings = {name: name for name in ZOO_NAMES}
    for prefix, (names, _) in _LISTED.items():
        spellings |= {f"{prefix}:{name}": f"{prefix}:{name}" for name in names}
        spellings |= {name: f"{prefix}:{name}" for name in names}
    raise ModelSourceError(f"unknown model {source!r}{did_you_mean(source, spellings, spellings)}; {known}")

