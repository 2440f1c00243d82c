"""The policy's top-K candidates per token: their log-probs (differentiable) and whether the target is the top-1.

SimKO lifts the top-K candidates of high-entropy tokens and the dashboard's ``diag/top1_mass`` /
``diag/topk_mass`` are built on the same numbers. Computed over row chunks in fp32 like
:func:`lit_entropy.diagnostics.entropy.token_logprobs_and_entropy`; the backward pass recomputes each
chunk's softmax, using ``∂ log p_k / ∂z_v = 1[v = k] − p_v``, so only the logits and the [N, K] indices
are kept.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from lit_entropy.diagnostics.entropy import _check, _row_chunks


class _ChunkedTopK(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, k: int, temperature: float, chunk_size: int):
        batch, length, _ = logits.shape
        total = batch * length
        values = torch.empty(total, k, dtype=torch.float32, device=logits.device)
        index = torch.empty(total, k, dtype=torch.long, device=logits.device)
        for start, end, rows in _row_chunks(logits, chunk_size):
            values[start:end], index[start:end] = torch.log_softmax(rows.float() / temperature, dim=-1).topk(k, dim=-1)
        ctx.save_for_backward(logits, index)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        is_top1 = (index[:, 0] == targets.reshape(-1)).view(batch, length)
        ctx.mark_non_differentiable(is_top1)
        return values.view(batch, length, k), is_top1

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_values: Tensor, _grad_top1: Tensor | None):
        logits, index = ctx.saved_tensors
        batch, length, vocab = logits.shape
        g = grad_values.reshape(batch * length, -1).float()
        grad = torch.empty((batch * length, vocab), dtype=logits.dtype, device=logits.device)
        for start, end, rows in _row_chunks(logits, ctx.chunk_size):
            probs = torch.softmax(rows.float() / ctx.temperature, dim=-1)
            gz = -g[start:end].sum(-1, keepdim=True) * probs
            gz.scatter_add_(-1, index[start:end], g[start:end])
            grad[start:end] = (gz / ctx.temperature).to(logits.dtype)
        return grad.view(batch, length, vocab), None, None, None, None


def topk_logprobs(logits: Tensor, targets: Tensor, k: int, temperature: float = 1.0,
                  chunk_size: int = 1024) -> tuple[Tensor, Tensor]:
    """``(top-K log-probs [B, L, K] fp32, descending, differentiable w.r.t. logits; target is top-1 [B, L] bool)``
    of ``softmax(logits / T)``. ``logits[:, t]`` predicts ``targets[:, t]`` (shift first); ``k`` is capped at V."""
    _check(logits, targets, temperature, chunk_size)
    return _ChunkedTopK.apply(logits, targets.long(), min(int(k), logits.shape[-1]), float(temperature), chunk_size)


def topk_mass(topk_logp: Tensor, mask: Tensor) -> tuple[float, float]:
    """Mean top-1 probability and mean top-K probability mass over the ``mask`` tokens (0 when empty)."""
    mask = mask.bool()
    n = int(mask.sum())
    if n == 0:
        return 0.0, 0.0
    probs = topk_logp.detach().float().exp()[mask]
    return float(probs[:, 0].sum() / n), float(probs.sum() / n)
