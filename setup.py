"""Build the compiled log reader, region index, memory models and replay core; all other metadata lives in pyproject.toml.

Each layer owns its compiled form: the memory models' C twin (dtrlab/memory/_memory_core.h) and the
policies' (dtrlab/policies/_policy_spec.h, _policy_core.h) sit beside their Python code; the replay
core (dtrlab/runtime/_core.c) includes them from there.
"""

from setuptools import Extension, setup

C11 = ["-O3", "-std=c11"]
MEMORY_CORE = "dtrlab/memory/_memory_core.h"
POLICY_HEADERS = ["dtrlab/policies/_policy_spec.h", "dtrlab/policies/_policy_core.h"]

setup(
    ext_modules=[
        Extension("dtrlab.trace._logparse", ["dtrlab/trace/_logparse.c"], extra_compile_args=C11),
        Extension("dtrlab.runtime._regions", ["dtrlab/runtime/_regions.c"], depends=["dtrlab/runtime/_regions_core.h"],
                  extra_compile_args=C11),
        Extension("dtrlab.runtime._core", ["dtrlab/runtime/_core.c"],
                  depends=["dtrlab/runtime/_regions_core.h", *POLICY_HEADERS, MEMORY_CORE],
                  include_dirs=["dtrlab/memory", "dtrlab/policies"], extra_compile_args=C11),
        Extension("dtrlab.memory._compiled", ["dtrlab/memory/_compiled.c"], depends=[MEMORY_CORE],
                  extra_compile_args=C11),
    ],
)
