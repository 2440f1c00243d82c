"""The rollout batch: what one RL iteration generated, scored and measured.

Every per-token tensor is aligned with ``input_ids``: the value at ``[i, t]`` belongs to token
``input_ids[i, t]`` (predicted from position ``t - 1``). Position 0 is never a response token.
Rows are right-padded; a row is its prompt, then its response, then padding.

It sits in ``rollout`` because the overlap producer (:mod:`lit_entropy.rollout.overlap`) keeps batches too; the
data module builds it. :class:`BatchConfig`, the ``batch`` group, says how large it is and how it is cut into
optimizer steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from lit_entropy.rollout.filters import GibberishFilter, RepetitionFilter, parse_filter


@dataclass
class RolloutBatch:
    input_ids: torch.Tensor
    """[B, L] int64 prompt + response token ids, right-padded."""
    attention_mask: torch.Tensor
    """[B, L] bool, True on real (prompt or response) tokens."""
    response_mask: torch.Tensor
    """[B, L] bool, True on response tokens (the EOS token included when one was sampled)."""
    rewards: torch.Tensor
    """[B] fp32 reward of each completion."""
    group_index: torch.Tensor
    """[B] int64 prompt index; a group's G completions are contiguous rows."""
    group_size: int
    """G, completions per prompt."""
    sampler_logp: torch.Tensor
    """[B, L] fp32 log-probs the rollout engine reported for the sampled tokens (0 off-response)."""
    sampler_kept: torch.Tensor | None = None
    """[B, L] int64 size of the sampler's top-p / top-k kept set at each response token (0 elsewhere), from
    engines that report it; the trainer's passes renormalise over that many tokens (:mod:`lit_entropy.policy.replay`)."""
    advantages: torch.Tensor | None = None
    """[B] fp32 per-sequence advantage from the estimator."""
    token_advantages: torch.Tensor | None = None
    """[B, L] fp32 per-token advantage; defaults to ``advantages`` broadcast. Controllers may reshape it."""
    old_logp: torch.Tensor | None = None
    """[B, L] fp32 log-probs of the trainer's policy before the update (PPO denominators)."""
    entropy: torch.Tensor | None = None
    """[B, L] fp32 full-vocabulary entropy at the rollout temperature, before the update."""
    disc_s: torch.Tensor | None = None
    """[B, L] fp32 discriminator score S_t = p_t·(H_t + log p_t) (only when a rule needs it)."""
    disc_n: torch.Tensor | None = None
    """[B, L] fp32 its on-policy baseline N_t = Σ_v p_v²·(H_t + log p_v) (only when a rule needs it)."""
    ref_logp: torch.Tensor | None = None
    """[B, L] fp32 log-probs of the frozen reference policy (only when the KL term is on)."""
    row_weight: torch.Tensor | None = None
    """[B] fp32 per-row loss weight set by a rollout hook (Entrocraft's G/|S_x|); None = all 1."""
    keep: torch.Tensor | None = None
    """[B] bool; rows a rollout hook rejected are False and leave the loss."""
    truncated: torch.Tensor | None = None
    """[B] bool; True where the completion hit ``max_new_tokens`` without a stop (None: not known)."""
    version: torch.Tensor | None = None
    """[B] long; the weight version (RL iteration) whose policy sampled each row, with ``rollout.max_staleness``
    >= 1 (:mod:`lit_entropy.rollout.overlap`); None on the synchronous path (every row is current)."""
    loss_mask: torch.Tensor | None = None
    """[B, L] bool response tokens that may enter the loss (set by the mismatch correction and the overlong
    filter); None = every response token."""
    is_weight: torch.Tensor | None = None
    """[B, L] fp32 detached importance weight π_old/π_sampler (truncated or masked) the surrogate is multiplied
    by (:mod:`lit_entropy.objectives.correction`); None = 1."""
    prompts: list[str] = field(default_factory=list)
    """Prompt text per row (for logging)."""
    completions: list[str] = field(default_factory=list)
    """Decoded completion text per row (for logging)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Per-iteration scalars (``rollout/*``, ``time/*``, ``diag/*``, ``control/*``) logged by the module."""

    def __post_init__(self) -> None:
        if self.keep is None:
            self.keep = torch.ones(self.input_ids.shape[0], dtype=torch.bool)

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    def tensor_fields(self) -> dict[str, torch.Tensor]:
        out = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor):
                out[f.name] = v
        return out

    def select(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        """Rows ``index`` of every per-row tensor, as a plain dict (a minibatch for the update)."""
        return {k: v[index] for k, v in self.tensor_fields().items()}

    def take(self, index: torch.Tensor) -> RolloutBatch:
        """A batch of rows ``index`` (every tensor field, the texts; no metrics)."""
        idx = index.tolist()
        return replace(self, **self.select(index), metrics={},
                       prompts=[self.prompts[i] for i in idx] if len(self.prompts) == self.batch_size else [],
                       completions=[self.completions[i] for i in idx] if len(self.completions) == self.batch_size
                       else [])

    def replace_rows(self, rows: RolloutBatch, pad_id: int) -> None:
        """Put ``rows`` in place of this batch's first ``rows.batch_size`` rows, every tensor field and the texts
        (AEPO's regulariser rows). Both sides are right-padded to the wider one's length first (``input_ids`` with
        ``pad_id``, masks with False, the rest with 0). Every tensor field set here must be set on ``rows``."""
        k = rows.batch_size
        if k > self.batch_size:
            raise ValueError(f"{k} rows cannot replace rows of a batch of {self.batch_size}")
        width = max(self.input_ids.shape[1], rows.input_ids.shape[1])

        def padded(name: str, v: torch.Tensor) -> torch.Tensor:
            if v.dim() < 2 or v.shape[1] == width:
                return v
            fill = pad_id if name == "input_ids" else (False if v.dtype == torch.bool else 0)
            return torch.nn.functional.pad(v, (0, width - v.shape[1]), value=fill)

        for name, v in self.tensor_fields().items():
            new = getattr(rows, name)
            if not isinstance(new, torch.Tensor):
                raise ValueError(f"the replacing rows have no {name}, which the batch has")
            v, new = padded(name, v), padded(name, new)
            if new.shape[1:] != v.shape[1:]:
                raise ValueError(f"{name}: rows of shape {tuple(new.shape[1:])} cannot replace {tuple(v.shape[1:])}")
            v = v.clone()
            v[:k] = new.to(dtype=v.dtype, device=v.device)
            setattr(self, name, v)
        if len(self.prompts) == self.batch_size and len(rows.prompts) == k:
            self.prompts[:k] = rows.prompts
        if len(self.completions) == self.batch_size and len(rows.completions) == k:
            self.completions[:k] = rows.completions

    def minibatches(self, num_minibatches: int, generator: torch.Generator | None = None) -> list[dict]:
        """Kept rows shuffled and split into ``num_minibatches`` nearly equal minibatches.

        Rejected rows (``keep`` False) are dropped here, so the loss aggregation of each minibatch
        renormalises over kept tokens only.
        """
        rows = torch.nonzero(self.keep, as_tuple=False).flatten()
        if rows.numel() == 0:
            return []
        perm = rows[torch.randperm(rows.numel(), generator=generator)]
        n = max(1, min(num_minibatches, perm.numel()))
        return [self.select(chunk) for chunk in torch.tensor_split(perm, n)]


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
