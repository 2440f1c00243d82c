"""The entropy bonus: −coef · the entropy, aggregated like the policy loss (``entropy_coef``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_entropy.objectives.policy_loss import entropy_bonus as entropy_bonus_loss
from lit_entropy.objectives.terms import LossTerm, TermInputs, register


def entropy_bonus(t: TermInputs, coef: Any) -> Tensor:
    """−coef · aggregated entropy."""
    return entropy_bonus_loss(t.entropy, t.mask, coef, t.algo.loss_agg, **t.counts)


register(LossTerm("entropy_bonus", "entropy_coef", entropy_bonus, needs=("entropy",)))
