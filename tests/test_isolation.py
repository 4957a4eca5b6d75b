"""tests/conftest.py's guard against tests that leave the process changed for the next one."""

from __future__ import annotations

import pytest

from conftest import process_state


def test_the_guard_sees_the_environment_the_directory_and_torchs_configuration(tmp_path):
    torch = pytest.importorskip("torch")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    before = process_state()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DTRLAB_ISOLATION_PROBE", "1")
        patch.chdir(tmp_path)
        patch.setattr(functorch_config, "activation_memory_budget", 0.5)
        patch.setattr(inductor_config, "fallback_random", not inductor_config.fallback_random)
        after = process_state()
        assert [key for key in before if before[key] != after[key]] == [
            "os.environ", "working directory", "torch._functorch.config", "torch._inductor.config"]
    assert process_state() == before  # put back, so the guard passes this test
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch._functorch, "config", object())
        assert process_state()["torch._functorch.config"][0] is False  # the module itself replaced
