"""Sampler/trainer mismatch: importance weights, masks and diagnostics (pure tensor functions).

The rollout engine samples from ``π_sampler`` (vLLM in bf16 or fp8, other kernels); the trainer's
pre-update pass scores the same tokens under ``π_old``. The two never agree exactly, so the PPO
ratio ``π_θ/π_old`` is applied to samples that did not come from ``π_old``. The per-token log-weight

    log w_t = log π_old(y_t) − log π_sampler(y_t)        (``old_logp − sampler_logp``)

measures the gap; the rules below turn it into a detached weight that multiplies the per-token surrogate
and/or into a mask that takes tokens or sequences out of the loss. Sources (in our words, not their code):

* verl ``algorithm.rollout_correction`` (token/sequence weights ``rollout_is``, batch normalisation,
  rejection ``rollout_rs`` with k1/k3 statistics, the per-token veto, the ``rollout_corr/*`` metrics);
  after F. Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training" (2025) and
  J. Liu et al., "When Speed Kills Stability: Demystifying RL Collapse from the Training-Inference
  Mismatch" (2025).
* TRL ``vllm_importance_sampling_correction`` ({token, sequence} × {truncate, mask}, cap C).
* IcePop (Ling team, "Every Step Evolves: Scaling RL for Trillion-Scale Thinking Model", arXiv:2510.18855):
  tokens whose weight falls outside ``[α, β]`` leave the loss, the others keep their weight.
* slime / OpenRLHF TIS: truncated weights at token, sequence or geometric-mean level.
* DeepSeek-V3.2 (arXiv:2512.02556) off-policy sequence masking (OPSM).

Every function is computed in fp32 with no gradient (the weights change the measure, not the
objective) and selects away positions outside ``mask`` with ``torch.where``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
MODES: tuple[str, ...] = ("truncate", "mask")
REJECT_STATS: tuple[str, ...] = ("k1_mean", "k1_max", "k3_mean", "k3_max")

LOG_WEIGHT_CLAMP = 20.0
"""|log w| bound before ``exp`` (verl's safety bound): a weight is at most e²⁰ ≈ 4.9e8, never inf."""


def _zero() -> Tensor:
    return torch.zeros((), dtype=torch.float32)


def log_weights(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> Tensor:
    """``log w = old_logp − sampler_logp`` [B, L] fp32 on ``mask``, 0 elsewhere (so ``w = 1`` there)."""
    mask = mask.bool()
    diff = old_logp.detach().float() - sampler_logp.detach().float()
    return torch.where(mask, diff, _zero().to(diff.device))


def level_log_weights(log_w: Tensor, mask: Tensor, level: str) -> Tensor:
    """The log-weight of each token at ``level`` [B, L] (0 off ``mask``).

    * ``token``: ``log w_t`` (biased, low variance).
    * ``sequence``: ``Σ_t log w_t`` — the product ``Π_t w_t``, the unbiased sequence weight (variance
      grows with length); every token of a row gets its row's value.
    * ``geometric``: ``(1/|y|)·Σ_t log w_t`` — the geometric mean, length-invariant (slime, verl ``seq_mean_k1``).
    """
    if level not in LEVELS:
        raise ValueError(f"unknown weight level {level!r}; expected one of {LEVELS}")
    mask = mask.bool()
    if level == "token":
        return torch.where(mask, log_w, 0.0)
    total = torch.where(mask, log_w, 0.0).sum(-1, keepdim=True)
    if level == "geometric":
        total = total / mask.sum(-1, keepdim=True).clamp(min=1)
    return torch.where(mask, total.expand_as(log_w), 0.0)


def truncated_weights(log_w: Tensor, cap: float) -> tuple[Tensor, Tensor]:
    """Truncated importance sampling (TIS): ``w = min(exp(log w), C)`` and where the cap bit.

    Returns the weights [B, L] (detached fp32) and a bool [B, L] of the truncated positions (``w > C``).
    """
    if not cap > 0:
        raise ValueError(f"the truncation cap must be > 0, got {cap}")
    log_c = math.log(cap)
    clipped = log_w > log_c
    w = torch.exp(log_w.clamp(-LOG_WEIGHT_CLAMP, min(log_c, LOG_WEIGHT_CLAMP)))
    return w.detach(), clipped


def masked_weights(log_w: Tensor, low: float, high: float) -> tuple[Tensor, Tensor]:
    """Masked importance sampling (MIS, IcePop): ``w = exp(log w)`` where ``low ≤ w ≤ high``, and the keep mask.

    Returns the weights [B, L] (detached fp32, 0 where not kept) and a bool [B, L] of the kept positions
    (the comparison is done in log space; ``low = 0`` means no lower bound).
    """
    if not 0 <= low < high:
        raise ValueError(f"the mask band needs 0 <= low < high, got [{low}, {high}]")
    keep = log_w <= math.log(high)
    if low > 0:
        keep = keep & (log_w >= math.log(low))
    w = torch.exp(log_w.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
    return torch.where(keep, w, 0.0).detach(), keep


def token_k1(log_w: Tensor) -> Tensor:
    """Per-token k1 ``= −log w = log π_sampler − log π_old``: with tokens drawn from the sampler, its mean
    estimates ``KL(π_sampler‖π_old)`` (unbiased, can be < 0)."""
    return -log_w


def token_k3(log_w: Tensor) -> Tensor:
    """Per-token k3 ``= w − 1 − log w ≥ 0`` (Schulman 2020): unbiased for ``KL(π_sampler‖π_old)`` under
    the sampler, low variance. ``log w`` is clamped to ±20 first."""
    x = log_w.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
    return torch.exp(x) - 1.0 - x


def reject_sequences(log_w: Tensor, mask: Tensor, stat: str, threshold: float) -> Tensor:
    """Rejection sampling (verl ``rollout_rs``): [B] bool, True for rows whose statistic exceeds ``threshold``.

    * ``k1_mean``: ``|mean_t k1_t| > τ`` — the geometric-mean weight outside ``[e^−τ, e^τ]``.
    * ``k1_max``: ``max_t |k1_t| > τ`` — some token's weight outside ``[e^−τ, e^τ]``.
    * ``k3_mean``: ``mean_t k3_t > τ`` — the row's KL(sampler‖old) estimate is too large.
    * ``k3_max``: ``max_t k3_t > τ`` — one token is too far off.

    k1 is signed, so its statistics take the absolute value (a two-sided ratio band). Rows with no
    ``mask`` token are never rejected.
    """
    if stat not in REJECT_STATS:
        raise ValueError(f"unknown rejection statistic {stat!r}; expected one of {REJECT_STATS}")
    mask = mask.bool()
    kind, reduce = stat.split("_")
    per_token = token_k1(log_w) if kind == "k1" else token_k3(log_w)
    if reduce == "mean":
        value = torch.where(mask, per_token, 0.0).sum(-1) / mask.sum(-1).clamp(min=1)
        value = value.abs() if kind == "k1" else value
    else:
        per_token = per_token.abs() if kind == "k1" else per_token
        value = torch.where(mask, per_token, -math.inf).amax(-1)
    return (value > threshold) & mask.any(-1)


def veto_sequences(log_w: Tensor, mask: Tensor, veto: float) -> Tensor:
    """The per-token veto (verl ``rollout_token_veto_threshold``): [B] bool, True for rows with any
    token whose weight ``w < veto`` — one catastrophic token (the trainer finds it far less likely than
    the sampler did) rejects its whole sequence."""
    if not veto > 0:
        raise ValueError(f"the veto threshold must be > 0, got {veto}")
    return ((log_w < math.log(veto)) & mask.bool()).any(-1)


def off_policy_sequence_mask(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor, advantages: Tensor,
                             delta: float) -> Tensor:
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv:2512.02556, eq. 9; TRL ``off_policy_mask_threshold``).

    [B] bool, True for rows with a negative advantage ``A < 0`` whose mean per-token log-ratio
    ``(1/|y|)·Σ_t (log π_sampler − log π_old)`` — a k1 estimate of ``KL(π_sampler‖π_old)`` — exceeds ``δ``:
    learning from one's own far-off-policy mistakes destabilises training; positive samples are kept.
    Here it is measured once per rollout against the pre-update policy (DeepSeek and TRL measure it against
    the current policy in every step). ``advantages`` is per sequence [B].
    """
    mask = mask.bool()
    k1 = torch.where(mask, sampler_logp.float() - old_logp.float(), 0.0)
    kl = k1.sum(-1) / mask.sum(-1).clamp(min=1)
    return (advantages.float() < 0) & (kl > delta) & mask.any(-1)


def batch_normalized(weights: Tensor, mask: Tensor) -> Tensor:
    """Weights divided by their mean over the ``mask`` tokens (verl ``rollout_is_batch_normalize``), so that
    they average to 1 over the tokens that stay in the loss; unchanged when that mean is 0 or the mask empty."""
    mask = mask.bool()
    n = mask.sum()
    mean = torch.where(mask, weights, 0.0).sum() / n.clamp(min=1)
    return weights / mean if bool(mean > 0) else weights


def effective_sample_size(weights: Tensor, mask: Tensor) -> Tensor:
    """Normalised effective sample size ``(Σ w)² / (n·Σ w²) ∈ (0, 1]`` over the ``mask`` tokens (1 when
    every weight is equal, 1/n when one weight carries everything; 1 for an empty mask)."""
    mask = mask.bool()
    w = torch.where(mask, weights.float(), 0.0)
    n, sq = mask.sum(), w.square().sum()
    return torch.where(sq > 0, w.sum().square() / (n * sq).clamp(min=1e-30), torch.ones(()))


def mismatch_metrics(old_logp: Tensor, sampler_logp: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Diagnostics of the sampler/trainer gap over the response tokens (verl's ``rollout_corr/*`` names).

    With ``log w = old_logp − sampler_logp`` and tokens drawn from the sampler:

    * ``kl``: ``mean_t (−log w)``, the k1 estimate of ``KL(π_sampler‖π_old)``;
    * ``k3_kl``: ``mean_t (w − 1 − log w)``, the k3 estimate of the same KL (≥ 0);
    * ``ppl_ratio``: ``mean_rows exp(mean_t (−log w))``, the trainer's perplexity over the sampler's,
      per row then averaged;
    * ``chi2_token``: ``mean_t w² − 1``, the χ² divergence at token level (the weights' variance);
    * ``chi2_seq``: ``mean_rows (Π_t w_t)² − 1``, at sequence level;
    * ``ess``: :func:`effective_sample_size` of the token weights.

    Means are over all response tokens (token means) or over rows with a response (row means); an empty
    mask gives 0 (1 for ``ess``, 1 for ``ppl_ratio``).
    """
    mask = mask.bool()
    log_w = log_weights(old_logp, sampler_logp, mask).clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
    n = mask.sum().clamp(min=1)
    rows = mask.any(-1)
    n_rows = rows.sum().clamp(min=1)
    w = torch.exp(log_w)
    row_len = mask.sum(-1).clamp(min=1)
    row_log_ppl = torch.where(mask, -log_w, 0.0).sum(-1) / row_len  # log(ppl_old / ppl_sampler)
    seq_log_w = torch.where(mask, log_w, 0.0).sum(-1).clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP)
    empty = not bool(mask.any())
    return {
        "kl": torch.where(mask, -log_w, 0.0).sum() / n,
        "k3_kl": torch.where(mask, token_k3(log_w), 0.0).sum() / n,
        "ppl_ratio": torch.ones(()) if empty else torch.where(rows, torch.exp(row_log_ppl), 0.0).sum() / n_rows,
        "chi2_token": _zero() if empty else torch.where(mask, w.square(), 0.0).sum() / n - 1.0,
        "chi2_seq": _zero() if empty else torch.where(rows, torch.exp(2.0 * seq_log_w), 0.0).sum() / n_rows - 1.0,
        "ess": effective_sample_size(w, mask),
    }


def kl_bias_correction_ratio(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    """The factor of the bias-corrected KL penalty (TRL ``use_bias_correction_kl``, DeepSeek-V3.2 eq. 7):
    ``π_θ/π_old = exp(logp − old_logp)`` [B, L], WITH its gradient.

    The k3 estimate of ``KL(π_θ‖π_ref)`` is unbiased only for tokens drawn from ``π_θ``; the tokens came from
    the old policy, so each token's estimate is importance-weighted by the current/old ratio. TRL multiplies
    by this PPO ratio (not by the sampler weight ``w``, which scales the policy term only) and does not
    detach it. Off ``mask`` the factor is 1; ``log`` ratios are clamped to ±20.
    """
    mask = mask.bool()
    zero = torch.zeros((), dtype=torch.float32, device=logp.device)
    log_r = torch.where(mask, logp.float(), zero) - torch.where(mask, old_logp.float(), zero)
    return torch.exp(log_r.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP))
