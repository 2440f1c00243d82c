"""``lit-entropy-eval`` / ``scripts/evaluate.py``: Hydra overrides of ``evaluate.yaml``; see
:mod:`lit_entropy.evaluation_run`."""

from __future__ import annotations

import os
import sys

from lit_entropy.cli import quiet_engine_defaults
from lit_entropy.utils.terminal import quiet_third_party


def main(argv: list[str] | None = None) -> dict:
    """Evaluate a policy with sampling: accuracy, mean@k and unbiased pass@k (``argv``: key=value overrides)."""
    args = sys.argv[1:] if argv is None else list(argv)
    quiet_engine_defaults(args)
    quiet_third_party(verbose=any(a.lower() == "verbose=true" for a in args))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from lit_entropy.cli import config_dir
    from lit_entropy.cli.overrides import check
    from lit_entropy.evaluation_run import main as evaluate_main

    if not {"-h", "--help", "--cfg", "-c"} & set(args):
        check(args, config_dir(), "evaluate")  # an unknown key or option, named with its fix
    return evaluate_main(args)


def entry() -> None:
    """Console-script face of :func:`main`: the result is printed by the run, not returned to the shell."""
    main()


if __name__ == "__main__":
    entry()
