"""The rollout-engine interface: prompts in, sampled token ids and the sampler's log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class SamplingConfig:
    """How completions are sampled (the ``rollout`` group, less its ``engine``)."""

    temperature: float = 1.0
    """Rollout temperature; the trainer's log-probs and entropy use the same one."""
    top_p: float = 1.0
    """Nucleus sampling (1.0 = off). The trainer renormalises over the same kept set (:mod:`lit_entropy.policy.replay`)."""
    top_k: int | None = 0
    """Top-k sampling (0 or None = off), applied before top-p and replayed by the trainer likewise."""
    max_new_tokens: int = 16
    """Completion length cap; rows that hit it count in ``rollout/truncated_frac``."""
    stop: Sequence[str] = ()
    """Strings that end a completion (EOS always does); applied after sampling, for every engine
    (:func:`truncate_at_stop`)."""
    sync_every: int = 1
    """Mismatch testbed: the engine loads the trainer's weights every ``sync_every`` iterations only (1 = every
    iteration), so it samples from a policy up to ``sync_every - 1`` updates old."""
    temperature_error: float = 0.0
    """Mismatch testbed: the engine samples at ``temperature + temperature_error``; the trainer scores at
    ``temperature``."""
    max_staleness: int = 0
    """One-step-off overlap (:mod:`lit_entropy.rollout.overlap`): with k >= 1 the engine samples iteration
    i + k's batch while the trainer updates on iteration i's, so rows are up to k weight versions old; 0 = the
    synchronous iteration."""
    staleness_policy: str = "wait"
    """What a batch older than ``max_staleness`` versions meets: ``wait`` (sampled again from the current
    weights) or ``drop`` (its rows are dropped, no update that iteration)."""
    engine_cores: Sequence[int] | None = None
    """With ``max_staleness`` >= 1 on CPU: the cores the generating thread is pinned to (the trainer's
    thread gets the others); None = no pinning."""
    greedy: bool = False
    """Evaluation only: the most likely token at every step (temperature 0); ``temperature``, ``top_p`` and
    ``top_k`` are ignored and the reported log-probs are the model's at temperature 1. Training refuses it
    (every completion of a group would be the same)."""

    def __post_init__(self) -> None:
        self.stop = tuple(str(s) for s in (self.stop or ()))
        if not self.temperature > 0:
            raise ValueError(f"rollout.temperature={self.temperature} must be > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p={self.top_p} must be in (0, 1]")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)
                                       or self.top_k < 0):
            raise ValueError(f"rollout.top_k={self.top_k!r} must be an integer >= 0 (0 = off)")
        if isinstance(self.sync_every, bool) or not isinstance(self.sync_every, int) or self.sync_every < 1:
            raise ValueError(f"rollout.sync_every={self.sync_every!r} must be an integer >= 1")
        if not self.engine_temperature > 0:
            raise ValueError(f"rollout.temperature + rollout.temperature_error = {self.engine_temperature} "
                             "must be > 0")
        from lit_entropy.rollout.overlap import check

        check(self.max_staleness, self.staleness_policy, self.sync_every)
        if self.engine_cores is not None:
            self.engine_cores = [int(c) for c in self.engine_cores]
            if not self.engine_cores or any(c < 0 for c in self.engine_cores):
                raise ValueError(f"rollout.engine_cores={self.engine_cores!r} must be null or a list of core ids")
        if self.max_new_tokens < 1:
            raise ValueError(f"rollout.max_new_tokens={self.max_new_tokens} must be >= 1")
        if any(not s for s in self.stop):
            raise ValueError("rollout.stop: empty stop strings")
        if not isinstance(self.greedy, bool):
            raise ValueError(f"greedy={self.greedy!r} must be a bool")

    @property
    def engine_temperature(self) -> float:
        """The temperature the engine samples at (the trainer's, unless the testbed's error is set)."""
        return self.temperature + self.temperature_error if self.temperature_error else self.temperature


@dataclass
class Generation:
    """One sampled completion."""

    token_ids: list[int]
    """Completion tokens (EOS included when sampled)."""
    logprobs: list[float]
    """The sampler's log-prob of each completion token in the distribution it sampled: at the sampling
    temperature, renormalised over the kept set with top-p / top-k."""
    truncated: bool
    """True when the completion stopped at ``max_new_tokens`` instead of EOS."""
    kept: list[int] | None = None
    """With top-p / top-k: how many tokens the sampler's truncation kept at each step (engines that know it)."""
    entropy: list[float] | None = None
    """The entropy of the distribution the sampler drew each token from (engines that can compute it: HF),
    logged as ``rollout/sampler_entropy`` beside the trainer's ``rollout/entropy``."""


class RolloutEngine(ABC):
    """Samples ``n`` completions per prompt and follows the trainer's weights."""

    overlaps_update: bool = False
    """Whether ``generate`` may run in a background thread while the trainer updates (``rollout.max_staleness``):
    it must not touch the process-global RNGs. Engines that may not keep the schedule in the trainer's thread."""

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig, seed: int, first_index: int = 0
    ) -> list[list[Generation]]:
        """``n`` completions for each prompt, as a list per prompt, in prompt order.

        ``first_index`` is the global index of ``prompts[0]`` when a rank generates one block of the
        iteration's prompts; engines seed by global index so that W ranks reproduce one rank's samples.
        """

    @abstractmethod
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load the trainer's current weights into the engine."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Free the engine's resources."""


def truncate_at_stop(gen: Generation, decode: Callable[[list[int]], str], stops: Sequence[str]) -> Generation:
    """``gen`` cut after the first token at which the decoded text contains one of ``stops``.

    Engine-agnostic stop strings: cutting after sampling gives exactly the tokens a sampler that
    stopped there would have produced (its log-probs included); the cut completion counts as finished,
    not truncated. The cut point is found by bisection over prefixes (a prefix that contains a stop
    string stays containing it), so it costs O(log length) decodes.
    """
    if not stops or not any(s in decode(gen.token_ids) for s in stops):
        return gen
    lo, hi = 1, len(gen.token_ids)  # the shortest prefix whose text contains a stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in decode(gen.token_ids[:mid]) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    return Generation(token_ids=gen.token_ids[:lo], logprobs=gen.logprobs[:lo], truncated=False,
                      kept=gen.kept[:lo] if gen.kept is not None else None,
                      entropy=gen.entropy[:lo] if gen.entropy is not None else None)
