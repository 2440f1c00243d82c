"""Sampling replay: the trainer scores the truncated distribution the sampler actually drew from.

With ``top_p < 1`` or ``top_k > 0`` the engine samples from ``softmax(z)`` restricted to a kept set ``K``
and renormalised, ``q(v) = p(v) / p(K)`` for ``v ∈ K``, with ``z = logits / T``. Scoring the full softmax
instead gives ``log p(v) = log q(v) + log p(K)``: every sampled token's log-prob carries the log of the kept
mass (≤ 0), so a PPO or importance ratio against the sampler is biased by it, and the logged entropy is not
the entropy of what was sampled. The trainer replays the truncation on its own logits and renormalises over
the same set, in the pre-update pass and in the update (with gradient: logits outside ``K`` get none).

The kept set follows vLLM's ``apply_top_k_top_p`` and Hugging Face's ``TopKLogitsWarper`` /
``TopPLogitsWarper`` (the same rule): temperature first, then top-k (every token whose logit is below the
k-th largest is dropped, so ties at the k-th value stay), then top-p on the top-k survivors renormalised
(ascending sort, drop tokens whose cumulative probability is ``<= 1 - top_p``, the most likely token always
stays). The sampled token is always kept: a boundary token whose probability differs in the last bits
between sampler and trainer must not leave the set it was drawn from. Where the engine reports how many
tokens it kept (``kept_count``, the Hugging Face engine does), the trainer keeps that many of its own
top-ranked tokens instead of recomputing the cut, so a boundary flip cannot change the set's size.
"""

from __future__ import annotations

import torch
from torch import Tensor


def active(top_p: float = 1.0, top_k: int | None = 0) -> bool:
    """Whether sampling truncates at all (``top_p < 1`` or ``top_k > 0``)."""
    return top_p < 1.0 or bool(top_k and top_k > 0)


@torch.no_grad()
def kept_mask(z: Tensor, top_p: float = 1.0, top_k: int | None = 0, sampled: Tensor | None = None,
              kept_count: Tensor | None = None) -> Tensor:
    """[N, V] bool: the tokens a top-k / top-p sampler keeps from temperature-scaled logits ``z`` [N, V].

    ``sampled`` [N]: token ids forced into the set. ``kept_count`` [N]: where > 0, the set is that many of
    the top-ranked tokens (the sampler's own count) instead of the top-k / top-p rule.
    """
    z = z.float()
    vocab = z.shape[-1]
    ordered, index = z.sort(dim=-1, descending=False)  # ascending, as vLLM and transformers do
    drop = torch.zeros_like(ordered, dtype=torch.bool)
    if top_k and 0 < top_k < vocab:
        drop = ordered < ordered[:, vocab - top_k : vocab - top_k + 1]
        ordered = ordered.masked_fill(drop, float("-inf"))
    if top_p < 1.0:
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        outside = cumulative <= 1.0 - top_p
        outside[:, -1] = False  # at least one token
        drop = drop | outside
    if kept_count is not None:
        count = kept_count.to(z.device).long()[:, None]
        rank_from_top = vocab - 1 - torch.arange(vocab, device=z.device)[None]
        drop = torch.where(count > 0, rank_from_top >= count, drop)
    keep = torch.empty_like(drop).scatter_(-1, index, ~drop)
    if sampled is not None:
        keep.scatter_(-1, sampled.to(z.device).long()[:, None], True)
    return keep


def fill_value(dtype: torch.dtype) -> float:
    """A logit that a softmax turns into exactly 0 while ``p · log p`` stays 0 (no ``-inf``, no NaN), even
    after division by a temperature as small as 1e-6."""
    return max(torch.finfo(dtype).min, -1e30)


def truncate_logits(logits: Tensor, targets: Tensor, temperature: float = 1.0, top_p: float = 1.0,
                    top_k: int | None = 0, kept_count: Tensor | None = None, chunk_size: int = 2048) -> Tensor:
    """``logits`` [B, L, V] with every token outside the sampler's kept set at :func:`fill_value`.

    ``targets`` [B, L]: the sampled tokens (always kept). ``kept_count`` [B, L] or None: the sampler's kept-set
    size per token (0 where unknown). The set is computed without gradient on ``logits / temperature`` in
    fp32, ``chunk_size`` flattened rows at a time; the result is differentiable in ``logits`` (zero gradient
    outside the set). A softmax of the result at ``temperature`` is the sampler's renormalised distribution.
    """
    if not active(top_p, top_k):
        return logits
    batch, length, vocab = logits.shape
    flat = logits.detach().reshape(batch * length, vocab)
    flat_targets = targets.reshape(-1)
    flat_counts = kept_count.reshape(-1) if kept_count is not None else None
    masks = []
    for start in range(0, batch * length, chunk_size):
        end = min(start + chunk_size, batch * length)
        masks.append(kept_mask(flat[start:end].float() / temperature, top_p, top_k, flat_targets[start:end],
                               flat_counts[start:end] if flat_counts is not None else None))
    keep = torch.cat(masks).view(batch, length, vocab) if masks else flat.new_ones(logits.shape, dtype=torch.bool)
    return logits.masked_fill(~keep, fill_value(logits.dtype))


def truncated_log_softmax(logits: Tensor, top_p: float = 1.0, top_k: int | None = 0,
                          sampled: Tensor | None = None, temperature: float = 1.0) -> Tensor:
    """[N, V] log-probs of the renormalised truncated distribution of ``logits`` [N, V] (``-inf`` outside)."""
    z = logits.float() / temperature
    keep = kept_mask(z, top_p, top_k, sampled)
    return z.masked_fill(~keep, float("-inf")).log_softmax(dim=-1)
