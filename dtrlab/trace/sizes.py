"""The size settings a model source accepts (``dtrlab.trace.models``), kept free of torch so
that the CLI can offer them as options without importing it."""

#: Overrides of an ``hf:`` configuration (and of a user function's keyword arguments).
SIZE_KEYS = ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab")
