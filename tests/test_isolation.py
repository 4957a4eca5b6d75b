"""tests/conftest.py's guard against tests that leave the process changed for the next one."""

from __future__ import annotations

import pytest

from conftest import process_state


def test_the_guard_sees_the_environment_the_directory_and_torchs_configuration(tmp_path):
    torch = pytest.importorskip("torch")
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    before = process_state()
    # torch's own patch for its configuration: after pytest's monkeypatch.setattr on a torch config module is undone,
    # the entry is hidden (measured: hasattr is False), so the knob vanished for every later test.
    with pytest.MonkeyPatch.context() as patch, functorch_config.patch(activation_memory_budget=0.5), \
            inductor_config.patch(fallback_random=not inductor_config.fallback_random):
        patch.setenv("DTRLAB_ISOLATION_PROBE", "1")
        patch.chdir(tmp_path)
        after = process_state()
        assert [key for key in before if before[key] != after[key]] == [
            "os.environ", "working directory", "torch._functorch.config", "torch._inductor.config"]
    assert process_state() == before  # put back, so the guard passes this test
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch._functorch, "config", object())
        assert process_state()["torch._functorch.config"][0] is False  # the module itself replaced


def test_the_knob_is_still_there_after_the_guards_own_test(tmp_path):
    """The test above changes torch's configuration and puts it back: the knob must still be visible after it."""
    torch = pytest.importorskip("torch")
    test_the_guard_sees_the_environment_the_directory_and_torchs_configuration(tmp_path)
    assert torch._functorch.config.activation_memory_budget == 1.0
