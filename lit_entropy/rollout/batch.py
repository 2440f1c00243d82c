"""The rollout batch: what one RL iteration generated, scored and measured.

Every per-token tensor is aligned with ``input_ids``: the value at ``[i, t]`` belongs to token
``input_ids[i, t]`` (predicted from position ``t - 1``). Position 0 is never a response token.
Rows are right-padded; a row is its prompt, then its response, then padding.

It sits in ``rollout`` because the overlap producer (:mod:`lit_entropy.rollout.overlap`) keeps batches too; the
data module builds it and ``lit_entropy.data.batch`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch


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
