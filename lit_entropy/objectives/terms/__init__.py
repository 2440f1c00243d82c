"""Loss terms (docs/design.md §6.3): what is added to the policy loss while its knob (a coefficient a controller may
drive) is on, one file per term, each registered by its file with :func:`register`.

Terms are added to the loss in the order of their files' names (the sum's order fixes its last bits). Every
module of this folder is imported here, so a new term is its file and the YAML that sets its coefficient
(docs/objectives.md, "Adding ... a loss term"); its knob joins :data:`lit_entropy.objectives.registry.KNOBS`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from torch import Tensor

from lit_entropy.objectives.kl import kl_estimate
from lit_entropy.objectives.policy_loss import aggregate
from lit_entropy.utils.registries import add_once, import_submodules


@dataclass
class TermInputs:
    """One micro-batch as a loss term sees it (rows already sliced)."""

    algo: Any
    """The ``algo`` config (:class:`~lit_entropy.objectives.registry.ObjectiveConfig`)."""
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


LOSS_TERMS: dict[str, LossTerm] = {}
"""Every loss term, by name, in the order they are added to the loss (filled by the files of this folder)."""


def register(term: LossTerm) -> None:
    """Register ``term`` (called once, by its own file)."""
    add_once(LOSS_TERMS, term.name, term, "loss term")


import_submodules(__name__, __path__)
