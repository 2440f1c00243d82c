"""The ``correction`` group: which sampler/trainer mismatch correction a run applies, and its application
to one rollout batch (docs/correction.md).

:func:`correct_rollout` runs once per rollout, after the pre-update pass and the advantages and before the
``on_rollout_batch`` hooks (so controllers see the corrected batch). It returns the detached per-token weight
the update multiplies the surrogate by, the tokens that stay in the loss, and the ``rollout_corr/*``
diagnostics (computed whatever the correction, from the trainer's pre-update log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lit_entropy.objectives import correction as corr
from lit_entropy.objectives import losses


@dataclass
class CorrectionConfig:
    """The ``correction`` group. With the defaults nothing is corrected (only the diagnostics are logged)."""

    name: str = "none"
    """The preset's name (for logs)."""
    level: str | None = None
    """Importance weight ``w = π_old/π_sampler`` per ``token``, per ``sequence`` (product over the response) or
    ``geometric`` (geometric mean over the response); null applies no weight."""
    mode: str = "truncate"
    """With a ``level``: ``truncate`` (TIS: ``w ← min(w, threshold)``) or ``mask`` (MIS/IcePop: tokens — or
    whole sequences, at sequence levels — whose weight is outside ``[threshold_low, threshold]`` leave the loss;
    the others keep their weight)."""
    threshold: float = 2.0
    """C: the truncation cap, or the upper bound of the mask band."""
    threshold_low: float = 0.0
    """The lower bound of the mask band (``mode=mask`` only); 0 means none."""
    reject: str | None = None
    """Sequence rejection on a per-token statistic: ``k1_mean``, ``k1_max`` (|−log w|) or ``k3_mean``,
    ``k3_max`` (``w − 1 − log w``); a row whose statistic exceeds ``reject_threshold`` leaves the loss."""
    reject_threshold: float | None = None
    """τ for ``reject`` (nats for k1, a KL estimate for k3); required with ``reject``."""
    veto: float | None = None
    """Per-token veto: a row with any token whose weight ``w < veto`` (e.g. 1e-4) leaves the loss."""
    opsm_delta: float | None = None
    """Off-policy sequence masking (DeepSeek-V3.2): a row with ``A < 0`` whose mean per-token
    ``log π_sampler − log π_old`` exceeds δ leaves the loss."""
    batch_normalize: bool = False
    """Divide the weights by their mean over the tokens that stay in the loss (mean 1)."""
    bias_corrected_kl: bool = False
    """Multiply the per-token KL-to-reference penalty by ``π_θ/π_old`` (TRL ``use_bias_correction_kl``)."""
    bypass: bool = False
    """The sampler's log-probs serve as ``old_logp``: the PPO ratio is ``π_θ/π_sampler`` and corrects the
    mismatch itself. The pre-update pass still runs (entropy, scores, the diagnostics and the rejection rules
    need it). No ``level`` with it: the weights would all be 1."""

    def __post_init__(self) -> None:
        if self.level is not None and self.level not in corr.LEVELS:
            raise ValueError(f"correction.level={self.level!r} must be null or one of {corr.LEVELS}")
        if self.mode not in corr.MODES:
            raise ValueError(f"correction.mode={self.mode!r} must be one of {corr.MODES}")
        if not self.threshold > 0:
            raise ValueError(f"correction.threshold={self.threshold} must be > 0")
        if not 0 <= self.threshold_low < self.threshold:
            raise ValueError(f"correction.threshold_low={self.threshold_low} must be in [0, correction.threshold="
                             f"{self.threshold})")
        if self.threshold_low > 0 and self.mode != "mask":
            raise ValueError("correction.threshold_low is the mask band's lower bound: it needs correction.mode=mask")
        if self.reject is not None and self.reject not in corr.REJECT_STATS:
            raise ValueError(f"correction.reject={self.reject!r} must be null or one of {corr.REJECT_STATS}")
        if (self.reject is None) != (self.reject_threshold is None):
            raise ValueError("correction.reject and correction.reject_threshold go together: set both or neither")
        if self.reject_threshold is not None and not self.reject_threshold > 0:
            raise ValueError(f"correction.reject_threshold={self.reject_threshold} must be > 0")
        if self.veto is not None and not 0 < self.veto < 1:
            raise ValueError(f"correction.veto={self.veto} must be in (0, 1) (a weight far below 1, e.g. 1e-4)")
        if self.opsm_delta is not None and not self.opsm_delta >= 0:
            raise ValueError(f"correction.opsm_delta={self.opsm_delta} must be >= 0")
        if self.batch_normalize and self.level is None:
            raise ValueError("correction.batch_normalize needs weights: set correction.level")
        if self.bypass and self.level is not None:
            raise ValueError(f"correction.bypass=true uses the sampler's log-probs as old_logp, so every weight "
                             f"π_old/π_sampler is 1: drop correction.level={self.level!r}")



def masks(cfg: CorrectionConfig) -> bool:
    """A rule that takes tokens or sequences out of the loss is on. (A function, not a property: Hydra hands
    the module the config as a structured DictConfig, which has the fields but not the methods.)"""
    return ((cfg.level is not None and cfg.mode == "mask") or cfg.reject is not None
            or cfg.veto is not None or cfg.opsm_delta is not None)


def corrects(cfg: CorrectionConfig | None) -> bool:
    """Some rule acts on the sampler/trainer gap: weights, a mask or rejection, or bypass."""
    return cfg is not None and (cfg.level is not None or cfg.bypass or masks(cfg))


