"""Per-token entropy discriminator score and its on-policy baseline (Wang et al. 2026).

Used by docs/design.md §7.3 (Clip_B, Clip_V) and §7.5 (diagnostics).

With ``p = softmax(logits / T)``, ``H_t = −Σ_v p_v log p_v`` and ``p_t = p[target_t]`` (the sampled token):

* ``S_t = p_t·(H_t + log p_t)`` — the discriminator score. Since ``∂H/∂z_v = −p_v(log p_v + H)``,
  a step ``z ← z + ε·∇_z log p_t = z + ε·(e_t − p)`` on the logits changes the entropy by
  ``−ε·(S_t − N_t)`` to first order (Wang et al., Theorem 2, for a tabular softmax).
* ``N_t = Σ_v p_v²·(H_t + log p_v)`` — its on-policy baseline, ``N_t = E_{y∼p}[S_t]``: the score
  averaged over the sampled token drawn from the policy itself.

``S_t − N_t`` is the centred score (mean ≈ 0 on-policy, ``diag/disc_centered_mean``); Clip_B thresholds
``S`` and Clip_V thresholds ``D = N − S`` (:mod:`lit_entropy.objectives.selection`).

Terms with ``p_v = 0`` (a ``−inf`` logit, or an fp32 underflow) contribute 0 (the limit of
``p log p`` and ``p² log p``), never NaN. Rows of garbage logits (padding) give garbage scores at
those positions: mask them downstream. No gradient flows through the outputs.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.diagnostics import vocab_kernels
from lit_entropy.diagnostics.entropy import _check, _row_chunks


def _dot(a: Tensor, b: Tensor) -> Tensor:
    """Row-wise ``Σ_v a_v·b_v`` over the last dim as one batched matmul (no [..., V] temporary)."""
    return (a.unsqueeze(-2) @ b.unsqueeze(-1)).squeeze(-1).squeeze(-1)


def _stats_from_log_probs(log_probs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(log p_t, H, S, N)`` over the last dim of fp32 ``log_probs`` [..., V] for ``targets`` [...].

    ``N = Σ_v p_v²·(H + log p_v)`` is computed as ``H·Σ_v p_v² + Σ_v p_v·(p_v log p_v)``: the same sum, in
    three passes over the vocabulary instead of six (dead terms, ``p_v = 0``, are exactly 0 in both)."""
    probs = log_probs.exp()
    zero = torch.zeros((), dtype=log_probs.dtype, device=log_probs.device)
    plogp = torch.where(probs > 0, probs * log_probs, zero)
    entropy = -plogp.sum(-1)
    baseline = entropy * _dot(probs, probs) + _dot(probs, plogp)
    logp_t = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    p_t = logp_t.exp()
    score = torch.where(p_t > 0, p_t * (entropy + logp_t), zero)
    return logp_t, entropy, score, baseline


@torch.no_grad()
def token_scores(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_size: int = 1024, kernels: str = "auto"
) -> tuple[Tensor, Tensor]:
    """Discriminator score ``S`` [B, L] and baseline ``N`` [B, L] (fp32, no gradient).

    Rule (Wang et al. 2026): with ``p = softmax(logits / T)``, ``H_t = −Σ_v p_v log p_v``,
    ``p_t = p[target_t]``::

        S_t = p_t·(H_t + log p_t)
        N_t = Σ_v p_v²·(H_t + log p_v)      (= E_{y∼p}[S_t])

    ``logits[:, t]`` [B, L, V] is the prediction for ``targets[:, t]`` [B, L] (shift with
    :func:`lit_entropy.diagnostics.entropy.shift_for_causal_lm` first). ``targets`` must be valid
    vocabulary indices everywhere (padding included). The ``B·L`` rows are handled ``chunk_size`` at a
    time and cast to fp32 per chunk, so the extra memory is O(chunk_size·V) whatever the input dtype.
    ``kernels``: as :func:`lit_entropy.diagnostics.entropy.token_logprobs_and_entropy`'s.
    """
    _check(logits, targets, temperature, chunk_size)
    batch, length, _ = logits.shape
    flat_targets = targets.reshape(-1).long()
    total = batch * length
    score = torch.empty(total, dtype=torch.float32, device=logits.device)
    baseline = torch.empty(total, dtype=torch.float32, device=logits.device)
    compiled = vocab_kernels.compiles(kernels, logits)
    for start, end, rows in _row_chunks(logits.detach(), chunk_size):
        if compiled:
            score[start:end], baseline[start:end] = _fused_stats(rows, flat_targets[start:end], temperature)[2:]
            continue
        log_probs = torch.log_softmax(rows.float() / temperature, dim=-1)
        score[start:end], baseline[start:end] = _stats_from_log_probs(log_probs, flat_targets[start:end])[2:]
        del log_probs
    return score.view(batch, length), baseline.view(batch, length)


