"""The loss terms, the knobs, and the queries the module asks of the objective's registries.

* A **selection rule** is one file of :mod:`lit_entropy.objectives.selection`, registered there with its
  :class:`SelectionRule` entry (:data:`SELECTION_RULES`, re-exported here with ``check_selection_args``).
* A **loss term** is a function returning its contribution to the loss plus one :class:`LossTerm` entry
  in :data:`LOSS_TERMS`: the knob it reads (its coefficient, which controllers may change between
  steps) and the tensors it needs.

:mod:`lit_entropy.objectives.objective` applies the entries, :class:`lit_entropy.algo.AlgoConfig`
validates against them and the module asks the queries at the bottom (e.g. :func:`needs_scores`).
This file imports no config: the queries read ``algo.selection`` etc. from whatever object they get.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Protocol

import torch
from torch import Tensor

from lit_entropy.objectives.correction import kl_bias_correction_ratio
from lit_entropy.objectives.entropic import entropic_term, high_prob_tokens
from lit_entropy.objectives.kl import KL_KINDS, kl_estimate
from lit_entropy.objectives.policy_loss import AGG_MODES as LOSS_AGGREGATIONS
from lit_entropy.objectives.policy_loss import aggregate, aggregate_token_mean, entropy_bonus
from lit_entropy.objectives.selection import RULE_EFFECTS, RULE_INPUTS, SELECTION_RULES, SelectionRule
from lit_entropy.objectives.selection import check_args as check_selection_args

__all__ = ["KL_KINDS", "LOSS_AGGREGATIONS", "KNOBS", "LOSS_TERMS", "RULE_EFFECTS", "RULE_INPUTS", "SELECTION_RULES",
           "SelectionRule", "TERM_KNOBS", "check_selection_args"]


class ObjectiveConfig(Protocol):
    """What the objective reads from ``algo`` (:class:`lit_entropy.algo.AlgoConfig`)."""

    loss: str
    selection: str | None
    selection_args: dict[str, Any]
    dual_clip: float | None
    loss_agg: str
    loss_norm_constant: float | None
    kl_kind: str
    kl_clamp: float | None
    erc: Any
    archer: Any
    simko: Any


# --------------------------------------------------------------------------------------------- selection



# ------------------------------------------------------------------------------------------- loss terms


@dataclass
class TermInputs:
    """One micro-batch as a loss term sees it (rows already sliced)."""

    algo: ObjectiveConfig
    mb: Mapping[str, Tensor]
    """The micro-batch's batch fields: ``old_logp``, ``token_advantages``, ``ref_logp`` when loaded, …"""
    mask: Tensor
    """[B, L] bool: the loss tokens (after the selection rule)."""
    logp: Tensor
    """[B, L] current log-probs, with gradient."""
    entropy: Tensor | None
    """[B, L] entropy, with gradient only when an active term needs it (:func:`needs_entropy_grad`)."""
    counts: dict[str, Any]
    """The minibatch-global ``num_tokens``, ``num_seqs`` and ``norm_constant`` of the aggregation."""
    prepared: dict[str, Tensor] = field(default_factory=dict)
    """What the active terms' ``prepare`` computed over the whole minibatch, these rows."""
    kl_bias_correction: bool = False
    """The KL penalty's per-token estimate is multiplied by π_θ/π_old (``correction.bias_corrected_kl``)."""

    def aggregate(self, values: Tensor) -> Tensor:
        """``values`` [B, L] aggregated like the policy loss (same mode, same global counts)."""
        return aggregate(values, self.mask, self.algo.loss_agg, **self.counts)

    @cached_property
    def kl_tokens(self) -> Tensor:
        """Per-token KL estimate to the reference policy (the KL term penalises it, ``train/kl_ref`` logs it)."""
        return kl_estimate(self.logp, self.mb["ref_logp"], self.algo.kl_kind, mask=self.mask, clamp=self.algo.kl_clamp)

    def has(self, need: str) -> bool:
        return self.entropy is not None if need == "entropy" else need in self.mb or need in self.prepared


TERM_NEEDS: dict[str, str] = {
    "entropy": "the entropy with gradient",
    "ref_logp": "the reference policy's log-probs (loaded when algo.kl_coef > 0)",
}
"""Tensors a term may need beyond ``logp``, ``old_logp``, ``token_advantages`` and the mask."""


@dataclass(frozen=True)
class LossTerm:
    """A registered term: ``loss += fn(inputs, knob value)`` on every micro-batch while the term is on."""

    name: str
    knob: str
    """The module attribute (and :class:`~lit_entropy.objectives.objective.Knobs` entry) holding its coefficient."""
    fn: Callable[[TermInputs, Any], Tensor]
    needs: tuple[str, ...] = ()
    """:data:`TERM_NEEDS` entries; a missing one is an error while the term is on."""
    signed: bool = False
    """On for any non-zero coefficient (EntroPIC's α ∈ [−1, 1]); otherwise on only for a coefficient > 0."""
    prepare: Callable[[Mapping[str, Tensor], Tensor], dict[str, Tensor]] | None = None
    """``prepare(minibatch, loss_mask)``, run once over the WHOLE minibatch while the term is on: [B, L]
    tensors (sliced per micro-batch) and 0-dim totals (kept whole) that land in ``TermInputs.prepared``."""

    def is_on(self, knobs: Mapping[str, Any]) -> bool:
        value = knobs[self.knob]
        return bool(value != 0) if self.signed else bool(value > 0)


def _confident_tokens(mb: Mapping[str, Tensor], loss_mask: Tensor) -> dict[str, Tensor]:
    high = high_prob_tokens(mb["old_logp"], loss_mask)
    return {"high_prob": high, "num_high_prob": high.sum()}


