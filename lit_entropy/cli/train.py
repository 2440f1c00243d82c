"""``lit-entropy-train`` / ``scripts/train.py``: compose ``train.yaml`` with Hydra overrides and fit the run.

The task function lives in a module named ``train`` so Hydra names the job ``train``, as it did when the
script held it.
"""

from __future__ import annotations

import sys

from lit_entropy.cli import config_dir, quiet_engine_defaults

FIT_FINISHED = "[lit-entropy] fit finished"
"""Printed (rank 0) once ``fit`` has returned: a study's runner takes a run as done only after this line, since a
run stopped by a signal (a session's or a job's end) may still exit with status 0."""


def main(argv: list[str] | None = None) -> None:
    """Train with Hydra overrides (``argv``, default ``sys.argv[1:]``), e.g. ``debug=smoke``; Hydra's own
    flags (``-m``, ``--cfg job``, ``--help``) work as with any Hydra app."""
    args = sys.argv[1:] if argv is None else list(argv)
    quiet_engine_defaults(args)
    import hydra
    from omegaconf import DictConfig

    from lit_entropy.train import run
    from lit_entropy.utils.dist import rank

    def task(cfg: DictConfig) -> float | None:
        metrics = run(cfg)
        if rank() == 0:
            for key in ("rollout/accuracy", "rollout/entropy"):
                if key in metrics:
                    print(f"final {key} = {metrics[key]:.4f}")
            print(FIT_FINISHED, flush=True)
        return metrics.get("rollout/accuracy")

    from lit_entropy.cli.overrides import check

    check(args, config_dir(), "train")  # an unknown key or option, named with its fix before Hydra's advice
    sys.argv[1:] = args  # Hydra reads its overrides and flags from sys.argv
    hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="train")(task)()


if __name__ == "__main__":
    main()
