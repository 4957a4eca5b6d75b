"""A ``module:function`` source that casts its model itself (``model.to(torch.bfloat16)``, ``.half()``) is
censused like ``--dtype`` on the uncast model (issue 54 item 6; dtrlab.trace.models.fake_build)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dtrlab.analysis.knob_census import KnobPlan, KnobSource, census_knob  # noqa: E402
from dtrlab.trace.models import fake_workload  # noqa: E402

PLAN = KnobPlan(knobs=(0.0, 0.5, 1.0), resolution=1.0)


def _samples(source: str, backend: str, **options):
    evaluate = KnobSource(source, tuple(sorted(options.items())), backend, cache=False)
    return census_knob(evaluate, PLAN).samples


@pytest.mark.parametrize("function, dtype", [("bf16", torch.bfloat16), ("half", torch.float16)])
def test_a_user_cast_source_builds_in_its_dtype(function, dtype):
    with fake_workload(f"tests.user_precision:{function}") as workload:
        assert {p.dtype for p in workload.module.parameters()} == {dtype}
        assert all(p.requires_grad for p in workload.module.parameters())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_user_cast_source_is_censused_like_dtype(backend):
    cast = _samples("tests.user_precision:bf16", backend)
    assert cast.equals(_samples("tests.user_precision:plain", backend, dtype=torch.bfloat16))
    assert not cast.equals(_samples("tests.user_precision:plain", backend))  # the dtype shows in the census
