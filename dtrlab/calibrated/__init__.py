"""Policies that simulate to decide: a layer above the runtime and the sweep.

``monotone`` calibrates its base policy by running it at a few budgets (and reads those
runs from the sweep cache), so it cannot live beside ``lru`` in :mod:`dtrlab.policies`.
It registers its name in the policy registry (``dtrlab.policies.base``) when this
package is imported, which ``import dtrlab`` does; every sweep, also in worker
processes, then accepts ``"monotone"``.
"""

from .monotone import DEFAULT_CALIBRATION, CalibrationPoint, Monotone, calibrate, choose_cap, monotone_envelope

__all__ = ["DEFAULT_CALIBRATION", "CalibrationPoint", "Monotone", "calibrate", "choose_cap", "monotone_envelope"]