def staleness_advice(max_staleness: int, cfg: CorrectionConfig | None) -> str | None:
    """The start-up warning for ``rollout.max_staleness`` >= 1 with a correction the lab's measurement found too
    weak (docs/overlap.md): none at any lag, or weights that only truncate (TIS) at a lag of 2 or more. None when
    the setting is one the measurement supports."""
    if not max_staleness:
        return None
    if not corrects(cfg):
        return (f"rollout.max_staleness={max_staleness} with no correction: on the lab a lag of 1-2 updates without "
                "one collapsed accuracy or stopped the run on its mismatch in every seed, while correction=mis "
                "stayed within 0.03 of the synchronous accuracy up to staleness 3 (correction=tis at staleness 1 "
                "only; docs/overlap.md)")
    if max_staleness >= 2 and cfg.level is not None and cfg.mode == "truncate" and not masks(cfg):
        return (f"rollout.max_staleness={max_staleness} with truncated weights only (correction=tis): on the lab "
                "they lost 0.07 accuracy at staleness 2 and two of three seeds collapsed at staleness 3, while "
                "correction=mis (which also drops tokens whose weight is below 0.5) held (docs/overlap.md)")
    return None


def check_with_algo(cfg: CorrectionConfig, algo: object) -> None:
    """Combinations of the ``correction`` and ``algo`` groups that cannot work, named at start-up."""
    if cfg.bias_corrected_kl and not getattr(algo, "kl_coef", 0) > 0:
        raise ValueError("correction.bias_corrected_kl corrects the KL-to-reference penalty, which is off: "
                         "set algo.kl_coef > 0 or drop it")
    loss = losses.LOSSES.get(getattr(algo, "loss", None))
    if loss is not None and loss.sequence_ratio and cfg.level == "token" and cfg.mode == "mask":
        raise ValueError(f"correction.level=token with mode=mask takes single tokens out of the loss, but algo.loss="
                         f"{loss.name} weighs each row by the ratio of its whole sampled sequence, which would become "
                         "the ratio of the tokens left: use a sequence-level correction (correction.level=sequence "
                         "or geometric) or truncated weights (mode=truncate) (docs/design.md §7.2)")


@dataclass
class Correction:
    """What :func:`correct_rollout` decided for one rollout batch."""

    weight: Tensor | None
    """[B, L] fp32 detached weight for the surrogate (0 on tokens that left the loss); None = no weights."""
    keep: Tensor | None
    """[B, L] bool response tokens that stay in the loss; None = all of them."""
    metrics: dict[str, float]
    """``rollout_corr/*`` scalars."""


def correct_rollout(cfg: CorrectionConfig, old_logp: Tensor, sampler_logp: Tensor, response_mask: Tensor,
                    advantages: Tensor) -> Correction:
    """Weights, kept tokens and diagnostics of one rollout batch ([B, L] log-probs, [B] advantages).

    Order: the weight rule (truncate, or mask by token or by sequence), then the sequence rules (rejection,
    veto, OPSM), then batch normalisation over the kept tokens. ``old_logp`` is the trainer's pre-update pass
    (also under ``bypass``: the rules measure the true mismatch).
    """
    mask = response_mask.bool()
    log_w = corr.log_weights(old_logp, sampler_logp, mask)
    keep = mask.clone()
    weight = None
    truncated = torch.zeros_like(mask)
    if cfg.level is not None:
        lw = corr.level_log_weights(log_w, mask, cfg.level)
        if cfg.mode == "truncate":
            weight, truncated = corr.truncated_weights(lw, cfg.threshold)
            truncated = truncated & mask
        else:
            weight, inside = corr.masked_weights(lw, cfg.threshold_low, cfg.threshold)
            keep &= inside
    rejected = torch.zeros(mask.shape[0], dtype=torch.bool)
    seq_rules = {}
    if cfg.reject is not None:
        seq_rules["rejected_k"] = corr.reject_sequences(log_w, mask, cfg.reject, cfg.reject_threshold)
    if cfg.veto is not None:
        seq_rules["vetoed"] = corr.veto_sequences(log_w, mask, cfg.veto)
    if cfg.opsm_delta is not None:
        seq_rules["opsm"] = corr.off_policy_sequence_mask(old_logp, sampler_logp, mask, advantages, cfg.opsm_delta)
    for rows in seq_rules.values():
        rejected |= rows
    keep &= ~rejected[:, None]
    if weight is not None:
        weight = torch.where(keep, weight, 0.0)
        if cfg.batch_normalize:
            weight = corr.batch_normalized(weight, keep)
    metrics = {f"rollout_corr/{k}": float(v) for k, v in corr.mismatch_metrics(old_logp, sampler_logp, mask).items()}
    n_tok, n_seq = max(1, int(mask.sum())), max(1, int(mask.any(-1).sum()))
    has_resp = mask.any(-1)
    metrics.update({
        "rollout_corr/frac_truncated": int(truncated.sum()) / n_tok,
        "rollout_corr/frac_masked": int((mask & ~keep).sum()) / n_tok,
        "rollout_corr/frac_rejected": int((has_resp & ~keep.any(-1)).sum()) / n_seq,
        "rollout_corr/frac_vetoed": int(seq_rules["vetoed"].sum()) / n_seq if "vetoed" in seq_rules else 0.0,
        "rollout_corr/frac_opsm": int(seq_rules["opsm"].sum()) / n_seq if "opsm" in seq_rules else 0.0,
    })
    if weight is not None:
        metrics["rollout_corr/ess_applied"] = float(corr.effective_sample_size(weight, keep))
    return Correction(weight=weight, keep=keep if masks(cfg) else None, metrics=metrics)
