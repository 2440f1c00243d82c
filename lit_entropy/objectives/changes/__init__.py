"""Per-token changes of the policy-gradient surrogate (Archer, SimKO, ERC, ...): one file each, registered here.

A change is switched on by its own key in the ``algo`` group (``algo.archer: {quantile: 0.8, ...}``; a change with
no field of :class:`~lit_entropy.algo.AlgoConfig` of its own goes under ``algo.surrogate_changes.<name>``). The
objective applies every active change at the points of the per-token loss it declares, in the order of
:data:`CHANGES`:

1. ``prepare``: once over the whole minibatch (token splits, counts), before the micro-batches;
2. ``inputs``: the (log-prob, advantage) pair the surrogate receives (SimKO);
3. ``surrogate``: the per-token surrogate itself, given a function that recomputes the loss's surrogate at
   other clip ranges (Archer);
4. ``gradient``: which tokens keep their gradient (ERC), with a count logged as ``train/<metric>``.

Every module of this folder is imported here, so a new change is its file and a preset YAML and nothing else
(docs/objectives.md, "Adding a method").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from torch import Tensor

from lit_entropy.utils.registries import add_once, import_submodules

Clipped = Callable[[Tensor, Tensor, float, float], tuple[Tensor, dict[str, Tensor]]]
"""``clipped(logp, advantages, eps_low, eps_high)``: the loss's per-token surrogate at another clip range."""


@dataclass(frozen=True)
class SurrogateChange:
    """A registered per-token change of the surrogate; every hook is optional and gets the change's settings
    (an instance of :attr:`args`) first."""

    name: str
    """Its key: ``algo.<name>`` (or ``algo.surrogate_changes.<name>``), the settings' mapping or null (off)."""
    args: type
    """A frozen dataclass of its settings, checked in its ``__post_init__``."""
    needs_ppo_clip: bool = True
    """Defined on PPO's per-token ratio clip: refused with the losses and rules that replace it."""
    prepare: Callable[[Any, Mapping[str, Tensor], Tensor, Tensor], dict[str, Tensor]] | None = None
    """``prepare(args, minibatch, kept, loss_mask)`` over the WHOLE minibatch (``kept``: the response tokens the
    correction kept, ``loss_mask``: after the selection rule): [B, L] tensors (sliced per micro-batch) and 0-dim
    totals (kept whole), which land in the selection's ``prepared`` under the names it chooses."""
    inputs: Callable[..., tuple[Tensor, Tensor]] | None = None
    """``inputs(args, logp, old_logp, advantages, topk, prepared) -> (logp, advantages)`` for the surrogate."""
    surrogate: Callable[..., tuple[Tensor, dict[str, Tensor]]] | None = None
    """``surrogate(args, loss_tok, info, clipped, logp, advantages, prepared) -> (loss_tok, info)``."""
    gradient: Callable[..., tuple[Tensor, Tensor]] | None = None
    """``gradient(args, loss_tok, entropy, minibatch) -> (loss_tok, acted)``: ``acted`` [B, L] bool, the tokens it
    changed, counted as :attr:`metric`."""
    metric: str | None = None
    """``train/<metric>``: the fraction of the loss tokens ``gradient`` acted on."""
    topk: Callable[[Any], int] | None = None
    """How many top-K log-probs (with gradient) the update's forward must return: ``topk(args)``."""
    check: Callable[[Any, Any], None] | None = None
    """``check(args, algo)``: refuse a combination with the rest of the ``algo`` group at start-up."""

    def parse(self, value: Any) -> Any:
        """``value`` (None, a mapping from the YAML, or already :attr:`args`) as :attr:`args`; an unknown key is
        named with ``algo.<name>``."""
        if value is None or isinstance(value, self.args):
            return value
        try:
            return self.args(**dict(value))
        except TypeError as err:
            names = [f.name for f in fields(self.args)]
            raise ValueError(f"algo.{self.name}={dict(value)}: {err}; it takes {names}") from None

    @property
    def stat(self) -> str:
        """The name of its token count among the step's sums."""
        return f"{self.name}_acted"


CHANGES: dict[str, SurrogateChange] = {}
"""Every registered change by name, in the order they apply."""


def register(change: SurrogateChange) -> SurrogateChange:
    add_once(CHANGES, change.name, change, "surrogate change")
    return change


def settings(algo: Any, name: str) -> Any:
    """The settings of change ``name`` in ``algo`` (its own key or ``surrogate_changes``), None when off."""
    own = getattr(algo, name, None)
    return own if own is not None else (getattr(algo, "surrogate_changes", None) or {}).get(name)


def active(algo: Any) -> list[tuple[SurrogateChange, Any]]:
    """The changes ``algo`` switches on, with their settings, in registry order."""
    found = ((change, settings(algo, name)) for name, change in CHANGES.items())
    return [(change, args) for change, args in found if args is not None]


def topk(algo: Any) -> int:
    """The number of top-K log-probs the update's forward must return for ``algo``'s changes (0: none)."""
    return max((change.topk(args) for change, args in active(algo) if change.topk is not None), default=0)


import_submodules(__name__, __path__)  # each file registers itself
