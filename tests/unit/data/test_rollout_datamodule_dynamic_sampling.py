"""Dynamic sampling (DAPO) in the data module: the groups kept over the rounds are those
:func:`~lit_entropy.objectives.advantages.groups.select_groups` picks by :func:`~lit_entropy.objectives.advantages.groups.group_has_signal`."""

from __future__ import annotations

import pytest

from lit_entropy.data.rollout_datamodule import Group, RolloutDataModule
from lit_entropy.rollout.base import Generation
from lit_entropy.rollout.batch import BatchConfig
from lit_entropy.tasks.prompts import CountdownPrompts, Prompt

G = 2


class Tok:
    pad_id = 0


def module_with_rounds(rounds: list[list[float]], dynamic: bool = True, extra_rounds: int = 3) -> RolloutDataModule:
    """A data module whose sampling round ``r`` gives three groups with the rewards ``rounds[r]``."""
    dm = RolloutDataModule(CountdownPrompts(), batch=BatchConfig(prompts_per_iter=3, group_size=G, micro_batch_size=6,
                                                                 dynamic_sampling=dynamic,
                                                                 max_sampling_rounds=extra_rounds))

    def sample_round(tok, iteration, rnd, metrics, pre=None):
        rewards = rounds[rnd]
        groups = [Group(Prompt(f"p{rnd}{i}"), [1, 5 + i], [Generation([7, 2], [-0.1, -0.1], False)] * G,
                        rewards[G * i:G * (i + 1)], ["a"] * G) for i in range(3)]
        return groups, {"rollout/reward_mean": sum(rewards) / len(rewards)}, 0

    dm._sample_round = sample_round
    return dm


def test_groups_with_signal_fill_the_batch_over_rounds():
    dm = module_with_rounds([[0, 0, 1, 0, 1, 1], [0, 1, 0, 0, 0.5, 0.25], [1, 0, 1, 0, 1, 0]])
    metrics: dict[str, float] = {}
    batch = dm.sample_batch(Tok(), 0, metrics)
    assert batch.prompts == ["p01", "p01", "p10", "p10", "p12", "p12"]
    assert batch.rewards.tolist() == [1, 0, 0, 1, 0.5, 0.25]
    assert metrics["rollout/sampling_rounds"] == 2 and metrics["rollout/kept_groups_frac"] == 1.0
    assert metrics["rollout/reward_mean"] == pytest.approx(0.5)  # the first round's rollout/* metrics


def test_no_group_with_signal_keeps_the_first_round():
    dm = module_with_rounds([[0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 1]], extra_rounds=1)
    metrics: dict[str, float] = {}
    batch = dm.sample_batch(Tok(), 0, metrics)
    assert batch.prompts == ["p00", "p00", "p01", "p01", "p02", "p02"]
    assert metrics["rollout/sampling_rounds"] == 2 and metrics["rollout/kept_groups_frac"] == 0.0


def test_without_dynamic_sampling_every_group_is_kept():
    dm = module_with_rounds([[0, 0, 1, 1, 0, 0]], dynamic=False)
    metrics: dict[str, float] = {}
    batch = dm.sample_batch(Tok(), 0, metrics)
    assert batch.prompts == ["p00", "p00", "p01", "p01", "p02", "p02"]
    assert "rollout/sampling_rounds" not in metrics
