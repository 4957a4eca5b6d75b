"""Build the compiled log reader, region index and replay core; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dtrlab.trace._logparse", ["dtrlab/trace/_logparse.c"], extra_compile_args=["-O3", "-std=c11"]),
        Extension("dtrlab.runtime._regions", ["dtrlab/runtime/_regions.c"], depends=["dtrlab/runtime/_regions_core.h"],
                  extra_compile_args=["-O3", "-std=c11"]),
        Extension("dtrlab.runtime._core", ["dtrlab/runtime/_core.c"],
                  depends=["dtrlab/runtime/_regions_core.h", "dtrlab/runtime/_policy_spec.h",
                           "dtrlab/runtime/_policy_core.h", "dtrlab/runtime/_memory_core.h"],
                  extra_compile_args=["-O3", "-std=c11"]),
        Extension("dtrlab.runtime._memory", ["dtrlab/runtime/_memory.c"], depends=["dtrlab/runtime/_memory_core.h"],
                  extra_compile_args=["-O3", "-std=c11"]),
    ],
)
