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
from ..runtime import Semantics
from ..sweep import QUIET, Execution, sweep
from ..trace.model import Trace

#: The caching model under the reference semantics otherwise.
CACHING = Semantics(memory="caching")
#: Columns of :func:`address_policy_flips`'s table.
FLIP_COLUMNS = ["ratio", "budget_bytes", "status_bump", "status_reuse", "evictions_bump", "evictions_reuse",
                "flipped"]


def address_policy_flips(trace: Trace | str, policy="dtr", *, ratios=None, budgets=None,
                         semantics: Semantics = CACHING, execution: Execution = QUIET) -> pd.DataFrame:
    """One row per budget (:data:`FLIP_COLUMNS`): the status and evictions of the caching model with
    ``address_policy="bump"`` and ``"reuse"`` (other options, the runtime semantics and the limit from
    ``semantics``, whose model must be ``"caching"``), and ``flipped``, whether the status differs.
    Sweeps are cached like any other (``execution``)."""
    if semantics.memory != "caching":
        raise ValueError(f"address policies are the caching model's; give semantics=Semantics(memory='caching', "
                         f"...), not memory={semantics.memory!r}")
    options = {k: v for k, v in semantics.memory_options if k != "address_policy"}
    frames = {}
    for address_policy in ADDRESS_POLICIES:
        frames[address_policy] = sweep(trace, policy, ratios=ratios, budgets=budgets, execution=execution,
                                       semantics=semantics.with_(memory_options={**options,
                                                                                 "address_policy": address_policy}))
    bump, reuse = frames["bump"], frames["reuse"]
    table = pd.DataFrame({"ratio": bump["ratio"], "budget_bytes": bump["budget_bytes"],
                          "status_bump": bump["status"], "status_reuse": reuse["status"],
                          "evictions_bump": bump["evictions"], "evictions_reuse": reuse["evictions"]})
    table["flipped"] = table["status_bump"] != table["status_reuse"]
    return table[FLIP_COLUMNS]
