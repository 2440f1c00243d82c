"""``lit-entropy-eval`` / ``scripts/evaluate.py``: Hydra overrides of ``evaluate.yaml``; see
:mod:`lit_entropy.evaluation_run`."""

from __future__ import annotations

import os
import sys

from lit_entropy.cli import quiet_engine_defaults


def main(argv: list[str] | None = None) -> dict:
    """Evaluate a policy with sampling: accuracy, mean@k and unbiased pass@k (``argv``: key=value overrides)."""
    quiet_engine_defaults()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lit_entropy.evaluation_run import main as evaluate_main

    return evaluate_main(sys.argv[1:] if argv is None else list(argv))


def entry() -> None:
    """Console-script face of :func:`main`: the result is printed by the run, not returned to the shell."""
    main()


if __name__ == "__main__":
    entry()
