"""Per-token advantage shaping from the pre-update entropy (``algo.token_shaping``).

Applied in the pre-update pass after the sequence advantages (:mod:`lit_entropy.objectives.advantages`), before any
controller sees the batch. Every rule is a pure function of ``[B]`` / ``[B, L]`` tensors laid out like a
:class:`~lit_entropy.rollout.batch.RolloutBatch`: rows right-padded, contiguous groups of ``G`` rows, a boolean
``response_mask``, ``entropy`` the full-vocabulary entropy of each position under the policy that sampled
the batch (the pre-update pass, detached). Results are fp32 ``[B, L]``, 0 outside the response.

* :func:`entropy_advantage` — Cheng et al. 2025, "Reasoning with Exploration: An Entropy Perspective"
  (arXiv 2506.14758): ``A′_t = A + min(α·H_t, |A|/κ)``.
* :func:`gtpo` — GTPO, Tan et al. 2025, "GTPO and GRPO-S: Token and Sequence-Level Reward Shaping with
  Policy Entropy" (arXiv 2508.04349): token rewards re-weighted by entropy share, inverse for failures.
* :func:`grpo_s` — GRPO-S from the same paper: the sequence-level version on mean response entropy.

Pick one by name with :func:`shape`; :data:`SHAPINGS` lists the names and their arguments.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

SHAPINGS: dict[str, frozenset[str]] = {
    "entropy_adv": frozenset({"alpha", "kappa"}),
    "gtpo": frozenset({"alpha1", "alpha2", "correct_threshold", "eps", "norm"}),
    "grpo_s": frozenset({"beta1", "beta2", "correct_threshold", "eps"}),
}
"""Names accepted by :func:`shape` and the ``algo.token_shaping_args`` keys each one takes."""

GTPO_NORMS = ("set", "group")
"""How GTPO z-scores its token rewards: over each set's own tokens (O⁺ and O⁻ apart), or over the whole group's."""

REPLACES_ESTIMATOR = frozenset({"gtpo", "grpo_s"})
"""Rules that compute the advantages from rewards and entropy themselves (``algo.advantage`` unused)."""


def check_args(name: str | None, args: dict[str, Any]) -> None:
    """Raise ``ValueError`` naming the valid choices when ``name`` or a key of ``args`` is unknown, or a
    coefficient is out of range."""
    if name is None:
        if args:
            raise ValueError(f"algo.token_shaping_args={dict(args)} given but algo.token_shaping is null")
        return
    if name not in SHAPINGS:
        raise ValueError(f"algo.token_shaping={name!r}; choose one of {sorted(SHAPINGS)} or null")
    unknown = sorted(set(args) - SHAPINGS[name])
    if unknown:
        raise ValueError(f"algo.token_shaping_args {unknown} unknown for {name}; it takes {sorted(SHAPINGS[name])}")
    if name == "entropy_adv":
        if not float(args.get("alpha", 0.4)) >= 0:
            raise ValueError(f"algo.token_shaping_args.alpha={args['alpha']} must be >= 0")
        if not float(args.get("kappa", 2.0)) > 0:
            raise ValueError(f"algo.token_shaping_args.kappa={args['kappa']} must be > 0")
    if name == "gtpo" and args.get("norm", "set") not in GTPO_NORMS:
        raise ValueError(f"algo.token_shaping_args.norm={args['norm']!r}; choose one of {list(GTPO_NORMS)}")
    for key in ("alpha1", "alpha2", "beta1", "beta2"):
        if key in args and not float(args[key]) >= 0:
            raise ValueError(f"algo.token_shaping_args.{key}={args[key]} must be >= 0")


def _check(entropy: Tensor, response_mask: Tensor, rows: int, group_size: int | None = None) -> Tensor:
    """``response_mask`` as bool after the shape checks shared by every rule."""
    if entropy.shape != response_mask.shape or entropy.dim() != 2 or entropy.shape[0] != rows:
        raise ValueError(f"entropy {tuple(entropy.shape)} and response_mask {tuple(response_mask.shape)} "
                         f"must both be [B, L] with B = {rows}")
    if group_size is not None and (group_size < 2 or rows % group_size != 0):
        raise ValueError(f"batch size {rows} is not a multiple of group_size {group_size} >= 2")
    return response_mask.bool()


def entropy_advantage(advantages: Tensor, entropy: Tensor, response_mask: Tensor,
                      alpha: float = 0.4, kappa: float = 2.0) -> Tensor:
    """Entropy-based advantage shaping (Cheng et al. 2025, arXiv 2506.14758), fp32 [B, L].

    ``A′_t = A + ψ(H_t)`` with ``ψ(H_t) = min(α·sg(H_t), |A|/κ)`` on every response token, whatever the
    sign of A. The entropy term carries no gradient (it only rescales the advantage); the cap ``|A|/κ`` with
    κ > 1 keeps ``ψ`` below ``|A|``, so a negative advantage is softened but never flipped, and a zero
    advantage (an all-equal group) stays 0. High-entropy tokens of correct answers are pushed up more and
    those of wrong answers down less, which the paper reports lengthens reasoning and raises pass@K.
    Defaults α = 0.4, κ = 2 are the paper's. ``advantages`` are per sequence [B].

    The paper's code reads H_t from the update's own forward (the current policy, detached); here it is the
    pre-update pass, i.e. the policy that sampled the batch. Both are the same on the first optimizer step
    of an iteration and drift apart by one iteration's updates at most.
    """
    mask = _check(entropy, response_mask, advantages.shape[0])
    a = advantages.detach().float()[:, None].expand(mask.shape)
    h = torch.where(mask, entropy.detach().float(), 0.0)
    shaped = a + torch.minimum(alpha * h, a.abs() / kappa)
    return torch.where(mask, shaped, 0.0)


def _positions(mask: Tensor) -> Tensor:
    """[B, L] int64: index t of each response token within its response (0, 1, ...), 0 elsewhere."""
    return torch.where(mask, mask.long().cumsum(-1) - 1, 0)


def _column_sum(values: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """[B, L]: at each response token, the sum of ``values`` over the tokens of its group's rows in ``mask``
    that sit at the same response position t (rows whose response is shorter than t do not take part)."""
    rows, width = mask.shape
    pos = _positions(mask)
    slot = torch.arange(rows, device=mask.device)[:, None] // group_size * width + pos
    sums = torch.zeros(rows // group_size * width, dtype=values.dtype, device=values.device)
    sums.index_add_(0, slot[mask], values[mask])
    return torch.where(mask, sums[slot], 0.0)


def _normalise_within(values: Tensor, mask: Tensor, group_size: int, eps: float) -> Tensor:
    """``(x − mean)/(std + eps)`` over each group's tokens in ``mask`` (unbiased std); 0 outside the mask and
    for a group whose such tokens are fewer than two or all equal."""
    rows = mask.shape[0]
    m = mask.view(rows // group_size, -1)
    x = torch.where(mask, values, 0.0).view(rows // group_size, -1)
    count = m.sum(-1, keepdim=True)
    mean = x.sum(-1, keepdim=True) / count.clamp(min=1)
    var = torch.where(m, (x - mean) ** 2, 0.0).sum(-1, keepdim=True) / (count - 1).clamp(min=1)
    lo = torch.where(m, x, torch.inf).amin(-1, keepdim=True)
    hi = torch.where(m, x, -torch.inf).amax(-1, keepdim=True)
    spread = (count >= 2) & (hi > lo)  # exactly equal values: 0, not rounding noise over eps
    out = torch.where(m & spread, (x - mean) / (var.sqrt() + eps), 0.0)
    return out.view(mask.shape)


def _share(values: Tensor, mask: Tensor, group_size: int) -> Tensor:
    """``values`` over their sum across the group's rows in ``mask`` at the same response position; 0 where
    that sum is 0. A position with one row gives exactly 1."""
    total = _column_sum(values, mask, group_size)
    return torch.where(mask & (total > 0), values / torch.where(total > 0, total, 1.0), 0.0)


def gtpo(rewards: Tensor, entropy: Tensor, response_mask: Tensor, group_size: int, alpha1: float = 1.0,
         alpha2: float = 0.1, correct_threshold: float = 1.0, eps: float = 1e-6, norm: str = "set") -> Tensor:
    """GTPO token advantages (Tan et al. 2025, arXiv 2508.04349), fp32 [B, L].

    Within a group, O⁺ are the successful responses (``R ≥ correct_threshold``) and O⁻ the others. At
    response position t let d_t (h_t) count the O⁺ (O⁻) responses still running at t. Token rewards:

    * success i: ``r̃_{i,t} = α₁·R_i + α₂ · H_{i,t} / Σ_{k∈O⁺, t} H_{k,t} · d_t`` — the entropy share of the
      token among the successes at t, scaled so that the bonuses at t sum to α₂·d_t;
    * failure j: ``r̃_{j,t} = −α₁ − α₂ · (1/H_{j,t}) / Σ_{k∈O⁻, t} (1/H_{k,t}) · h_t`` — inverse entropy, so a
      confident token of a wrong answer takes the larger share of the penalty.

    Advantages normalise the two sets separately over the group's tokens (paper's Eq. 6):
    ``Ã = (r̃ − mean)/(std + eps)`` over O⁺'s tokens, the same over O⁻'s. So within each set the sign
    says whether a token's shaped reward is above that set's average; an all-equal group still gets
    non-zero token advantages (entropy shares differ), unlike GRPO, while a lone success in its group gets 0
    (its share is 1 at every position). Sets whose shaped rewards are all equal get exactly 0. With binary
    rewards the z-scoring cancels α₁ and α₂ (every success has R = 1): they matter for non-binary rewards
    only. ``eps`` keeps 1/H finite where H = 0; a position where all the set's entropies are 0 gets share 0. Defaults α₁ = 1, α₂ = 0.1 are the paper's. For non-binary rewards the success term uses R_i
    itself and the failure term −α₁, as the paper's formula reads.

    ``norm="group"`` instead z-scores all of the group's tokens together. That keeps the success/failure
    signal (success tokens above the group's mean, failure tokens below) and leaves α₁, α₂ meaningful for
    binary rewards; the per-set reading, measured on the lab, loses it: the accuracy of a 40-iteration run
    falls (docs/results.md). The paper's Eq. 6 can be read either way; ``set`` follows the published
    reimplementations.
    """
    mask = _check(entropy, response_mask, rewards.shape[0], group_size)
    success = (rewards.float() >= correct_threshold)[:, None] & mask
    failure = ~(rewards.float() >= correct_threshold)[:, None] & mask
    h = torch.where(mask, entropy.detach().float(), 0.0)
    inv = torch.where(failure, 1.0 / (h + eps), 0.0)
    h_pos = torch.where(success, h, 0.0)
    d_t = _column_sum(success.float(), success, group_size)
    h_t = _column_sum(failure.float(), failure, group_size)
    bonus = _share(h_pos, success, group_size) * d_t
    penalty = _share(inv, failure, group_size) * h_t
    r = rewards.float()[:, None].expand(mask.shape)
    shaped = torch.where(success, alpha1 * r + alpha2 * bonus, torch.where(failure, -alpha1 - alpha2 * penalty, 0.0))
    if norm == "group":
        return _normalise_within(shaped, mask, group_size, eps)
    return _normalise_within(shaped, success, group_size, eps) + _normalise_within(shaped, failure, group_size, eps)


def grpo_s(rewards: Tensor, entropy: Tensor, response_mask: Tensor, group_size: int, beta1: float = 1.0,
           beta2: float = 0.1, correct_threshold: float = 1.0, eps: float = 1e-6) -> Tensor:
    """GRPO-S sequence advantages (Tan et al. 2025, arXiv 2508.04349), fp32 [B].

    Ĥ_i is the mean entropy over response i's tokens. With n successes and m failures in the group:

    * success i: ``r̂_i = β₁·R_i + β₂ · Ĥ_i / Σ_{k∈O⁺} Ĥ_k · n``;
    * failure j: ``r̂_j = −β₁ − β₂ · (1/Ĥ_j) / Σ_{k∈O⁻} (1/Ĥ_k) · m``;

    then ``Â_i = (r̂_i − mean_G r̂)/(std_G r̂ + eps)`` over the whole group (unbiased std), as GRPO does with
    R. Defaults β₁ = 1, β₂ = 0.1 are the paper's. Broadcast to tokens by the caller.
    """
    mask = _check(entropy, response_mask, rewards.shape[0], group_size)
    count = mask.sum(-1)
    mean_h = torch.where(mask, entropy.detach().float(), 0.0).sum(-1) / count.clamp(min=1)
    success = rewards.float() >= correct_threshold
    inv = 1.0 / (mean_h + eps)
    grid = lambda x: x.view(-1, group_size)  # noqa: E731
    pos_h = grid(torch.where(success, mean_h, 0.0))
    neg_inv = grid(torch.where(success, 0.0, inv))
    n = grid(success.float()).sum(-1, keepdim=True)
    safe = lambda x: torch.where(x > 0, x, 1.0)  # noqa: E731 (a sum of 0 means no such rows: share 0)
    bonus = pos_h / safe(pos_h.sum(-1, keepdim=True)) * n
    penalty = neg_inv / safe(neg_inv.sum(-1, keepdim=True)) * (group_size - n)
    shaped = torch.where(grid(success), beta1 * grid(rewards.float()) + beta2 * bonus, -beta1 - beta2 * penalty)
    centred = shaped - shaped.mean(-1, keepdim=True)
    return (centred / (shaped.std(-1, keepdim=True, correction=1) + eps)).reshape(-1)


def shape(name: str, advantages: Tensor, rewards: Tensor, entropy: Tensor, response_mask: Tensor,
          group_size: int, **args: Any) -> tuple[Tensor, Tensor]:
    """``(advantages [B], token_advantages [B, L])`` after the rule ``name`` (one of :data:`SHAPINGS`).

    ``entropy_adv`` keeps the estimator's per-sequence ``advantages`` and shapes the tokens. ``gtpo`` and
    ``grpo_s`` replace the estimator: GRPO-S returns its sequence advantages (broadcast over the response);
    GTPO returns, as the per-sequence value controllers read, the mean of each row's token advantages.
    """
    check_args(name, args)
    mask = response_mask.bool()
    if name == "entropy_adv":
        return advantages, entropy_advantage(advantages, entropy, mask, **args)
    if name == "grpo_s":
        seq = grpo_s(rewards, entropy, mask, group_size, **args)
        return seq, torch.where(mask, seq[:, None].expand(mask.shape), 0.0)
    tokens = gtpo(rewards, entropy, mask, group_size, **args)
    return tokens.sum(-1) / mask.sum(-1).clamp(min=1), tokens
