"""The figure pipeline: what ``dtrlab figures`` runs.

* :mod:`.figures`: every notebook under papermill, figures to ``figures/<trace set>/``.

It sits above every analysis layer and below the command line; nothing but the command line
imports it. The notebooks, traces and results it reads and writes are those of the checkout
the package is installed from (``pip install -e .``).
"""
