"""Group-relative advantage estimators (``algo.advantage``; docs/design.md §7.1): one file per estimator, each
registered here by its file with :func:`register`.

Rows of a rollout batch come in contiguous groups of ``group_size`` completions of one prompt, so
``rewards.view(-1, group_size)`` puts each group on one row (:mod:`.groups`). Every estimator is ``[B] -> [B]``
fp32, called as ``fn(rewards, group_size=G, **options)``; pick one by name with :func:`compute_advantages`.
Every module of this folder is imported here, so a new estimator is its file (with its ``register`` call) and a
preset YAML that names it (docs/objectives.md, "Adding an advantage estimator").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lit_entropy.utils.registries import add_once, import_submodules


@dataclass(frozen=True)
class Estimator:
    """A registered ``algo.advantage``."""

    name: str
    fn: Callable[..., Tensor]
    """``fn(rewards [B], group_size=G, **options) -> advantages [B]`` fp32."""
    options: frozenset[str]
    """The ``algo.advantage_args`` it takes; the others (meant for other estimators) are dropped for it."""
    baseline: bool = True
    """False: no baseline, so all-equal groups still carry a signal (what DAPO's dynamic sampling would drop)."""


ESTIMATORS: dict[str, Estimator] = {}
"""Every ``algo.advantage``, by name (filled by the files of this folder)."""


def register(name: str, fn: Callable[..., Tensor], options: Iterable[str] = (), baseline: bool = True) -> None:
    """Register the estimator ``name`` (called once, by its own file)."""
    add_once(ESTIMATORS, name, Estimator(name, fn, frozenset(options), baseline), "advantage estimator")


def known_options() -> frozenset[str]:
    """The union of every estimator's options: what ``algo.advantage_args`` may hold."""
    return frozenset().union(*(e.options for e in ESTIMATORS.values()))


def compute_advantages(name: str, rewards: Tensor, group_size: int, **kwargs: Any) -> Tensor:
    """Per-sequence advantages [B] fp32 from the estimator called ``name`` (one of :data:`ESTIMATORS`).

    ``kwargs`` may hold the union of the estimators' options (``eps``, ``scale_std``, ``lam``,
    ``correct_threshold``, ``quantile_k``, ``k``), e.g. straight from a config; each is forwarded only to the
    estimators it means something to and dropped for the others. A name outside that set raises ``TypeError``;
    an unknown ``name`` raises ``ValueError`` listing the valid ones.
    """
    estimator = ESTIMATORS.get(name)
    if estimator is None:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    known = known_options()
    unknown = set(kwargs) - known
    if unknown:
        raise TypeError(f"unexpected keyword argument(s) {sorted(unknown)} for compute_advantages; "
                        f"known: {sorted(known)}")
    return estimator.fn(rewards, group_size=group_size, **{k: v for k, v in kwargs.items() if k in estimator.options})


import_submodules(__name__, __path__)

NO_BASELINE: tuple[str, ...] = tuple(name for name, e in ESTIMATORS.items() if not e.baseline)
"""Estimators with no baseline: all-equal groups still carry a signal (what DAPO's dynamic sampling would drop)."""
