"""What every policy loss shares: the importance ratio, the masking of its inputs, and the aggregation
(docs/design.md §7.2, §8). The losses themselves are one file each in :mod:`lit_entropy.objectives.losses`
(PPO's clip: :mod:`~lit_entropy.objectives.losses.ppo`).

* :func:`ratio`: ``exp(logp − old_logp)`` in fp32, clamped so it stays finite.
* :func:`masked_loss_inputs` and :func:`loss_info`: a surrogate's inputs zeroed outside the mask, and its info dict.
* :func:`aggregate` with the modes :data:`AGG_MODES` and the minibatch-global counts of
  :func:`global_counts`, so gradient accumulation over micro-batches reproduces the minibatch loss.
* :func:`entropy_bonus`: ``−coef·H̄``.

Everything is computed in fp32 whatever the dtype of the inputs: a bf16-rounded ratio biases clipping.
Per-token tensors are [B, L]; positions outside the mask are selected away with ``torch.where`` (never
multiplied by 0), so garbage there (even NaN) cannot reach a result.
"""

from __future__ import annotations

import torch
from torch import Tensor

LOG_RATIO_CLAMP = 20.0
"""|log r| bound before ``exp`` (verl's value). Past ±88.7 fp32 ``exp`` overflows and the loss and its
gradient turn NaN; a token 20 nats off-policy (r ≈ 4.9e8) carries no gradient instead — PPO's clip would
already have removed the gradient of most such tokens."""

def ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    """Importance ratio ``r = exp(clamp(logp − old_logp, ±LOG_RATIO_CLAMP))`` in fp32 (finite for any input)."""
    log_r = logp.float() - old_logp.float()
    return torch.exp(log_r.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))


def aggregate_token_mean(values: Tensor, mask: Tensor, num_tokens: float | Tensor | None = None) -> Tensor:
    """Token-mean aggregation, ``Σ_t values_t·M_t / num_tokens`` (fp32 scalar).

    ``num_tokens`` defaults to ``M.sum()``. When a minibatch is split into micro-batches, pass the
    token count of the whole minibatch (global over micro-batches and ranks) so that the micro-batch
    losses sum exactly to the minibatch loss. With ``num_tokens == 0`` a zero is returned that still
    has a gradient path to ``values``. Positions outside the mask never contribute, even if non-finite.
    """
    mask = mask.bool()
    total = _masked_values(values, mask).sum()
    return _divide_by_count(total, mask.sum() if num_tokens is None else num_tokens, "num_tokens")


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """``Σ values·M / Σ M`` in fp32; 0 (with a gradient path) when the mask is empty."""
    return aggregate_token_mean(values, mask)


# ---- aggregation modes (docs/design.md §7.2) -----------------------------------------------------------

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

Count = float | int | Tensor


def _masked_values(values: Tensor, mask: Tensor) -> Tensor:
    """fp32 ``values`` with every position outside ``mask`` replaced by 0 (``torch.where``: NaN-safe)."""
    return torch.where(mask, values.float(), torch.zeros((), dtype=torch.float32, device=values.device))


def _divide_by_count(total: Tensor, count: Count, name: str) -> Tensor:
    """``total / count`` for a Python number or a 0-d tensor; a zero count gives ``total·0`` (grad path kept).

    Tensor counts stay on the device (no host sync); Python counts are validated to be >= 0.
    """
    if isinstance(count, Tensor):
        denom = count.to(device=total.device, dtype=torch.float32)
        return torch.where(denom > 0, total / denom.clamp(min=1e-30), total * 0.0)
    if not count >= 0:
        raise ValueError(f"{name} must be a non-negative count, got {count}")
    if count == 0:
        return total * 0.0
    return total / float(count)


