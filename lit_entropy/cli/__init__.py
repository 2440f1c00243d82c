"""Command-line entry points: ``lit-entropy-train``, ``lit-entropy-eval``, ``lit-entropy-compare`` and
``lit-entropy-export``.

The same functions back ``scripts/train.py``, ``scripts/evaluate.py``, ``scripts/compare.py`` and
``scripts/export.py``, so an
installed package and a checkout take the same arguments. Runs write under the current folder
(``paths.root_dir`` defaults to it), wherever the package is installed.
"""

from __future__ import annotations

import os

from lit_entropy.utils.config_path import PACKAGE, config_dir

__all__ = ["PACKAGE", "config_dir", "quiet_engine_defaults"]


def quiet_engine_defaults(argv: list[str] | None = None) -> None:
    """vLLM in-process unless the environment says otherwise, and torch's C++ messages quiet unless
    ``verbose=true`` is among ``argv`` (both before torch's and vLLM's import; vLLM's own log level is set
    by :func:`lit_entropy.utils.terminal.quiet_third_party`, which reads ``verbose``)."""
    import sys

    from lit_entropy.utils.terminal import quiet_cpp_before_torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    quiet_cpp_before_torch(sys.argv[1:] if argv is None else list(argv))
