"""Which outcomes depend on where the allocator puts new segments (``address_policy``)?

Real ``cudaMalloc`` addresses are the driver's: a new segment may land above every
other (the caching model's ``address_policy="bump"``) or in a range an earlier,
released segment left (``"reuse"``, the lowest such range that holds it). Only where
a run releases segments (release-and-retry, expandable unmapping) can the two differ.
:func:`address_policy_flips` sweeps one trace under both and lists the budgets whose
outcome (status) differs: outcomes nobody can know without a GPU's actual addresses.
"""

from __future__ import annotations

import pandas as pd

from ..memory.caching import ADDRESS_POLICIES
from ..runtime import DEFAULT_OVERHEAD_LIMIT, RESERVED
from ..sweep import sweep
from ..trace.model import Trace

#: Columns of :func:`address_policy_flips`'s table.
FLIP_COLUMNS = ["ratio", "budget_bytes", "status_bump", "status_reuse", "evictions_bump", "evictions_reuse",
                "flipped"]


def address_policy_flips(trace: Trace | str, policy="dtr", *, ratios=None, budgets=None,
                         memory_options: dict | None = None, enforce: str = RESERVED, device_capacity=None,
                         overhead_limit: float = DEFAULT_OVERHEAD_LIMIT, jobs: int = 1, backend: str = "loky",
                         cache=True, progress: bool = False) -> pd.DataFrame:
    """One row per budget (:data:`FLIP_COLUMNS`): the status and evictions of the caching model with
    ``address_policy="bump"`` and ``"reuse"`` (other options from ``memory_options``), and
    ``flipped``, whether the status differs. Sweeps are cached like any other."""
    options = {k: v for k, v in (memory_options or {}).items() if k != "address_policy"}
    frames = {}
    for address_policy in ADDRESS_POLICIES:
        frames[address_policy] = sweep(trace, policy, ratios=ratios, budgets=budgets, jobs=jobs, backend=backend, cache=cache,
                                       progress=progress, overhead_limit=overhead_limit, memory="caching",
                                       memory_options={**options, "address_policy": address_policy},
                                       enforce=enforce, device_capacity=device_capacity)
    bump, reuse = frames["bump"], frames["reuse"]
    table = pd.DataFrame({"ratio": bump["ratio"], "budget_bytes": bump["budget_bytes"],
                          "status_bump": bump["status"], "status_reuse": reuse["status"],
                          "evictions_bump": bump["evictions"], "evictions_reuse": reuse["evictions"]})
    table["flipped"] = table["status_bump"] != table["status_reuse"]
    return table[FLIP_COLUMNS]