def global_counts(mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(num_tokens, num_seqs)`` of a minibatch: masked tokens and rows with at least one masked token.

    Both are int64 0-d tensors on ``mask``'s device. Compute them once on the whole minibatch (and, with
    several ranks, ``all_reduce`` them with SUM) and pass them to every micro-batch's :func:`aggregate`:
    the micro-batch losses then sum exactly to the minibatch loss, however the minibatch is split.
    Rows without any masked token (fully removed by a selection rule, rejected sequences, empty
    responses) are *not* counted in ``num_seqs``: the sequence-level means renormalise over the rows that
    are still in the loss.
    """
    mask = mask.bool()
    return mask.sum(), mask.any(dim=-1).sum()


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Aggregate per-token ``values`` [B, L] over the tokens where ``mask`` [B, L] is True (fp32 scalar).

    With ``v`` the values, ``m`` the mask, ``N`` = ``num_tokens``, ``S`` = ``num_seqs`` and ``C`` =
    ``norm_constant``:

    * ``token-mean``: ``Σ_{i,t} v_it·m_it / N``.
    * ``seq-mean-token-mean``: ``(1/S)·Σ_i [Σ_t v_it·m_it / Σ_t m_it]`` (GRPO's per-sequence mean, then
      a mean over sequences; a row with no masked token contributes 0).
    * ``seq-mean-token-sum``: ``(1/S)·Σ_i Σ_t v_it·m_it``.
    * ``seq-mean-token-sum-norm`` (Dr.GRPO, Liu et al. 2025, "Understanding R1-Zero-Like Training"):
      ``(1/S)·Σ_i Σ_t v_it·m_it / C`` with ``C`` a fixed constant (e.g. the maximum response length),
      so no per-sequence length normalisation. ``norm_constant`` is required (> 0) for this mode and
      ignored by the others. (verl's mode of the same name divides by ``C`` only, without ``1/S``.)

    ``N`` and ``S`` must be the counts of the *whole minibatch* (all micro-batches and ranks, see
    :func:`global_counts`) when the minibatch is split for gradient accumulation; they default to the
    counts of this call's ``mask`` (``S`` = rows with at least one masked token). ``num_seqs`` is ignored
    by ``token-mean`` and ``num_tokens`` by the sequence modes. Counts may be Python numbers or 0-d
    tensors; a zero count returns a zero that keeps the gradient path to ``values``. Positions outside
    the mask never contribute, even when they hold NaN or inf (selected away with ``torch.where``).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {AGG_MODES}")
    mask = mask.bool()
    masked = _masked_values(values, mask)
    if mode == "token-mean":
        if num_tokens is None:
            num_tokens = mask.sum()
        return _divide_by_count(masked.sum(), num_tokens, "num_tokens")

    if num_seqs is None:
        num_seqs = mask.any(dim=-1).sum()
    row_sums = masked.sum(dim=-1)
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=-1)
        row_means = row_sums / lengths.clamp(min=1).to(torch.float32)
        seq_total = torch.where(lengths > 0, row_means, row_means * 0.0).sum()
        return _divide_by_count(seq_total, num_seqs, "num_seqs")
    if mode == "seq-mean-token-sum":
        return _divide_by_count(row_sums.sum(), num_seqs, "num_seqs")
    # seq-mean-token-sum-norm
    if norm_constant is None or not norm_constant > 0:
        raise ValueError(f"mode 'seq-mean-token-sum-norm' needs a norm_constant > 0, got {norm_constant}")
    return _divide_by_count(row_sums.sum() / float(norm_constant), num_seqs, "num_seqs")


def entropy_bonus(
    entropy: Tensor,
    mask: Tensor,
    coef: float,
    mode: str = "token-mean",
    num_tokens: Count | None = None,
    num_seqs: Count | None = None,
    norm_constant: float | None = None,
) -> Tensor:
    """Entropy bonus term ``−coef·H̄`` to be *added* to the loss (docs/design.md §7.2), fp32 scalar.

    ``H̄ = aggregate(entropy, mask, mode, num_tokens, num_seqs, norm_constant)`` with the same mode and
    global counts as the policy loss, so it is micro-batch invariant too. ``entropy`` [B, L] must carry
    the gradient (e.g. from ``token_logprobs_and_entropy``); minimising the loss then raises the entropy
    for ``coef > 0``.
    """
    return -float(coef) * aggregate(entropy, mask, mode, num_tokens, num_seqs, norm_constant)


def zero_outside(x: Tensor, mask: Tensor | None) -> Tensor:
    """``x`` in fp32, 0 where ``mask`` is False (``torch.where``: garbage there never reaches a result)."""
    x = x.float()
    return x if mask is None else torch.where(mask, x, torch.zeros((), dtype=torch.float32, device=x.device))


def per_token_advantages(advantages: Tensor, like: Tensor, mask: Tensor | None) -> Tensor:
    """Advantages per token [B, L] like ``like`` (a per-sequence [B] is broadcast), fp32, 0 outside ``mask``."""
    adv = advantages.float()
    if adv.dim() == like.dim() - 1:
        adv = adv.unsqueeze(-1)
    return zero_outside(adv.expand_as(like), mask)


def masked_loss_inputs(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """fp32 ``logp``, ``old_logp``, advantages [B, L] and the bool mask, zero outside the mask."""
    mask = mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    lp = torch.where(mask, logp.float(), zero)
    old = torch.where(mask, old_logp.float(), zero)
    adv = advantages.float()
    if adv.dim() == lp.dim() - 1:  # per-sequence [B] against per-token [B, L]
        adv = adv.unsqueeze(-1)
    adv = torch.where(mask, adv.expand_as(lp), zero)
    return lp, old, adv, mask


def loss_info(r: Tensor, low: Tensor, high: Tensor) -> dict[str, Tensor]:
    """The info dict of :func:`~lit_entropy.objectives.losses.ppo.clipped_surrogate` for a loss with no dual clip: the ratio and where it was capped."""
    return {"clipped_low": low, "clipped_high": high, "dual_clipped": torch.zeros_like(low), "ratio": r.detach()}
