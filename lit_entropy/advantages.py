"""Group-relative advantage estimators (docs/design.md §7.1).

Rows of a rollout batch come in contiguous groups of ``group_size`` completions of one prompt, so
``rewards.view(-1, group_size)`` puts each group on one row. Advantages are per sequence ([B], fp32).

Estimators (all ``[B] -> [B]`` fp32, pick one by name with :func:`compute_advantages`):

* :func:`grpo` — GRPO (Shao et al. 2024), group mean and unbiased group std.
* :func:`dr_grpo` — Dr.GRPO (Liu et al. 2025), group mean only.
* :func:`rloo` — RLOO (Ahmadian et al. 2024), leave-one-out mean.
* :func:`reinforce_pp_baseline` — REINFORCE++-baseline (Hu et al. 2025), group mean then batch whitening.
* :func:`w_reinforce` — W-REINFORCE (Zhu et al. 2025), ``+λ`` / ``−1`` with no baseline.
* :func:`qae` — QAE (Wu et al. 2025, arXiv 2509.22611), the group's K-quantile as baseline.
* :func:`pass_at_k` — Pass@k training (Chen et al. 2025, arXiv 2508.10751), closed-form group advantage.
* :func:`maxrl` — MaxRL (Tajwar et al. 2026, arXiv 2602.02710), the group mean divides instead of the std.
* :func:`grpo_batch` — batch-level scaling (TRL ``scale_rewards="batch"``, Lite PPO): group mean, batch std.
* :func:`signed` — ``2R − 1``: the reward on ±1 with no baseline (TOPR's setting, Le Roux et al. 2025).

Reward shaping applied before an estimator: :func:`unlikeliness_rewards` (He et al. 2025).
Dynamic sampling (DAPO, Yu et al. 2025): :func:`group_has_signal` and :func:`select_groups`, which the
rollout data module applies to every sampling round.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    """``rewards`` [B] as fp32 [B // G, G], after checking the shapes."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 2:
        raise ValueError(
            f"group_size must be >= 2, got {group_size}: with G=1 a group has no baseline "
            "(every advantage would be 0)"
        )
    batch = rewards.shape[0]
    if batch % group_size != 0:
        raise ValueError(f"batch size {batch} is not divisible by group_size {group_size}")
    return rewards.float().view(batch // group_size, group_size)


def zero_std_groups(rewards: Tensor, group_size: int) -> Tensor:
    """[B // G] bool: True for groups whose rewards are all equal (they carry no learning signal), compared in
    ``rewards``' own dtype (float64 rewards compare exactly as the Python floats they came from)."""
    grouped = rewards.view(_grouped(rewards, group_size).shape)  # _grouped checks the shapes
    return (grouped == grouped[:, :1]).all(dim=1)


def grpo(rewards: Tensor, group_size: int, eps: float = 1e-6, scale_std: bool = True) -> Tensor:
    """GRPO advantages, ``A_i = (R_i − mean_G R) / (std_G R + eps)``, fp32 [B].

    ``std_G`` is the unbiased sample standard deviation of the group (``torch.std`` with
    ``correction=1``), as TRL and verl compute it. ``scale_std=False`` gives Dr.GRPO,
    ``A_i = R_i − mean_G R`` (no division). A group whose rewards are all equal gets advantage 0
    exactly, whatever rounding the mean suffers.

    Raises ``ValueError`` when ``group_size < 2`` or when ``B`` is not a multiple of it.
    """
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale_std:
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(centred), centred)
    return centred.reshape(-1)


def _check_rows(rewards: Tensor, group_size: int, min_group_size: int) -> None:
    """Shape checks shared by the estimators that do not need a baseline (``G >= min_group_size``)."""
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < min_group_size:
        raise ValueError(f"group_size must be >= {min_group_size}, got {group_size}")
    if rewards.shape[0] % group_size != 0:
        raise ValueError(f"batch size {rewards.shape[0]} is not divisible by group_size {group_size}")


def dr_grpo(rewards: Tensor, group_size: int) -> Tensor:
    """Dr.GRPO advantages (Liu et al. 2025, "Understanding R1-Zero-Like Training"), fp32 [B].

    ``A_i = R_i − mean_G R``: the group mean is subtracted and, unlike GRPO, nothing is divided by the
    group std (which up-weights near-flat groups). Same as ``grpo(rewards, group_size, scale_std=False)``.
    All-equal groups give exactly 0. Raises ``ValueError`` for ``G < 2`` or ``B`` not a multiple of ``G``.
    """
    return grpo(rewards, group_size, scale_std=False)


def rloo(rewards: Tensor, group_size: int) -> Tensor:
    """RLOO advantages (Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs"), fp32 [B].

    ``A_i = R_i − mean_{j≠i} R_j = G/(G−1) · (R_i − mean_G R)``: each sample's baseline is the mean
    reward of the other ``G − 1`` samples of its group, so the baseline does not depend on ``R_i``.
    All-equal groups give exactly 0. Raises ``ValueError`` for ``G < 2`` (no other sample to average)
    or ``B`` not a multiple of ``G``.
    """
    grouped = _grouped(rewards, group_size)
    centred = (grouped - grouped.mean(dim=1, keepdim=True)) * (group_size / (group_size - 1))
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def reinforce_pp_baseline(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """REINFORCE++-baseline advantages (Hu et al. 2025, "REINFORCE++: An Efficient RLHF Algorithm
    with Robustness to Both Prompt and Reward Models"), fp32 [B].

    Two steps: ``x_i = R_i − mean_G R`` (group baseline), then whitening over the whole batch,
    ``A_i = (x_i − mean_B x) / (std_B x + eps)``.

    * The batch statistics are over **sequences**: each of the ``B`` rows counts once, whatever its
      response length (reference implementations whiten over tokens, which weighs long responses more).
      Rows of all-equal groups take part with ``x = 0`` (they pull ``std_B`` down) and are then set back
      to exactly 0.
    * ``std_B`` is the **population** standard deviation (``correction=0``), so with ``eps = 0`` the
      output has batch mean 0 and population std 1 exactly (up to rounding). Note that :func:`grpo`
      uses the unbiased std within a group instead.
    * When the whole batch has zero variance (every group all-equal) the result is all zeros, not NaN,
      for any ``eps`` including 0.

    Raises ``ValueError`` for ``G < 2`` or ``B`` not a multiple of ``G``.
    """
    grouped = _grouped(rewards, group_size)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    centred = torch.where(flat, torch.zeros_like(grouped), grouped - grouped.mean(dim=1, keepdim=True))
    x = centred.reshape(-1)
    std = x.std(correction=0)
    positive = std > 0
    denom = torch.where(positive, std + eps, torch.ones_like(std))
    whitened = torch.where(positive, (x - x.mean()) / denom, torch.zeros_like(x))
    return torch.where(flat.expand_as(grouped).reshape(-1), torch.zeros_like(whitened), whitened)


def w_reinforce(
    rewards: Tensor,
    correct_threshold: float = 1.0,
    lam: float = 0.1,
    *,
    group_size: int | None = None,
) -> Tensor:
    """W-REINFORCE advantages (Zhu et al. 2025, "The Surprising Effectiveness of Negative
    Reinforcement in LLM Reasoning"), fp32 [B].

    ``A_i = +λ`` if ``R_i >= correct_threshold`` (correct), else ``−1`` (incorrect): the objective
    ``λ·PSR + NSR`` that down-weights positive-sample reinforcement. There is no baseline, so
    all-equal groups still get ``+λ`` / ``−1`` and ``G = 1`` is fine.

    ``group_size`` is only there so the dispatcher can call every estimator the same way; it does not
    change the result. When given, it is checked for consistency (``G >= 1``, ``B`` a multiple of ``G``),
    since a mismatch means the batch is not laid out in groups as the caller thinks.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size is not None:
        _check_rows(rewards, group_size, min_group_size=1)
    correct = rewards.float() >= correct_threshold
    return torch.where(
        correct,
        torch.full(rewards.shape, float(lam), dtype=torch.float32, device=rewards.device),
        torch.full(rewards.shape, -1.0, dtype=torch.float32, device=rewards.device),
    )


def unlikeliness_rewards(
    rewards: Tensor, seq_logp_mean: Tensor, group_size: int, beta_rank: float = 0.25
) -> Tensor:
    """Unlikeliness-shaped rewards (He et al. 2025, "Rewarding the Unlikely: Lifting GRPO Beyond
    Distribution Sharpening"), fp32 [B].

    Within each group, rank the samples by ``seq_logp_mean`` (mean token log-prob of the response under
    the current policy), ascending: rank 0 is the least likely sample, rank ``G − 1`` the most likely.
    Ties keep index order (stable sort: the earlier row gets the lower rank). Then
    ``R̃_i = R_i · (1 − β_rank · rank_i / G)``, so among correct samples the unlikely ones keep more of
    their reward. This only transforms rewards; the caller applies an estimator to ``R̃`` afterwards.

    ``seq_logp_mean`` must be [B] and finite (NaN sorts as the most likely). It is only ranked, never
    differentiated. ``G = 1`` is allowed (every rank is 0: rewards unchanged). Raises ``ValueError`` for
    shape mismatches, ``G < 1`` or ``B`` not a multiple of ``G``.
    """
    _check_rows(rewards, group_size, min_group_size=1)
    if seq_logp_mean.shape != rewards.shape:
        raise ValueError(
            f"seq_logp_mean {tuple(seq_logp_mean.shape)} does not match rewards {tuple(rewards.shape)}"
        )
    logp = seq_logp_mean.detach().float().view(-1, group_size)
    order = torch.argsort(logp, dim=1, stable=True)  # order[g, k] = index of the k-th least likely
    ranks = torch.argsort(order, dim=1, stable=True)  # inverse permutation: rank of each index
    scale = 1.0 - beta_rank * ranks.float() / group_size
    return (rewards.float().view(-1, group_size) * scale).reshape(-1)


def qae(rewards: Tensor, group_size: int, quantile_k: float = 0.4, eps: float = 1e-6) -> Tensor:
    """QAE advantages (Wu et al. 2025, "Quantile Advantage Estimation for Entropy-Safe Reasoning",
    arXiv 2509.22611), fp32 [B].

    ``A_i = (R_i − b_K)/(std_G R + eps)``: GRPO with the group mean replaced by the K-quantile
    ``b_K = inf{x : F_G(x) ≥ K}`` of the group's rewards (F_G their empirical CDF), i.e. the
    ``⌈K·G⌉``-th smallest reward; ``std_G`` is the unbiased group std, as in :func:`grpo`. With binary
    rewards and success rate p, ``b_K = 0`` when ``p ≤ 1 − K`` (only the successes learn, A > 0) and
    ``b_K = 1`` otherwise (only the failures learn, A < 0): most responses get advantage 0 exactly. K = 0.4
    is the value of the paper's figures. ``⌈K·G⌉`` is taken with a 1e-9 tolerance so that e.g. K·G = 2 in
    floating point counts as 2. All-equal groups give 0. Raises ``ValueError`` for ``K ∉ (0, 1)``.
    """
    if not 0 < quantile_k < 1:
        raise ValueError(f"quantile_k={quantile_k} must be in (0, 1)")
    grouped = _grouped(rewards, group_size)
    rank = min(max(math.ceil(quantile_k * group_size - 1e-9), 1), group_size)
    baseline = grouped.sort(dim=1).values[:, rank - 1 : rank]
    centred = (grouped - baseline) / (grouped.std(dim=1, keepdim=True, correction=1) + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def pass_at_k(rewards: Tensor, group_size: int, k: int = 4, correct_threshold: float = 1.0,
              eps: float = 1e-6) -> Tensor:
    """Pass@k-training advantages (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation of Large Reasoning Models", arXiv 2508.10751), fp32 [B].

    The analytical form of their bootstrap: the group of N = G responses with c correct is split into all
    C(N, k) subsets of k; a subset scores 1 if any member is correct (its pass@k); each response's advantage
    is the group-normalised score averaged over the subsets it belongs to. In closed form, with
    ``ρ = 1 − C(N−c, k)/C(N, k)`` (mean subset score) and ``σ = sqrt(ρ(1 − ρ))``:

    * correct response: ``A⁺ = (1 − ρ)/(σ + eps)``;
    * wrong response: ``A⁻ = (1 − ρ − C(N−c−1, k−1)/C(N−1, k−1))/(σ + eps)``.

    k = 1 gives GRPO with the population std. Rewards count as correct when ``R ≥ correct_threshold``:
    the closed form is for binary outcomes, so non-binary rewards are binarised (their size is lost).
    All-correct and all-wrong groups give 0. Raises ``ValueError`` unless ``1 ≤ k ≤ G``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= group_size:
        raise ValueError(f"k={k!r} must be an integer in [1, group_size={group_size}]")
    correct = _grouped(rewards, group_size) >= correct_threshold
    n = group_size
    table = torch.zeros(n + 1, 2, dtype=torch.float64)  # row c: (A⁺, A⁻) for a group with c correct
    for c in range(1, n):
        rho = 1 - math.comb(n - c, k) / math.comb(n, k)
        sigma = math.sqrt(rho * (1 - rho))
        miss = math.comb(n - c - 1, k - 1) / math.comb(n - 1, k - 1)
        table[c] = torch.tensor([(1 - rho) / (sigma + eps), (1 - rho - miss) / (sigma + eps)])
    per_group = table.float().to(rewards.device)[correct.sum(dim=1)]  # [B // G, 2]
    return torch.where(correct, per_group[:, :1], per_group[:, 1:]).reshape(-1)


def maxrl(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """MaxRL advantages (Tajwar et al. 2026, "Maximum Likelihood Reinforcement Learning", arXiv 2602.02710;
    prime-rl ``max_rl``, TRL ``MaxRLTrainer``'s p-normalisation), fp32 [B].

    ``A_i = (R_i − mean_G R)/(mean_G R + eps)``. With binary rewards and c of G correct (p = c/G) a correct
    response gets ``(1 − p)/p`` and a wrong one ``−1``: the group's gradient is weighted by ``1/p``, the
    gradient of ``log p`` (the likelihood of success) instead of ``p`` (pass@1), so hard prompts weigh more.
    The rewards should be non-negative (a mean near 0 from mixed signs would blow up). All-equal groups
    (all wrong included) give exactly 0.
    """
    grouped = _grouped(rewards, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    centred = (grouped - mean) / (mean + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def grpo_batch(rewards: Tensor, group_size: int, eps: float = 1e-6) -> Tensor:
    """Batch-scaled group advantages (TRL ``scale_rewards="batch"``; "Lite PPO", Liu et al. 2025, "Part I: Tricks
    or Traps?", arXiv 2508.08221), fp32 [B].

    ``A_i = (R_i − mean_G R)/(std_B R + eps)``: the group mean is the baseline, as in :func:`grpo`, but one
    standard deviation of ALL the batch's rewards (unbiased, ``correction=1``, as ``torch.std`` in TRL) scales
    every group, so near-flat groups are not blown up. All-equal groups give exactly 0; a batch of equal
    rewards gives all zeros.
    """
    grouped = _grouped(rewards, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    std = grouped.reshape(-1).std(correction=1) if grouped.numel() > 1 else torch.zeros(())
    centred = centred / (std + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centred), centred).reshape(-1)


def signed(rewards: Tensor, *, group_size: int | None = None) -> Tensor:
    """The reward on ±1 with no baseline, ``A_i = 2R_i − 1``, fp32 [B]: TOPR's setting (Le Roux et al. 2025,
    "Tapered Off-Policy REINFORCE", arXiv 2503.14286: +1 for a correct completion, −1 for a wrong one, REINFORCE
    with no baseline, which the paper shows would change the effective share of positive samples).

    Rewards here lie in [0, 1] with 1 correct, so binary rewards give exactly +1 / −1; other rewards (a shaped
    reward, DAPO's overlong penalty) are mapped by the same affine map, keeping their order and spacing. No
    baseline: all-equal groups keep their ±1 and ``G = 1`` is fine; ``group_size`` is only checked (as in
    :func:`w_reinforce`).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size is not None:
        _check_rows(rewards, group_size, min_group_size=1)
    return 2.0 * rewards.float() - 1.0


ESTIMATORS: tuple[str, ...] = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "w_reinforce", "qae", "passk", "maxrl",
                               "grpo_batch", "signed")
"""Names accepted by :func:`compute_advantages`."""

NO_BASELINE: tuple[str, ...] = ("w_reinforce", "signed")
"""Estimators with no baseline: all-equal groups still carry a signal (what DAPO's dynamic sampling would drop)."""

# Keyword arguments each estimator understands; others in ``_KNOWN_KWARGS`` are dropped for it.
_ACCEPTED_KWARGS: dict[str, frozenset[str]] = {
    "grpo": frozenset({"eps", "scale_std"}),
    "dr_grpo": frozenset(),
    "rloo": frozenset(),
    "reinforce_pp": frozenset({"eps"}),
    "w_reinforce": frozenset({"lam", "correct_threshold"}),
    "qae": frozenset({"quantile_k", "eps"}),
    "passk": frozenset({"k", "correct_threshold", "eps"}),
    "maxrl": frozenset({"eps"}),
    "grpo_batch": frozenset({"eps"}),
    "signed": frozenset(),
}
_KNOWN_KWARGS = frozenset().union(*_ACCEPTED_KWARGS.values())


def compute_advantages(name: str, rewards: Tensor, group_size: int, **kwargs: Any) -> Tensor:
    """Per-sequence advantages [B] fp32 from the estimator called ``name`` (one of :data:`ESTIMATORS`).

    ``"grpo"`` → :func:`grpo`, ``"dr_grpo"`` → :func:`dr_grpo`, ``"rloo"`` → :func:`rloo`,
    ``"reinforce_pp"`` → :func:`reinforce_pp_baseline`, ``"w_reinforce"`` → :func:`w_reinforce`,
    ``"qae"`` → :func:`qae`, ``"passk"`` → :func:`pass_at_k`, ``"maxrl"`` → :func:`maxrl`,
    ``"grpo_batch"`` → :func:`grpo_batch`, ``"signed"`` → :func:`signed`.

    ``kwargs`` may hold the union of the estimators' options (``eps``, ``scale_std``, ``lam``,
    ``correct_threshold``, ``quantile_k``, ``k``), e.g. straight from a config; each is forwarded only to the estimators it
    means something to and dropped for the others. A name outside that set raises ``TypeError``;
    an unknown ``name`` raises ``ValueError`` listing the valid ones.
    """
    if name not in _ACCEPTED_KWARGS:
        raise ValueError(f"unknown advantage estimator {name!r}; valid: {', '.join(ESTIMATORS)}")
    unknown = set(kwargs) - _KNOWN_KWARGS
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {sorted(unknown)} for compute_advantages; "
            f"known: {sorted(_KNOWN_KWARGS)}"
        )
    opts = {k: v for k, v in kwargs.items() if k in _ACCEPTED_KWARGS[name]}
    if name == "grpo":
        return grpo(rewards, group_size, **opts)
    if name == "dr_grpo":
        return dr_grpo(rewards, group_size)
    if name == "rloo":
        return rloo(rewards, group_size)
    if name == "reinforce_pp":
        return reinforce_pp_baseline(rewards, group_size, **opts)
    if name == "qae":
        return qae(rewards, group_size, **opts)
    if name == "passk":
        return pass_at_k(rewards, group_size, **opts)
    if name == "maxrl":
        return maxrl(rewards, group_size, **opts)
    if name == "grpo_batch":
        return grpo_batch(rewards, group_size, **opts)
    if name == "signed":
        return signed(rewards, group_size=group_size)
    return w_reinforce(rewards, group_size=group_size, **opts)


def group_has_signal(rewards: Tensor, group_size: int) -> Tensor:
    """[B // G] bool: True for groups whose rewards are not all equal (DAPO dynamic sampling,
    Yu et al. 2025, keeps only these). The complement of :func:`zero_std_groups`; same errors."""
    return ~zero_std_groups(rewards, group_size)


def select_groups(num_groups_needed: int, signal: Tensor) -> Tensor:
    """int64 indices of the first ``num_groups_needed`` groups whose ``signal`` is True, ascending.

    For DAPO dynamic sampling (Yu et al. 2025): the data module samples rounds of groups, keeps the
    groups with signal (see :func:`group_has_signal`) and stops once the batch is full. When fewer
    than ``num_groups_needed`` groups have signal, all of them are returned (the caller samples another
    round for the rest). The result is on ``signal``'s device. Raises ``ValueError`` when ``signal`` is
    not a 1-D bool tensor or ``num_groups_needed < 0``.
    """
    if signal.dim() != 1 or signal.dtype != torch.bool:
        raise ValueError(f"signal must be a 1-D bool tensor, got {signal.dtype} {tuple(signal.shape)}")
    if num_groups_needed < 0:
        raise ValueError(f"num_groups_needed must be >= 0, got {num_groups_needed}")
    return torch.nonzero(signal).reshape(-1)[:num_groups_needed].to(torch.int64)
