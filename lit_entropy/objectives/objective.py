"""The policy objective of one minibatch, assembled from the pure pieces of this package.

Two steps, so that nothing depends on how a minibatch is split into micro-batches:

1. :func:`select_tokens` runs once on the WHOLE minibatch: the token selection rule (DESIGN §7.3) and
   the global counts that normalise the aggregation.
2. :func:`micro_batch_loss` runs per micro-batch: surrogate (PPO-clip, GSPO or KL-Cov), selection,
   aggregation with the global counts, entropy bonus and KL penalty. Summing its value over the
   micro-batches (gradient accumulation) gives exactly the minibatch loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import selection as rules
from lit_entropy.objectives.entropic import entropic_term
from lit_entropy.objectives.kl import kl_estimate
from lit_entropy.objectives.policy_loss import (
    aggregate,
    clipped_surrogate,
    entropy_bonus,
    global_counts,
    gspo_surrogate,
    ratio,
)


@dataclass
class Knobs:
    """The values controllers may change between steps (read from the module every step)."""

    eps_low: float
    eps_high: float
    entropy_coef: float
    kl_coef: float
    pic_alpha: float = 0.0
    """EntroPIC's weight on high-probability tokens (Yang et al. 2025); 0 = off."""


PIC_PROB_THRESHOLD = 0.95
"""EntroPIC acts on tokens the pre-update policy gave probability above this."""


@dataclass
class TokenSelection:
    loss_mask: Tensor
    """[B, L] bool: response tokens that enter the loss."""
    detach: Tensor | None = None
    """[B, L] bool: tokens whose gradient is stopped (Clip-Cov)."""
    kl_selected: Tensor | None = None
    """[B, L] bool: tokens that get KL-Cov's penalty."""
    frac: float | None = None
    """Fraction of response tokens the rule touched (``train/masked_frac_<rule>``)."""
    num_tokens: Tensor | None = None
    num_seqs: Tensor | None = None
    high_prob: Tensor | None = None
    """[B, L] bool: loss tokens with pre-update probability > 0.95 (EntroPIC), when it is on."""
    num_high_prob: Tensor | None = None

    def rows(self, rows: slice | Tensor, width: int | None = None) -> TokenSelection:
        """The selection of a micro-batch: ``rows`` (slice or index tensor), the first ``width`` columns."""
        cut = lambda t: None if t is None else t[rows][:, :width]  # noqa: E731
        return TokenSelection(cut(self.loss_mask), cut(self.detach), cut(self.kl_selected), self.frac,
                              self.num_tokens, self.num_seqs, cut(self.high_prob), self.num_high_prob)


def needs_current_logp(algo: AlgoConfig) -> bool:
    """Clip-Cov and KL-Cov rank tokens by the current policy's log-probs over the whole minibatch."""
    return algo.selection in ("clip_cov", "kl_cov")


