"""The sampler: prompts in, scored completions out.

One object holds what turns token ids into scored completions — the rollout engine, the sampling settings
(stop strings included) and the reward runner — so training rollouts, the periodic evaluation and
``scripts/evaluate.py`` sample and score the same way. It knows nothing of batches, ranks or advantages.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from lit_entropy.policy.precision import engine_dtype_for
from lit_entropy.rewards.config import RewardConfig
from lit_entropy.rewards.runner import RewardRunner
from lit_entropy.rewards.shaping import soft_overlong_penalty
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig, truncate_at_stop
from lit_entropy.rollout.overlap import Producer

log = logging.getLogger(__name__)


class Prompt(Protocol):
    """A problem as the reward sees it (:class:`lit_entropy.tasks.prompts.Prompt`)."""

    text: str
    reference: Any


@dataclass
class ScoredSamples:
    """``n`` scored completions for each of a list of prompts (prompt-major)."""

    generations: list[list[Generation]]
    """Per prompt, its ``n`` completions, cut at the first stop string."""
    texts: list[str]
    """Decoded completion of every sample (EOS removed), prompt-major."""
    rewards: list[float]
    """Reward of every sample (with the overlong shaping when it is on and ``shaped``)."""
    errors: int
    """Reward calls that raised, timed out or returned a non-finite value (each scored 0)."""
    time_generate: float = 0.0
    """Seconds in the engine."""
    time_score: float = 0.0
    """Seconds cutting, decoding and scoring."""


class Sampler:
    """A rollout engine with its sampling settings and a reward runner."""

    def __init__(
        self,
        engine: RolloutEngine | Callable[..., RolloutEngine] | None,
        sampling: SamplingConfig | None = None,
        reward: RewardConfig | None = None,
    ) -> None:
        """``engine``: a started :class:`RolloutEngine`, or a factory (the ``rollout.engine`` node, partial)
        called by :meth:`start` with the policy's path and token ids."""
        self.sampling = sampling or SamplingConfig()
        self.reward = reward or RewardConfig()
        if self.reward.overlong_buffer > self.sampling.max_new_tokens:
            raise ValueError(f"reward.overlong_buffer={self.reward.overlong_buffer} must be in "
                             f"[0, rollout.max_new_tokens={self.sampling.max_new_tokens}]")
        self.engine_factory = None if isinstance(engine, RolloutEngine) else engine
        self.engine: RolloutEngine | None = engine if isinstance(engine, RolloutEngine) else None
        self.runner: RewardRunner | None = None
        self.tokenizer: Any = None
        self.synced = False
        s = self.sampling
        self.producer = (Producer(s.max_staleness, s.staleness_policy, engine_cores=s.engine_cores)
                         if s.max_staleness > 0 else None)
        """The overlap's :class:`~lit_entropy.rollout.overlap.Producer`, which samples batches ahead on its own
        thread (``rollout.max_staleness`` >= 1), or None: the sampler owns it, as the engine it drives is its own."""

    # ---- lifecycle -------------------------------------------------------------------------------
    def start(
        self, policy: Any, reward_fn: Callable[..., float], reward_kwargs: dict | None = None, *,
        world_size: int = 1, generation_batch: int | None = None, precision: str | None = None,
    ) -> None:
        """Start the reward workers, then the engine (they start side by side). ``policy``: anything with
        ``model``, ``tokenizer`` and ``path`` (a :class:`~lit_entropy.policy.models.PolicyBundle`, the module)."""
        self.tokenizer = policy.tokenizer
        if self.runner is None:
            r = self.reward
            self.runner = RewardRunner(reward_fn, timeout_s=r.timeout_s, mode=r.mode, num_workers=r.workers,
                                       fn_kwargs=reward_kwargs or {})
            self.runner.start()
        if self.engine is None:
            if self.engine_factory is None:
                raise ValueError("the sampler needs a rollout engine (the `rollout.engine` config node)")
            tok = policy.tokenizer
            max_len = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
            kwargs: dict[str, Any] = dict(model_path=policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id,
                                          max_model_len=max_len, world_size=world_size)
            if generation_batch is not None and accepts(self.engine_factory, "generation_batch"):
                kwargs["generation_batch"] = generation_batch
            stale = self.sampling.sync_every > 1 or self.sampling.max_staleness > 0
            if stale and accepts(self.engine_factory, "copy_weights"):
                kwargs["copy_weights"] = True  # an engine sampling from the live module could not lag
            self.engine = self.engine_factory(**kwargs)
            self.check_dtype(precision)
        if self.producer is not None:  # engines that cannot run beside the update keep the schedule, not the overlap
            self.producer.background = bool(getattr(self.engine, "overlaps_update", False))

    def check_dtype(self, precision: str | None) -> None:
        """Warn when the engine samples in another dtype than the trainer computes in."""
        want, have = engine_dtype_for(precision), getattr(self.engine, "dtype", None)
        if want and have and want != have:
            log.warning("the rollout engine samples in %s but the trainer computes in %s (precision=%s): "
                        "sampler and trainer log-probs will disagree; set rollout.engine.dtype=%s or use the "
                        "precision/ group, which sets both", have, want, precision, want)

    def sync(self, model: torch.nn.Module, iteration: int | None = None) -> None:
        """Load the trainer's current weights into the engine; with ``rollout.sync_every = k > 1`` (the mismatch
        testbed) only at iterations that are multiples of k, and at the first sync."""
        k = self.sampling.sync_every
        if k > 1 and iteration is not None and self.synced and iteration % k:
            return
        if self.producer is not None:  # never change the weights under a generation in flight
            self.producer.wait_idle()
        self.engine.sync_weights(model)
        self.synced = True

    def close_rewards(self) -> None:
        if self.runner is not None:
            self.runner.close()
            self.runner = None

    def close(self) -> None:
        """Stop the reward workers and, when this sampler built it, the engine."""
        self.close_rewards()
        if self.engine is not None and self.engine_factory is not None:
            self.engine.close()
            self.engine = None

    @property
    def reward_failures(self) -> int:
        """Reward calls that failed since the runner started."""
        return self.runner.total.failures if self.runner is not None else 0

    def with_sampling(self, **changes: Any) -> Sampler:
        """The same engine and reward runner with other sampling settings (e.g. an evaluation's)."""
        view = Sampler(self.engine, dataclasses.replace(self.sampling, **changes), self.reward)
        view.engine_factory, view.runner, view.tokenizer = None, self.runner, self.tokenizer
        view.producer = self.producer
        return view

    # ---- sampling --------------------------------------------------------------------------------
    def sample(
        self, prompts: Sequence[Prompt], prompt_ids: list[list[int]], n: int, seed: int, first_index: int = 0,
        shaped: bool = True,
    ) -> ScoredSamples:
        """``n`` completions for each prompt, cut at the stop strings, decoded and scored.

        ``first_index``: the global index of ``prompts[0]`` (engines seed by it, so W ranks sampling one
        block each reproduce one rank's samples). ``shaped=False`` leaves out the overlong shaping (an
        evaluation scores correctness only).
        """
        if not prompts:
            return ScoredSamples([], [], [], 0)
        tok, stop = self.tokenizer, self.sampling.stop
        if self.producer is not None:  # another caller (the periodic evaluation) waits for the engine
            self.producer.wait_idle()
        t0 = time.perf_counter()
        gens = self.engine.generate(prompt_ids, n, self.sampling, seed=seed, first_index=first_index)
        t1 = time.perf_counter()
        if len(gens) != len(prompts) or any(len(g) != n for g in gens):
            raise RuntimeError(f"engine returned {[len(g) for g in gens]} completions for {len(prompts)} prompts, "
                               f"expected {n} each")
        if stop:
            gens = [[truncate_at_stop(g, tok.decode, stop) for g in per_prompt] for per_prompt in gens]
        flat = [g for per_prompt in gens for g in per_prompt]
        texts = [tok.decode([t for t in g.token_ids if t != tok.eos_id]) for g in flat]
        rewards, stats = self.runner.score([p.text for p in prompts for _ in range(n)], texts,
                                           [p.reference for p in prompts for _ in range(n)])
        r = self.reward
        if shaped and r.overlong_buffer > 0:
            L = self.sampling.max_new_tokens
            rewards = [x + soft_overlong_penalty(len(g.token_ids), L, r.overlong_buffer, r.overlong_penalty)
                       for x, g in zip(rewards, flat, strict=True)]
        errors = stats.errors + stats.timeouts + stats.non_finite
        return ScoredSamples(gens, texts, list(rewards), errors, t1 - t0, time.perf_counter() - t1)


def accepts(factory: Callable, name: str) -> bool:
    """Whether ``factory`` (a class, function or ``functools.partial``) takes keyword ``name``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
