"""Train a policy with RL: `python scripts/train.py [group=option ...] [key=value ...]`.

Examples:
    python scripts/train.py                                   # the Countdown lab with Entrocraft
    python scripts/train.py callbacks/entropy=none            # same run, no entropy controller
    python scripts/train.py debug=smoke                       # a one-minute check
    python scripts/train.py -m callbacks/entropy=none,entrocraft
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import sys  # noqa: E402

from lit_entropy.terminal import quiet_cpp_before_torch  # noqa: E402  (imports no torch)

quiet_cpp_before_torch(sys.argv[1:])

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from lit_entropy.config_keys import upgrade_overrides  # noqa: E402
from lit_entropy.train import run  # noqa: E402
from lit_entropy.utils.dist import rank  # noqa: E402


@hydra.main(version_base="1.3", config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    metrics = run(cfg)
    for key in ("rollout/accuracy", "rollout/entropy"):
        if key in metrics and rank() == 0:
            print(f"final {key} = {metrics[key]:.4f}")
    return metrics.get("rollout/accuracy")


if __name__ == "__main__":
    sys.argv[1:] = upgrade_overrides(sys.argv[1:])  # old key spellings keep working, with a warning
    main()
