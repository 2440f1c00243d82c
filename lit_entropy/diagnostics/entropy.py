"""Token log-probs and full-vocabulary entropy, computed in fp32 over row chunks (docs/design.md §8).

With ``z = logits / T`` and ``log p = z − logsumexp(z)``:

* ``logp_t = log p(target_t)``
* ``H_t = −Σ_v p_v log p_v``

:func:`token_logprobs_and_entropy` flattens the ``B·L`` rows and handles ``chunk_size`` of them at a
time, casting each chunk to fp32 there, so the fp32 temporaries are O(chunk_size·V) rather than
O(B·L·V). It is differentiable through a custom autograd function that saves only the (input) logits, the
targets and the fp32 entropy, and recomputes the softmax chunk by chunk in the backward pass:

* ``∂logp_t/∂z_v = 1[v = target_t] − p_v``
* ``∂H_t/∂z_v = −p_v (log p_v + H_t)``

and ``∂/∂logits = ∂/∂z / T``.

With ``kernels="compiled"`` (or ``"auto"`` on a wide vocabulary, the default) each chunk's statistics and its
gradient come from the fused kernels of :mod:`lit_entropy.diagnostics.vocab_kernels` instead (the same
formulas; the forward keeps each row's ``logsumexp`` for the backward instead of recomputing the softmax).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from lit_entropy.diagnostics import vocab_kernels


def _check(logits: Tensor, targets: Tensor, temperature: float, chunk_size: int) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if tuple(targets.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"targets {tuple(targets.shape)} do not match logits {tuple(logits.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")


def _row_chunks(logits: Tensor, chunk_size: int):
    """Yield ``(start, end, rows)`` with ``rows`` the flat rows ``[start, end)`` of ``logits`` as [n, V].

    Uses a view when the flat layout allows it (no copy); otherwise (e.g. a shifted slice
    ``logits[:, :-1]``) gathers only the rows of the chunk.
    """
    batch, length, vocab = logits.shape
    total = batch * length
    try:
        flat = logits.view(total, vocab)
    except RuntimeError:
        flat = None
    if flat is None and length > 0:
        # Whole sequences per chunk: a slice of the batch dimension copies into a flat [n, V] block
        # in one go (element-wise index gathering costs more than the softmax at small vocabularies).
        per = max(1, chunk_size // length)
        for b in range(0, batch, per):
            e = min(b + per, batch)
            yield b * length, e * length, logits[b:e].reshape((e - b) * length, vocab)
        return
    for start in range(0, total, chunk_size):
        end = min(start + chunk_size, total)
        yield start, end, (flat if flat is not None else logits.reshape(total, vocab))[start:end]


class _ChunkedLogpEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_size: int, with_entropy: bool):
        batch, length, _ = logits.shape
        flat_targets = targets.reshape(-1)
        total = batch * length
        logp = torch.empty(total, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(total, dtype=torch.float32, device=logits.device) if with_entropy else None
        for start, end, rows in _row_chunks(logits, chunk_size):
            log_probs = torch.log_softmax(rows.float() / temperature, dim=-1)
            logp[start:end] = log_probs.gather(-1, flat_targets[start:end, None]).squeeze(-1)
            if entropy is not None:
                entropy[start:end] = -(log_probs.exp() * log_probs).sum(-1)
            del log_probs
        # Only the input logits, the targets and the [N] entropy are kept for backward.
        ctx.save_for_backward(logits, flat_targets, entropy if entropy is not None else logp)
        ctx.temperature = temperature
        ctx.chunk_size = chunk_size
        ctx.with_entropy = with_entropy
        logp = logp.view(batch, length)
        if entropy is None:
            return logp, None
        return logp, entropy.view(batch, length)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        logits, flat_targets, entropy = ctx.saved_tensors
        if not ctx.with_entropy:
            grad_entropy = None
        batch, length, vocab = logits.shape
        grad = torch.empty((batch * length, vocab), dtype=logits.dtype, device=logits.device)
        g_logp = grad_logp.reshape(-1).float() if grad_logp is not None else None
        g_ent = grad_entropy.reshape(-1).float() if grad_entropy is not None else None
        for start, end, rows in _row_chunks(logits, ctx.chunk_size):
            # Recompute the chunk's softmax: the same ops as the forward pass, so the same values.
            log_probs = torch.log_softmax(rows.float() / ctx.temperature, dim=-1)
            probs = log_probs.exp()
            g = torch.zeros_like(probs)
            if g_logp is not None:
                gl = g_logp[start:end, None]
                g -= gl * probs
                g.scatter_add_(-1, flat_targets[start:end, None], gl)
            if g_ent is not None:
                g -= g_ent[start:end, None] * probs * (log_probs + entropy[start:end, None])
            grad[start:end] = (g / ctx.temperature).to(logits.dtype)
            del log_probs, probs, g
        return grad.view(batch, length, vocab), None, None, None, None


class _FusedLogpEntropy(torch.autograd.Function):
    """:class:`_ChunkedLogpEntropy` on the compiled kernels: the same values, but the forward keeps each row's
    ``logsumexp`` and entropy (fp32 [N]), so the backward needs one fused loop per chunk."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_size: int, with_entropy: bool):
        batch, length, _ = logits.shape
        flat_targets = targets.reshape(-1)
        total = batch * length
        logp = torch.empty(total, dtype=torch.float32, device=logits.device)
        entropy = torch.empty(total, dtype=torch.float32, device=logits.device)
        lse = torch.empty(total, dtype=torch.float32, device=logits.device)
        for start, end, rows in _row_chunks(logits, chunk_size):
            t = flat_targets[start:end]
            lse[start:end], entropy[start:end] = vocab_kernels.call(vocab_kernels.lse_entropy, True, rows, temperature)
            logp[start:end] = vocab_kernels.target_logprobs(rows, t, lse[start:end], temperature)
        ctx.save_for_backward(logits, flat_targets, entropy, lse)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return logp.view(batch, length), entropy.view(batch, length) if with_entropy else None

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None):
        logits, flat_targets, entropy, lse = ctx.saved_tensors
        batch, length, vocab = logits.shape
        zeros = torch.zeros(batch * length, dtype=torch.float32, device=logits.device)
        g_logp = grad_logp.reshape(-1).float() if grad_logp is not None else zeros
        g_ent = grad_entropy.reshape(-1).float() if grad_entropy is not None and ctx.with_entropy else zeros
        grad = torch.empty((batch * length, vocab), dtype=logits.dtype, device=logits.device)
        for start, end, rows in _row_chunks(logits, ctx.chunk_size):
            s = slice(start, end)
            grad[s] = vocab_kernels.call(vocab_kernels.logits_grad, True, rows, flat_targets[s], lse[s], entropy[s],
                                         g_logp[s], g_ent[s], ctx.temperature)
        return grad.view(batch, length, vocab), None, None, None, None


