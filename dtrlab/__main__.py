"""``python -m dtrlab ...`` is the ``dtrlab`` command line."""

import sys

from .cli import main

sys.exit(main())
