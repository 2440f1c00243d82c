"""Command-line entry points: ``lit-entropy-train``, ``lit-entropy-eval`` and ``lit-entropy-compare``.

The same functions back ``scripts/train.py``, ``scripts/evaluate.py`` and ``scripts/compare.py``, so an
installed package and a checkout take the same arguments. Runs write under the current folder
(``paths.root_dir`` defaults to it), wherever the package is installed.
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]


def config_dir() -> Path:
    """The Hydra config tree: ``lit_entropy/conf`` in an installed wheel, else the checkout's ``conf/``."""
    for candidate in (PACKAGE / "conf", PACKAGE.parent / "conf"):
        if (candidate / "train.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no Hydra configs (train.yaml) in {PACKAGE / 'conf'} or {PACKAGE.parent / 'conf'}")


def quiet_engine_defaults() -> None:
    """vLLM in-process and at error level unless the environment says otherwise (before vLLM's import)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