def token_logprobs_and_entropy(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
    kernels: str = "auto",
) -> tuple[Tensor, Tensor | None]:
    """``log p(target)`` [B, L] and entropy ``H = −Σ_v p_v log p_v`` [B, L] of ``softmax(logits / T)``.

    Both fp32, computed over chunks of ``chunk_size`` flattened rows (peak extra memory
    O(chunk_size·V)). ``logits[:, t]`` is the prediction for ``targets[:, t]``: shift first with
    :func:`shift_for_causal_lm`. Differentiable w.r.t. ``logits`` through both outputs; the gradient
    has the dtype of ``logits``. The entropy is ``None`` when ``with_entropy`` is False. ``kernels``:
    ``eager``, ``compiled`` or ``auto`` (:mod:`lit_entropy.diagnostics.vocab_kernels`).
    """
    _check(logits, targets, temperature, chunk_size)
    function = _FusedLogpEntropy if vocab_kernels.compiles(kernels, logits) else _ChunkedLogpEntropy
    return function.apply(logits, targets.long(), float(temperature), chunk_size, with_entropy)


def naive_logprobs_and_entropy(
    logits: Tensor,
    targets: Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Reference implementation: one full fp32 ``log_softmax`` over [B, L, V] (``chunk_size`` ignored)."""
    _check(logits, targets, temperature, chunk_size)
    log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)
    logp = log_probs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1) if with_entropy else None
    return logp, entropy


def shift_for_causal_lm(logits: Tensor, input_ids: Tensor) -> tuple[Tensor, Tensor]:
    """``(logits[:, :-1], input_ids[:, 1:])``: position t's logits predict token t + 1.

    The logits come back as a view (no copy); :func:`token_logprobs_and_entropy` handles it.
    """
    if logits.shape[:2] != input_ids.shape:
        raise ValueError(f"logits {tuple(logits.shape)} do not match input_ids {tuple(input_ids.shape)}")
    return logits[:, :-1], input_ids[:, 1:]


def align_to_input(x: Tensor) -> Tensor:
    """[B, L − 1] → [B, L] with a zero column in front, so ``out[:, t]`` belongs to ``input_ids[:, t]``."""
    return torch.nn.functional.pad(x, (1, 0), value=0.0)