@torch.no_grad()
def _fused_stats(rows: Tensor, targets: Tensor, temperature: float) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(log p_t, H, S, N)`` of one chunk on the compiled kernels (:mod:`lit_entropy.diagnostics.vocab_kernels`):
    ``lse``, ``H`` and ``log p_t`` exactly as the compiled entropy pass computes them."""
    lse, entropy = vocab_kernels.call(vocab_kernels.lse_entropy, True, rows, temperature)
    logp_t = vocab_kernels.target_logprobs(rows, targets, lse, temperature)
    baseline = vocab_kernels.call(vocab_kernels.baseline, True, rows, lse, entropy, temperature)
    p_t = logp_t.exp()
    score = torch.where(p_t > 0, p_t * (entropy + logp_t), 0.0)
    return logp_t, entropy, score, baseline


def token_logprobs_entropy_and_scores(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_size: int = 1024, kernels: str = "auto"
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``log p(target)``, entropy ``H``, ``S`` and ``N`` [B, L] (fp32, no gradient) from ONE ``log_softmax`` per
    chunk: the pre-update pass with the diagnostics on needs all four, and the vocabulary-wide passes (49k
    columns on a real model) cost as much as the model's forward. ``log p`` and ``H`` are computed with the same
    ops as :func:`lit_entropy.diagnostics.entropy.token_logprobs_and_entropy` (with the same ``kernels``), so they
    equal its values."""
    _check(logits, targets, temperature, chunk_size)
    batch, length, _ = logits.shape
    flat_targets = targets.reshape(-1).long()
    compiled = vocab_kernels.compiles(kernels, logits)
    out = [torch.empty(batch * length, dtype=torch.float32, device=logits.device) for _ in range(4)]
    for start, end, rows in _row_chunks(logits.detach(), chunk_size):
        if compiled:
            values = _fused_stats(rows, flat_targets[start:end], temperature)
        else:
            log_probs = torch.log_softmax(rows.float() / temperature, dim=-1)
            values = _stats_from_log_probs(log_probs, flat_targets[start:end])
            del log_probs
        for o, value in zip(out, values, strict=True):
            o[start:end] = value
    logp, entropy, score, baseline = (o.view(batch, length) for o in out)
    return logp, entropy, score, baseline


@torch.no_grad()
def naive_token_scores(
    logits: Tensor, targets: Tensor, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[Tensor, Tensor]:
    """Reference for :func:`token_scores`: one fp32 ``log_softmax`` over all of [B, L, V] (``chunk_size`` ignored)."""
    _check(logits, targets, temperature, chunk_size)
    log_probs = torch.log_softmax(logits.detach().float() / temperature, dim=-1)
    probs = log_probs.exp()
    entropy = -torch.where(probs > 0, probs * log_probs, 0.0).sum(-1, keepdim=True)
    baseline = torch.where(probs > 0, probs.pow(2) * (entropy + log_probs), 0.0).sum(-1)
    logp_t = log_probs.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    p_t = logp_t.exp()
    score = torch.where(p_t > 0, p_t * (entropy.squeeze(-1) + logp_t), 0.0)
    return score, baseline
