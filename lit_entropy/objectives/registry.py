"""The loss terms, the knobs, and the queries the module asks of the objective's registries.

* A **selection rule** is one file of :mod:`lit_entropy.objectives.selection`, registered there with its
  :class:`SelectionRule` entry (:data:`SELECTION_RULES`, re-exported here with ``check_selection_args``).
* A **loss term** is one file of :mod:`lit_entropy.objectives.terms`: a function returning its contribution to
  the loss and the :class:`LossTerm` entry it registers (:data:`LOSS_TERMS`, re-exported here): the knob it
  reads (its coefficient, which controllers may change between steps) and the tensors it needs.
* The **knobs** (:data:`KNOBS`): the clip range, the clip and weight knobs below, and every term's coefficient.

:mod:`lit_entropy.objectives.objective` applies the entries, :class:`lit_entropy.algo.AlgoConfig`
validates against them and the module asks the queries at the bottom (e.g. :func:`needs_scores`).
This file imports no config: the queries read ``algo.selection`` etc. from whatever object they get.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from lit_entropy.objectives.kl import KL_KINDS
from lit_entropy.objectives.policy_loss import AGG_MODES as LOSS_AGGREGATIONS
from lit_entropy.objectives.selection import RULE_EFFECTS, RULE_INPUTS, SELECTION_RULES, SelectionRule
from lit_entropy.objectives.selection import check_args as check_selection_args
from lit_entropy.objectives.terms import LOSS_TERMS, TERM_NEEDS, LossTerm, TermInputs

__all__ = ["KL_KINDS", "LOSS_AGGREGATIONS", "KNOBS", "LOSS_TERMS", "RULE_EFFECTS", "RULE_INPUTS", "SELECTION_RULES",
           "TERM_NEEDS", "LossTerm", "SelectionRule", "TERM_KNOBS", "TermInputs", "check_selection_args"]


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


# ------------------------------------------------------------------------------------------------ knobs

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
