"""The figure and shipping pipeline: what ``dtrlab figures`` and ``dtrlab ship`` run.

* :mod:`.figures`: every notebook under papermill, figures to ``figures/<trace set>/``;
* :mod:`.ship`: the targets of ``dtrlab ship``, each regenerating a part of ``results/shipped/``:
  the notebooks' runs (:mod:`.ship_results`), the limit census (:mod:`.ship_anatomy`) and the
  policy search's results (:mod:`.ship_search`).

It sits above every analysis layer and below the command line; nothing but the command line
imports it. The notebooks, traces and results it reads and writes are those of the checkout
the package is installed from (``pip install -e .``).
"""