def _entropic(t: TermInputs, alpha: Any) -> Tensor:
    """EntroPIC (Yang et al. 2025): α · mean over the minibatch's confident loss tokens of (−r·|A|)."""
    p = t.prepared
    return alpha * entropic_term(t.logp, t.mb["old_logp"], t.mb["token_advantages"], p["high_prob"], p["num_high_prob"])


def _entropy_bonus(t: TermInputs, coef: Any) -> Tensor:
    """−coef · aggregated entropy."""
    return entropy_bonus(t.entropy, t.mask, coef, t.algo.loss_agg, **t.counts)


def _kl_penalty(t: TermInputs, coef: Any) -> Tensor:
    """coef · aggregated KL estimate to the reference (``algo.kl_kind``, ``algo.kl_clamp``); with
    ``kl_bias_correction`` each token's estimate is multiplied by π_θ/π_old, with its gradient (TRL,
    DeepSeek-V3.2).

    Archer: ``coef · mean_low(KL) + kl_high · mean_high(KL)``, each group's KL averaged over that group's own
    tokens of the minibatch, as the authors' script does under token-mean (a low-entropy token then weighs
    N/N_low times what a plain token-mean gives it). Under the other aggregations the high-entropy tokens'
    KL is weighted by ``kl_high`` instead of ``coef`` and aggregated like the loss."""
    kl = t.kl_tokens
    if t.kl_bias_correction:
        kl = kl * kl_bias_correction_ratio(t.logp, t.mb["old_logp"], t.mask)
    high = t.prepared.get("archer_high")
    if high is None:
        return coef * t.aggregate(kl)
    if t.algo.loss_agg == "token-mean":
        p = t.prepared
        return (coef * aggregate_token_mean(kl, t.mask & ~high, p["archer_n_low"])
                + t.algo.archer.kl_high * aggregate_token_mean(kl, t.mask & high, p["archer_n_high"]))
    weight = torch.where(high, float(t.algo.archer.kl_high), float(coef))
    return t.aggregate(weight * kl)


LOSS_TERMS: dict[str, LossTerm] = {term.name: term for term in (  # added to the loss in this order
    LossTerm("entropic", "pic_alpha", _entropic, signed=True, prepare=_confident_tokens),
    LossTerm("entropy_bonus", "entropy_coef", _entropy_bonus, needs=("entropy",)),
    LossTerm("kl_penalty", "kl_coef", _kl_penalty, needs=("ref_logp",)),
)}

TERM_KNOBS: tuple[str, ...] = tuple(term.knob for term in LOSS_TERMS.values())
CLIP_KNOBS: dict[str, float] = {"gppo_beta_low": 1.0, "gppo_beta_high": 1.0}
"""Knobs of the clipped surrogate beyond the clip range, with their defaults: the gradient scales that
``loss=gppo`` keeps on clipped tokens (a smooth actuator for a controller; unused by the other losses)."""
WEIGHT_KNOBS: dict[str, float] = {"stare_top_frac": 0.0, "stare_w": 1.0, "stare_m": 1.0}
"""Knobs of STARE's token weights ω on the per-token surrogate, with their defaults (``stare_top_frac`` 0: off):
the fraction P of each advantage sign's tokens ranked by surprisal on the current policy in each micro-batch, and
the weights on the positive (``stare_w``) and negative (``stare_m``) picks (:func:`~lit_entropy.objectives.stare.
micro_batch_weights`). The STARE controller sets them each iteration; ``stare_w = stare_m = 1`` weighs nothing."""
DEFAULT_KNOBS: dict[str, float] = {**CLIP_KNOBS, **WEIGHT_KNOBS}
"""Every knob that is not a loss term's coefficient (0 by default) nor the clip range, with its default."""
KNOBS: tuple[str, ...] = ("eps_low", "eps_high", *CLIP_KNOBS, *WEIGHT_KNOBS, *TERM_KNOBS)
"""Everything a controller may change between steps: the clip range, GPPO's betas, STARE's token weights and each
loss term's coefficient."""


# ---------------------------------------------------------------------------------------------- queries


def needs_current_logp(algo: ObjectiveConfig) -> bool:
    """The rule ranks tokens by the current policy's log-probs over the whole minibatch (an extra no-grad pass)."""
    return algo.selection is not None and SELECTION_RULES[algo.selection].needs_current_logp


def needs_scores(algo: ObjectiveConfig) -> bool:
    """The pre-update pass must compute the discriminator scores S, N for the rule."""
    return algo.selection is not None and SELECTION_RULES[algo.selection].needs_scores


def active_terms(knobs: Mapping[str, Any]) -> list[LossTerm]:
    """The loss terms whose coefficient is on, in :data:`LOSS_TERMS` order."""
    return [term for term in LOSS_TERMS.values() if term.is_on(knobs)]


def needs_entropy_grad(knobs: Mapping[str, Any]) -> bool:
    """An active term back-propagates through the entropy (the update must keep its graph)."""
    return any("entropy" in term.needs for term in active_terms(knobs))


def initial_knobs(algo: Any) -> dict[str, Any]:
    """Each knob's value when training starts: ``algo.<knob>`` where the config has that key, else
    ``algo.term_coefs[<knob>]``, else its default (:data:`DEFAULT_KNOBS`; 0 for a term's coefficient: the term is
    off until a controller sets it)."""
    coefs = getattr(algo, "term_coefs", {})
    return {name: getattr(algo, name) if hasattr(algo, name) else coefs.get(name, DEFAULT_KNOBS.get(name, 0.0))
            for name in KNOBS}
