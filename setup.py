"""Build the compiled region index; all other metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("dtrlab.runtime._regions", ["dtrlab/runtime/_regions.c"], extra_compile_args=["-O3", "-std=c11"]),
    ],
)
