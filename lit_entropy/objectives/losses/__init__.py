"""The policy losses (``algo.loss``): one file per family, registered here, each a per-token surrogate.

A loss is a function ``fn(logp, old_logp, advantages, mask, eps_low, eps_high, knobs, dual_clip, **args) ->
(loss [B, L], info)`` with the info of :func:`~lit_entropy.objectives.policy_loss.clipped_surrogate`
(``clipped_low``, ``clipped_high``, ...), and its entry says how it relates to PPO's per-token ratio clip, which
decides what it composes with (``dual_clip``, the clip rules, Archer and SimKO, the controllers of ``eps_high``).
Every module of this folder is imported here, so a new loss is its file and a preset YAML
(docs/objectives.md, "Adding ...").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from lit_entropy.dose import Dose
from lit_entropy.utils.registries import add_once, import_submodules


@dataclass(frozen=True)
class PolicyLoss:
    """A registered ``algo.loss``."""

    name: str
    fn: Callable[..., tuple[Tensor, dict[str, Tensor]]]
    args: dict[str, float] = field(default_factory=dict)
    """The ``algo.loss_args`` it takes, with their defaults (numbers > 0)."""
    ppo_clip: bool = False
    """Built on PPO's per-token ratio clip: ``dual_clip``, the clip rules and the clip changes apply to it."""
    per_sequence: bool = False
    """One ratio per sequence (GSPO): the rules on per-token ratios are refused, and the surrogate changes see
    the plain log-probs."""
    sequence_ratio: bool = False
    """Weighs each row by the ratio of its whole sampled sequence (TOPR's trajectory ratio), summed over the loss
    mask: the token-level masks (a selection rule that takes tokens out of the loss, ``correction.level=token`` with
    ``mode=mask``) are refused with it, since they would make the weight the ratio of the tokens left. Row-level
    masks (sequence-level corrections, rejection, filters, truncated completions) leave a kept row whole."""
    clip_knobs: tuple[str, ...] = ("eps_low", "eps_high")
    """The clip knobs (``algo.eps_low``, ``algo.eps_high``) it reads; one it does not, set away from its default, is
    named at start-up (:func:`lit_entropy.algo.unread_clip_advice`)."""
    dose: Dose | None = None
    """How much the loss acted in a run (what the studies' *not tested at this dose* rule reads); None: the loss is
    judged as it is (CISPO, SAPO, DPPO: no lever to measure)."""

    def surrogate(self, logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, eps_low: float,
                  eps_high: float, knobs: Mapping[str, Any] | None = None, dual_clip: float | None = None,
                  args: Mapping[str, float] | None = None) -> tuple[Tensor, dict[str, Tensor]]:
        """The per-token loss with the clip knobs and ``algo.loss_args`` (defaults for the ones left out)."""
        return self.fn(logp, old_logp, advantages, mask, eps_low, eps_high, knobs or {}, dual_clip,
                       **{**self.args, **(args or {})})

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Raise naming ``algo.loss_args`` when ``args`` are not this loss's or out of range."""
        unknown = sorted(set(args) - set(self.args))
        if unknown:
            takes = f"it takes {sorted(self.args)}" if self.args else "it takes none"
            raise ValueError(f"algo.loss_args {unknown} are not arguments of algo.loss={self.name}; {takes}")
        for key, value in args.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(f"algo.loss_args.{key}={value!r} must be a number > 0")


LOSSES: dict[str, PolicyLoss] = {}
"""Every registered loss by name (``algo.loss``)."""


def register(loss: PolicyLoss) -> PolicyLoss:
    add_once(LOSSES, loss.name, loss, "policy loss")
    return loss


import_submodules(__name__, __path__)  # each file registers itself
