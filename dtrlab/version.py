"""dtrlab's version (a leaf module: the sweep stamps it into cache files without importing the package façade)."""

__version__ = "0.1.0"
