"""Token-selection rules (``algo.selection``; docs/design.md §7.3): one file per rule, each registered by its file
with :func:`register`; what they share is :mod:`.tokens`.

Every rule takes per-token tensors [B, L] aligned with ``input_ids`` and a bool ``mask`` [B, L] of response
tokens, and is computed over the WHOLE minibatch it is given (statistics, counts and caps are minibatch
quantities: call it once on the whole minibatch, then slice the returned mask per micro-batch). Values at
padding positions may be garbage (even NaN/inf): they never enter a statistic (``torch.where``) and a
returned mask is never True there. Statistics are fp32 and use no gradient.

Each rule returns ``(bool mask [B, L], frac)`` with ``frac`` a 0-dim fp32 tensor: the fraction of the
minibatch's ``N`` response tokens the rule touched (0 when ``N = 0``). Its :class:`SelectionRule` entry says which
batch tensor each of its tensor parameters receives (:data:`RULE_INPUTS`) and what its returned mask does
(:data:`RULE_EFFECTS`); its other keyword arguments are the ``algo.selection_args`` it accepts. Every module of
this folder is imported here, so a new rule is its file and a preset YAML (docs/objectives.md, "Adding ...").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lit_entropy.utils.registries import add_once, import_submodules

RULE_INPUTS: dict[str, str] = {
    "mask": "[B, L] bool response tokens",
    "token_advantages": "[B, L] advantages",
    "old_logp": "[B, L] pre-update log-probs",
    "entropy": "[B, L] pre-update entropy",
    "disc_s": "[B, L] discriminator score S (the pre-update pass computes it only for rules that ask)",
    "disc_n": "[B, L] its on-policy baseline N (idem)",
    "current_logp": "[B, L] the current policy's log-probs over the whole minibatch (one extra no-grad forward)",
    "ppo_clipped": "[B, L] bool response tokens where the PPO clip is active at the current ratio "
                   "(reads the knobs eps_low and eps_high; needs current_logp)",
    "generator": "the module's seeded torch.Generator (checkpointed), for random picks",
}
"""What a rule's tensor parameters can receive: batch fields, or quantities the objective derives."""

RULE_EFFECTS: dict[str, str] = {
    "loss_mask": "the tokens kept in the loss (the others leave it and its counts)",
    "detach": "tokens whose loss is zeroed: no value, no gradient (they still count)",
    "kl_selected": "tokens that get KL-Cov's penalty; the PPO surrogate becomes KL-Cov's loss",
}
"""What a rule's returned mask does in the loss (the :class:`~lit_entropy.objectives.objective.TokenSelection` field it fills)."""


@dataclass(frozen=True)
class SelectionRule:
    """A registered rule: ``fn(**inputs, **selection_args) -> (mask [B, L] bool, frac)``, over the whole minibatch."""

    name: str
    fn: Callable[..., tuple[Tensor, Tensor]]
    inputs: dict[str, str]
    """Parameter of ``fn`` -> the :data:`RULE_INPUTS` entry it receives. Its other parameters are ``args``."""
    effect: str = "loss_mask"
    """What the returned mask does (:data:`RULE_EFFECTS`)."""
    extra_args: tuple[str, ...] = ()
    """``selection_args`` the rule accepts but ``fn`` does not take (read by its effect, e.g. KL-Cov's ``beta``)."""
    reports_kept: bool = False
    """``fn``'s ``frac`` is the fraction kept; ``train/masked_frac_<rule>`` reports 1 − frac (the fraction removed)."""
    per_token_ratios: bool = False
    """Acts on per-token ratios or covariances, so it cannot pair with ``loss=gspo`` (one ratio per sequence)."""
    check: Callable[..., None] | None = None
    """``check(**selection_args)`` raises, naming the key, on values that cannot work (their names are checked
    against :attr:`args` first)."""

    def __post_init__(self) -> None:
        params = inspect.signature(self.fn).parameters
        bad = {p: s for p, s in self.inputs.items() if p not in params or s not in RULE_INPUTS}
        if bad or self.effect not in RULE_EFFECTS:
            raise ValueError(f"selection rule {self.name}: inputs {bad} / effect {self.effect!r} are not "
                             f"parameters of {self.fn.__name__} and entries of RULE_INPUTS / RULE_EFFECTS")

    @property
    def args(self) -> tuple[str, ...]:
        """The ``algo.selection_args`` keys this rule accepts."""
        params = inspect.signature(self.fn).parameters
        return tuple(p for p in params if p not in self.inputs) + self.extra_args

    @property
    def needs_current_logp(self) -> bool:
        return bool({"current_logp", "ppo_clipped"} & set(self.inputs.values()))

    @property
    def needs_scores(self) -> bool:
        return bool({"disc_s", "disc_n"} & set(self.inputs.values()))


SELECTION_RULES: dict[str, SelectionRule] = {}
"""Every ``algo.selection``, by name (filled by the files of this folder)."""


def register(rule: SelectionRule) -> None:
    """Register ``rule`` (called once, by its own file)."""
    add_once(SELECTION_RULES, rule.name, rule, "selection rule")


def check_args(name: str | None, args: Mapping[str, Any]) -> None:
    """Raise naming ``algo.selection_args`` when ``args`` are not arguments of the rule ``name`` or their values
    cannot work (the rule's own ``check``)."""
    if name is None:
        if args:
            raise ValueError("algo.selection_args given but algo.selection is null")
        return
    rule = SELECTION_RULES[name]
    unknown = set(args) - set(rule.args)
    if unknown:
        raise ValueError(f"algo.selection_args {sorted(unknown)} are not arguments of {name}; it takes {sorted(rule.args)}")
    if rule.check is not None:
        rule.check(**args)


import_submodules(__name__, __path__)
