"""experiment=collapse: the lab's collapse regime composes, alone and under every controller and objective."""

from __future__ import annotations

import pytest
from hydra.utils import instantiate

from tests.helpers import CONF, compose_train

CONTROLLERS = sorted(p.stem for p in (CONF / "callbacks" / "entropy").glob("*.yaml"))


def test_the_collapse_regime_is_plain_grpo_with_small_batches_and_large_k_evaluation() -> None:
    cfg = compose_train(["experiment=collapse"])
    assert cfg.algo.name == "grpo" and not cfg.callbacks.entropy  # no controller: the regime itself
    assert (cfg.batch.prompts_per_iter, cfg.batch.group_size, cfg.batch.num_minibatches) == (32, 8, 4)
    assert cfg.optim.lr == pytest.approx(5e-4) and cfg.trainer.max_epochs == 120
    assert cfg.data.prompts.task.num_numbers == 3  # the default run's task and warm start, cached once
    ev = cfg.callbacks.eval
    assert ev._target_.endswith("PeriodicEvalCallback") and ev.n == 64 and list(ev.ks) == [1, 16, 64]
    assert cfg.callbacks.law.fit_first == 40
    callback = instantiate(ev)  # the evaluation settings are valid (every k <= n)
    assert callback.ks == (1, 16, 64) and callback.every == 30


@pytest.mark.parametrize("controller", [c for c in CONTROLLERS if c != "none"])
def test_a_controller_on_the_command_line_replaces_the_regimes_none(controller: str) -> None:
    algo = "ce_gppo" if controller == "gppo_beta" else "grpo"  # gppo_beta drives CE-GPPO's knobs only
    cfg = compose_train(["experiment=collapse", f"callbacks/entropy={controller}", f"algo={algo}"])
    assert cfg.callbacks.entropy._target_.startswith("lit_entropy.callbacks.")
    assert cfg.batch.prompts_per_iter == 32 and cfg.callbacks.eval.n == 64


@pytest.mark.parametrize("algo", ["clip_cov", "kl_cov", "clip_b", "dapo"])
def test_the_seed_objectives_compose_with_the_regime(algo: str) -> None:
    cfg = compose_train(["experiment=collapse", f"algo={algo}"])
    assert cfg.algo.name == algo and cfg.optim.lr == pytest.approx(5e-4)
