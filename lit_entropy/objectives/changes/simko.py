"""SimKO (Peng et al. 2025, arXiv 2510.14807): on high-entropy tokens, correct responses also lift the top-K
candidates and incorrect ones push harder on a dominant top-1 (docs/design.md §7.8,
:func:`~lit_entropy.objectives.entropy_methods.simko_inputs`)."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from lit_entropy.objectives.changes import SurrogateChange, register
from lit_entropy.objectives.entropy_methods import SimkoArgs, high_entropy_tokens, simko_inputs


def split(args: SimkoArgs, mb: Mapping[str, Tensor], kept: Tensor, loss_mask: Tensor) -> dict[str, Tensor]:
    """The high-entropy tokens of each response, by the quantile over its kept response tokens."""
    return {"simko_high": high_entropy_tokens(mb["entropy"], kept, args.quantile)}


def mixed_inputs(args: SimkoArgs, logp: Tensor, old_logp: Tensor, advantages: Tensor,
                 topk: tuple[Tensor, Tensor] | None, prepared: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
    if topk is None:
        raise ValueError("algo.simko needs the top-K log-probs of the update's forward (topk)")
    return simko_inputs(logp, old_logp, advantages, *topk, prepared["simko_high"], args.alpha, args.lam)


register(SurrogateChange("simko", SimkoArgs, prepare=split, inputs=mixed_inputs, topk=lambda args: args.k))