def select_tokens(
    algo: AlgoConfig,
    mb: dict[str, Tensor],
    knobs: Knobs,
    current_logp: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> TokenSelection:
    """Apply ``algo.selection`` to the whole minibatch ``mb`` and compute the global counts."""
    mask = mb["response_mask"].bool()
    adv = mb["token_advantages"]
    args = dict(algo.selection_args)
    sel = TokenSelection(loss_mask=mask)
    if algo.selection == "clip_cov":
        r = ratio(current_logp, mb["old_logp"])
        clipped = ((adv > 0) & (r > 1 + knobs.eps_high)) | ((adv < 0) & (r < 1 - knobs.eps_low))
        sel.detach, frac = rules.clip_cov(current_logp, adv, mask, clipped & mask, generator=generator, **args)
    elif algo.selection == "kl_cov":
        args.pop("beta", None)
        sel.kl_selected, frac = rules.kl_cov(current_logp, adv, mask, **args)
    elif algo.selection == "clip_b":
        sel.loss_mask, frac = rules.clip_b(mb["disc_s"], adv, mask, **args)
    elif algo.selection == "clip_v":
        sel.loss_mask, frac = rules.clip_v(mb["disc_s"], mb["disc_n"], adv, mask, **args)
    elif algo.selection == "forking":
        sel.loss_mask, frac = rules.forking_tokens(mb["entropy"], mask, **args)
        frac = 1.0 - frac  # report the fraction removed, like the other rules
    else:
        frac = None
    sel.frac = None if frac is None else float(frac)
    sel.num_tokens, sel.num_seqs = global_counts(sel.loss_mask)
    if knobs.pic_alpha != 0:
        sel.high_prob = sel.loss_mask & (mb["old_logp"] > math.log(PIC_PROB_THRESHOLD))
        sel.num_high_prob = sel.high_prob.sum()
    return sel


def micro_batch_loss(
    algo: AlgoConfig,
    knobs: Knobs,
    mb: dict[str, Tensor],
    sel: TokenSelection,
    logp: Tensor,
    entropy: Tensor | None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch (rows of ``mb`` and ``sel`` already sliced) and token-sum statistics."""
    mask = sel.loss_mask
    adv, old = mb["token_advantages"], mb["old_logp"]
    counts = {"num_tokens": sel.num_tokens, "num_seqs": sel.num_seqs, "norm_constant": algo.loss_norm_constant}
    if algo.loss == "gspo":
        loss_tok, info = gspo_surrogate(logp, old, adv, mask, knobs.eps_low, knobs.eps_high)
    elif sel.kl_selected is not None:
        loss_tok = rules.kl_cov_loss(logp, old, adv, sel.kl_selected, beta=algo.selection_args.get("beta", 1.0))
        none = torch.zeros_like(mask)
        info = {"clipped_low": none, "clipped_high": none}
    else:
        loss_tok, info = clipped_surrogate(logp, old, adv, knobs.eps_low, knobs.eps_high, algo.dual_clip,
                                           mask=mask)
    if sel.detach is not None:  # Clip-Cov: no gradient, and no value either (train/pg_loss reports the rest)
        loss_tok = torch.where(sel.detach, torch.zeros((), device=loss_tok.device), loss_tok)
    if "row_weight" in mb:  # a rollout hook's reweighting (Entrocraft's per-prompt 1/|S_x|)
        loss_tok = loss_tok * mb["row_weight"][:, None]
    pg_loss = aggregate(loss_tok, mask, algo.loss_agg, **counts)
    loss = pg_loss
    if knobs.pic_alpha != 0 and sel.high_prob is not None:
        loss = loss + knobs.pic_alpha * entropic_term(logp, old, adv, sel.high_prob, sel.num_high_prob)
    if knobs.entropy_coef > 0:
        if entropy is None:
            raise ValueError("the entropy bonus needs the entropy with gradient")
        loss = loss + entropy_bonus(entropy, mask, knobs.entropy_coef, algo.loss_agg, **counts)
    with torch.no_grad():
        r = ratio(logp.detach(), old)
        stats = {
            "pg_loss": pg_loss.detach(),
            "clip_low": (info["clipped_low"] & mask).sum(),
            "clip_high": (info["clipped_high"] & mask).sum(),
            "ratio": torch.where(mask, r, 0.0).sum(),
            "tokens": mask.sum(),
        }
        if entropy is not None:
            stats["entropy"] = torch.where(mask, entropy.detach(), 0.0).sum()
    if "ref_logp" in mb:
        kl_tok = kl_estimate(logp, mb["ref_logp"], algo.kl_kind, mask=mask, clamp=algo.kl_clamp)
        if knobs.kl_coef > 0:
            loss = loss + knobs.kl_coef * aggregate(kl_tok, mask, algo.loss_agg, **counts)
        stats["kl"] = torch.where(mask, kl_tok.detach(), 0.0).sum()
    return loss, stats
