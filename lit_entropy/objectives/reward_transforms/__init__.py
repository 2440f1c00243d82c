"""Reward transforms (``algo.reward_transform``): the rewards reshaped before the advantage estimator, one file
each, registered here by its file with :func:`register` (docs/design.md §7.1).

A transform is ``fn(rewards [B], batch, **args) -> rewards [B]`` fp32, called in step 4 of the iteration after the
pre-update pass (so it may read the batch's old log-probs); its entry names the ``algo`` keys it takes and the
batch fields it reads (``module.pre_update_pass=skip`` refuses a transform that reads the pass). Every module of
this folder is imported here, so a new transform is its file and a preset YAML that names it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lit_entropy.utils.registries import add_once, import_submodules


@dataclass(frozen=True)
class RewardTransform:
    """A registered ``algo.reward_transform``."""

    name: str
    fn: Callable[..., Tensor]
    """``fn(rewards [B], batch, **args) -> rewards [B]``."""
    algo_keys: tuple[str, ...] = ()
    """The ``algo`` keys handed to ``fn`` as keyword arguments (e.g. ``beta_rank``)."""
    reads_pass: str | None = None
    """What it reads of the pre-update pass, in words (``module.pre_update_pass=skip`` refuses it), or None."""

    def apply(self, rewards: Tensor, batch: Any, algo: Any) -> Tensor:
        """The transformed rewards, with this transform's ``algo`` keys read off ``algo``."""
        return self.fn(rewards, batch, **{key: getattr(algo, key) for key in self.algo_keys})


REWARD_TRANSFORMS: dict[str, RewardTransform] = {}
"""Every ``algo.reward_transform``, by name (filled by the files of this folder)."""


def register(transform: RewardTransform) -> None:
    """Register ``transform`` (called once, by its own file)."""
    add_once(REWARD_TRANSFORMS, transform.name, transform, "reward transform")


import_submodules(__name__, __path__)
