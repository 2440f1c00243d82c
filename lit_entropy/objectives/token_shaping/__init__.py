"""Per-token advantage shaping from the pre-update entropy (``algo.token_shaping``; docs/design.md §7.9): one file per
rule, each registered by its file with :func:`register`.

Applied in step 4 of the iteration after the sequence advantages (:mod:`lit_entropy.objectives.advantages`), before
any controller sees the batch. Every rule is a pure function of ``[B]`` / ``[B, L]`` tensors laid out like a
:class:`~lit_entropy.rollout.batch.RolloutBatch`: rows right-padded, contiguous groups of ``G`` rows, a boolean
``response_mask``, ``entropy`` the full-vocabulary entropy of each position under the policy that sampled
the batch (the pre-update pass, detached). Results are fp32 ``[B, L]``, 0 outside the response. Pick one by name
with :func:`shape`; every module of this folder is imported here, so a new rule is its file and a preset YAML.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lit_entropy.utils.registries import add_once, import_submodules


@dataclass(frozen=True)
class TokenShaping:
    """A registered ``algo.token_shaping``."""

    name: str
    fn: Callable[..., tuple[Tensor, Tensor]]
    """``fn(advantages [B], rewards [B], entropy [B, L], mask [B, L] bool, group_size, **args) -> (advantages [B],
    token_advantages [B, L])``."""
    args: frozenset[str]
    """The ``algo.token_shaping_args`` keys it takes."""
    replaces_estimator: bool = False
    """It computes the advantages from rewards and entropy itself (``algo.advantage`` must stay ``grpo``)."""
    check: Callable[[dict[str, Any]], None] | None = None
    """``check(args)`` raises, naming the key, on values that cannot work."""


SHAPINGS: dict[str, TokenShaping] = {}
"""Every ``algo.token_shaping``, by name (filled by the files of this folder)."""


def register(name: str, fn: Callable[..., tuple[Tensor, Tensor]], args: Iterable[str] = (),
             replaces_estimator: bool = False, check: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Register the rule ``name`` (called once, by its own file)."""
    add_once(SHAPINGS, name, TokenShaping(name, fn, frozenset(args), replaces_estimator, check), "token shaping")


def check_coefficients(args: dict[str, Any], keys: Iterable[str]) -> None:
    """Raise naming ``algo.token_shaping_args.<key>`` for a coefficient among ``keys`` that is negative."""
    for key in keys:
        if key in args and not float(args[key]) >= 0:
            raise ValueError(f"algo.token_shaping_args.{key}={args[key]} must be >= 0")


def check_args(name: str | None, args: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the valid choices when ``name`` or a key of ``args`` is unknown, or a
    coefficient is out of range."""
    if name is None:
        if args:
            raise ValueError(f"algo.token_shaping_args={dict(args)} given but algo.token_shaping is null")
        return
    if name not in SHAPINGS:
        raise ValueError(f"algo.token_shaping={name!r}; choose one of {sorted(SHAPINGS)} or null")
    rule = SHAPINGS[name]
    unknown = sorted(set(args) - rule.args)
    if unknown:
        raise ValueError(f"algo.token_shaping_args {unknown} unknown for {name}; it takes {sorted(rule.args)}")
    if rule.check is not None:
        rule.check(args)


def replaces_estimator(name: str | None) -> bool:
    """The rule ``name`` computes the advantages itself (false for None)."""
    return name is not None and SHAPINGS[name].replaces_estimator


def check_shapes(entropy: Tensor, response_mask: Tensor, rows: int, group_size: int | None = None) -> Tensor:
    """``response_mask`` as bool after the shape checks shared by every rule."""
    if entropy.shape != response_mask.shape or entropy.dim() != 2 or entropy.shape[0] != rows:
        raise ValueError(f"entropy {tuple(entropy.shape)} and response_mask {tuple(response_mask.shape)} "
                         f"must both be [B, L] with B = {rows}")
    if group_size is not None and (group_size < 2 or rows % group_size != 0):
        raise ValueError(f"batch size {rows} is not a multiple of group_size {group_size} >= 2")
    return response_mask.bool()


def shape(name: str, advantages: Tensor, rewards: Tensor, entropy: Tensor, response_mask: Tensor,
          group_size: int, **args: Any) -> tuple[Tensor, Tensor]:
    """``(advantages [B], token_advantages [B, L])`` after the rule ``name`` (one of :data:`SHAPINGS`)."""
    check_args(name, args)
    return SHAPINGS[name].fn(advantages, rewards, entropy, response_mask.bool(), group_size, **args)


import_submodules(__name__, __path__)
