"""The quiet terminal: the silencing switch and the start-up block."""

from __future__ import annotations

import logging
import os
import warnings

import pytest

from lit_entropy.utils.terminal import quiet_cpp_before_torch, quiet_third_party, startup_block
from tests.helpers import compose_train


@pytest.fixture
def restore_logging(monkeypatch):
    names = ["lightning.pytorch", "lightning.fabric", "vllm", "transformers"]
    levels = {n: logging.getLogger(n).level for n in names}
    for key in ("VLLM_LOGGING_LEVEL", "TRANSFORMERS_VERBOSITY", "TORCH_CPP_LOG_LEVEL"):
        monkeypatch.delenv(key, raising=False)
    with warnings.catch_warnings():
        yield
    for n, level in levels.items():
        logging.getLogger(n).setLevel(level)


def test_default_silences_library_notices_but_not_warnings_about_the_run(restore_logging):
    silenced = quiet_third_party(verbose=False)
    assert "vllm" in silenced
    assert logging.getLogger("lightning.pytorch").getEffectiveLevel() == logging.WARNING
    assert not logging.getLogger("lightning.pytorch.utilities.rank_zero").isEnabledFor(logging.INFO)
    assert logging.getLogger("vllm.triton_utils.importing").getEffectiveLevel() == logging.ERROR
    assert os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        quiet_third_party(verbose=False)  # filters go in front of the "default" above
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", DeprecationWarning, stacklevel=1)
        warnings.warn("entropy left its band", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["entropy left its band"]


def test_verbose_changes_nothing_and_lets_vllm_speak(restore_logging):
    logging.getLogger("vllm").setLevel(logging.NOTSET)
    assert quiet_third_party(verbose=True) == []
    assert os.environ["VLLM_LOGGING_LEVEL"] == "INFO"
    assert logging.getLogger("vllm").level == logging.NOTSET


def test_user_environment_wins(restore_logging, monkeypatch):
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_third_party(verbose=False)
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_cpp_warnings_silenced_unless_verbose_on_the_command_line(restore_logging):
    quiet_cpp_before_torch(["verbose=true"])
    assert "TORCH_CPP_LOG_LEVEL" not in os.environ
    quiet_cpp_before_torch(["debug=smoke"])
    assert os.environ["TORCH_CPP_LOG_LEVEL"] == "ERROR"


def test_startup_block_names_model_engine_precision_strategy_controller_and_logs():
    cfg = compose_train(["logger=[tensorboard,csv]", "trainer.default_root_dir=/runs/x"])

    class Trainer:
        precision = "32-true"
        strategy = type("SingleDeviceStrategy", (), {})()

    block = startup_block(cfg, Trainer())
    lines = block.splitlines()
    assert len(lines) <= 6
    for field in ("model:", "engine: VLLMEngine", "precision: 32-true", "strategy: SingleDeviceStrategy",
                  "controller: EntrocraftCallback", "logs: /runs/x (tensorboard, csv)"):
        assert field in block, (field, block)
    report = "model: qwen2 (Qwen2ForCausalLM), 0.50M parameters\n  attention: sdpa"
    assert startup_block(cfg, Trainer(), model_report=report).startswith(report)
