"""Where the Hydra config tree is: one function below every entry point, so library code (the evaluation
run, the benchmarks) finds the configs without importing :mod:`lit_entropy.cli`, which re-exports it."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
"""The ``lit_entropy`` package folder (this file is in its ``utils/``)."""


def config_dir() -> Path:
    """The Hydra config tree: ``lit_entropy/conf`` in an installed wheel, else the checkout's ``conf/``."""
    for candidate in (PACKAGE / "conf", PACKAGE.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no Hydra configs (train.yaml) in {PACKAGE / 'conf'} or {PACKAGE.parent / 'conf'}")
