"""EntroPIC's term (Yang et al. 2025): α · mean over the minibatch's confident loss tokens of (−r·|A|), its
coefficient ``pic_alpha`` driven by the EntroPIC controller (any sign)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from lit_entropy.objectives.entropic import entropic_term, high_prob_tokens
from lit_entropy.objectives.terms import LossTerm, TermInputs, register


def confident_tokens(mb: Mapping[str, Tensor], loss_mask: Tensor) -> dict[str, Tensor]:
    high = high_prob_tokens(mb["old_logp"], loss_mask)
    return {"high_prob": high, "num_high_prob": high.sum()}


def entropic(t: TermInputs, alpha: Any) -> Tensor:
    """EntroPIC (Yang et al. 2025): α · mean over the minibatch's confident loss tokens of (−r·|A|)."""
    p = t.prepared
    return alpha * entropic_term(t.logp, t.mb["old_logp"], t.mb["token_advantages"], p["high_prob"], p["num_high_prob"])


register(LossTerm("entropic", "pic_alpha", entropic, signed=True, prepare=confident_tokens))
