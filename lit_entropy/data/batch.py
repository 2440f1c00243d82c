"""The ``batch`` group's config, and the rollout batch (:class:`~lit_entropy.rollout.batch.RolloutBatch`, defined
in ``lit_entropy.rollout.batch`` and re-exported here so ``from lit_entropy.data.batch import RolloutBatch`` keeps
working)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lit_entropy.rollout.batch import RolloutBatch
from lit_entropy.rollout.filters import GibberishFilter, RepetitionFilter, parse_filter

__all__ = ["BatchConfig", "RolloutBatch"]


@dataclass
class BatchConfig:
    """The ``batch`` group: how much one RL iteration samples and how it is cut into optimizer steps."""

    prompts_per_iter: int = 128
    """Prompts drawn per iteration (all ranks together)."""
    group_size: int = 8
    """G, completions sampled per prompt (the group of the group baselines)."""
    num_minibatches: int = 4
    """Optimizer steps per pass over the rollout batch."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per iteration."""
    micro_batch_size: int = 128
    """Sequences per forward/backward; gradients are accumulated over a minibatch's micro-batches."""
    micro_batch_tokens: int = 0
    """A token budget per forward/backward: > 0 fills each micro-batch (rows longest first) with as many rows as
    fit in this many tokens once padded to its longest row, at most ``micro_batch_size``; short rows then run
    in larger matmuls. Tokens are those the pass computes: whole rows, or responses on shared prompts. 0 = off."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards are all equal and draw more prompts to refill the batch."""
    max_sampling_rounds: int = 3
    """With dynamic sampling: extra generation rounds at most per iteration."""
    mask_truncated_completions: bool = False
    """Overlong filtering (DAPO): completions that hit ``rollout.max_new_tokens`` without a stop contribute no
    loss (they still count in their group's baseline); ``rollout/masked_truncated`` counts them."""
    filter_repetition: Any = None
    """Rollout filter (prime-rl): ``{ngram, max_frac}`` zero-weights completions whose repeated n-grams reach
    ``max_frac`` (:class:`~lit_entropy.rollout.filters.RepetitionFilter`); null = off. ``rollout/filtered_*``."""
    filter_gibberish: Any = None
    """Rollout filter (prime-rl): ``{logprob_offset, token_id_threshold, min_tokens}`` zero-weights completions
    with tokens sampled below ``−log V − logprob_offset`` (:class:`~lit_entropy.rollout.filters.GibberishFilter`)."""

    def __post_init__(self) -> None:
        for name in ("prompts_per_iter", "num_minibatches", "ppo_epochs", "micro_batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"batch.{name}={value!r} must be an integer >= 1")
        if isinstance(self.group_size, bool) or not isinstance(self.group_size, int) or self.group_size < 2:
            raise ValueError(f"batch.group_size={self.group_size!r}: group baselines need an integer G >= 2")
        self.filter_repetition = parse_filter(RepetitionFilter, self.filter_repetition, "batch.filter_repetition")
        self.filter_gibberish = parse_filter(GibberishFilter, self.filter_gibberish, "batch.filter_gibberish")
        if isinstance(self.micro_batch_tokens, bool) or not isinstance(self.micro_batch_tokens, int) \
                or self.micro_batch_tokens < 0:
            raise ValueError(f"batch.micro_batch_tokens={self.micro_batch_tokens!r} must be an integer >= 0 (0 = off)")
        if self.max_sampling_rounds < 0:
            raise ValueError(f"batch.max_sampling_rounds={self.max_sampling_rounds} must be >= 0")
