"""EntrocraftCallback — keep the batch entropy inside a scheduled band (Li et al. 2026, DESIGN §7.4).

With H the pre-update batch entropy (``rollout/entropy``) and the band [h_low, h_high] at training
progress p, the direction is m = 1[H > h_high] − 1[H < h_low]. Two modes act on it:

* ``mode="paper"`` (default) — each sequence is kept with probability min(1, exp(γ·m·A_i)). Entropy too
  high (m = +1) rejects mostly negative-advantage samples, whose updates raise entropy; too low
  (m = −1) rejects mostly positive ones (the paper's premise; in the Countdown lab this lever is
  inverted, measured in docs/controllers/entrocraft.md, so the lab runs hard mode). Rejected rows leave the loss (``batch.keep``), and each
  prompt's kept rows are renormalised to the prompt's full weight (the paper's 1/|S_x|): a kept row of
  prompt x weighs G/|S_x| (``batch.row_weight``), so rejection changes which samples a prompt learns
  from, not how much the prompt counts. ``renormalise="none"`` skips the reweighting (rows are only
  dropped; the token-mean runs over the kept tokens).
* ``mode="hard"`` (reference-code parity) — the advantages are replaced: m = +1 → A = max(R, 0)
  (RAFT++), m = −1 → A = min(R − nsr_reward_offset, 0) (NSR), m = 0 → the base estimator's advantages,
  untouched. R is the raw reward (``batch.rewards``). Both ``batch.advantages`` and
  ``batch.token_advantages`` (the per-sequence value broadcast over the row) are written; no row is
  dropped, so rows whose new advantage is 0 stay in the aggregation's denominator without gradient.
  With 0/1 rewards NSR's min(R, 0) is all zeros — no update at all; reference code that uses NSR pairs
  it with rewards in {−1, +1}. ``nsr_reward_offset`` (default 0) is subtracted from R before the min:
  1 maps {0, 1} to {−1, 0} (−1 on failures, 0 on successes).

The band comes from :meth:`lit_entropy.schedules.BandSchedule.from_endpoints`: ``schedule`` is
``constant`` / ``linear`` / ``cosine`` (``band_start`` → ``band_end``), ``piecewise`` (``band_points =
[[p, h_low, h_high], ...]``) or ``callable`` (``band_low`` / ``band_high``: import paths
``"pkg.module:function"`` of ``p -> float``). Progress counts iterations (``trainer.current_epoch`` over
``max_epochs``) or samples (``progress_unit="samples"``, rows generated so far over ``total_samples``,
kept in the state), so a resumed run continues the schedule where it stopped.

Logged: ``control/direction`` (m), ``control/band_low``, ``control/band_high``,
``control/target_entropy`` (the band centre), ``control/band_error`` (distance of H outside the band,
0 inside) and ``control/entrocraft_kept_frac`` (fraction of rows this controller kept; 1 in hard mode).
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.callbacks.base import EntropyController
from lit_entropy.data.batch import RolloutBatch
from lit_entropy.objectives.entrocraft import (
    band_direction,
    group_renormalised_weights,
    hard_advantages,
    sample_keep,
)
from lit_entropy.schedules import BandSchedule, Schedule

MODES = ("paper", "hard")
RENORMALISE = ("prompt", "none")


class BandCentre(Schedule):
    """The centre (h_low + h_high)/2 of a band, as a schedule (the controller's ``target``)."""

    def __init__(self, band: BandSchedule) -> None:
        self.band = band

    def value(self, p: float) -> float:
        low, high = self.band(p)
        return 0.5 * (low + high)

    def __repr__(self) -> str:
        return f"BandCentre({self.band!r})"


class EntrocraftCallback(EntropyController):
    """Entrocraft band controller; see the module docstring and ``docs/controllers/entrocraft.md``."""

    def __init__(
        self,
        band_start: tuple[float, float] | None = (0.6, 0.7),
        band_end: tuple[float, float] | None = None,
        schedule: str = "linear",
        gamma: float = 10.0,
        mode: str = "paper",
        seed: int = 0,
        band_points: list[list[float]] | None = None,
        band_low: Any = None,
        band_high: Any = None,
        nsr_reward_offset: float = 0.0,
        progress_unit: str = "iterations",
        total_samples: int | None = None,
        renormalise: str = "prompt",
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"callbacks.entropy.mode={mode!r}; choose one of {MODES}")
        if not (gamma > 0 and math.isfinite(gamma)):
            raise ValueError(f"callbacks.entropy.gamma={gamma} must be finite and > 0")
        if renormalise not in RENORMALISE:
            raise ValueError(f"callbacks.entropy.renormalise={renormalise!r}; choose one of {RENORMALISE}")
        nsr_reward_offset = float(nsr_reward_offset)
        if not math.isfinite(nsr_reward_offset):
            raise ValueError(f"callbacks.entropy.nsr_reward_offset={nsr_reward_offset} must be finite")
        kind = schedule.strip().lower()
        if kind in ("constant", "linear", "cosine"):
            if band_start is None:
                raise ValueError(f"callbacks.entropy.schedule={schedule!r} needs band_start=[h_low, h_high]")
            band_start = tuple(float(x) for x in band_start)
            band_end = tuple(float(x) for x in band_end) if band_end is not None else band_start
            if len(band_start) != 2 or len(band_end) != 2:
                raise ValueError("callbacks.entropy.band_start / band_end must be [h_low, h_high] pairs")
        self.band = BandSchedule.from_endpoints(
            start=band_start, end=band_end, kind=kind, points=band_points, low=band_low, high=band_high
        )
        super().__init__(target=BandCentre(self.band), progress_unit=progress_unit, total_samples=total_samples)
        if progress_unit == "samples" and not (total_samples and total_samples > 0):
            raise ValueError("callbacks.entropy.progress_unit=samples needs total_samples > 0")
        self.gamma = float(gamma)
        self.mode = mode
        self.seed = seed
        self.nsr_reward_offset = nsr_reward_offset
        self.renormalise = renormalise
        if mode == "paper":
            self.knobs = ("keep", "row_weight") if renormalise == "prompt" else ("keep",)
        else:
            self.knobs = ("token_advantages",)
        self.generator = torch.Generator().manual_seed(seed)

    # ---- EntropyController ---------------------------------------------------------------------
    def target_value(self, trainer: pl.Trainer, entropy: float) -> float:
        """The band centre at the current progress."""
        low, high = self.band(self.progress(trainer))
        return 0.5 * (low + high)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Fail early when the band's high edge is above log(vocab_size), the most any policy can reach."""
        vocab = getattr(getattr(getattr(pl_module, "model", None), "config", None), "vocab_size", None)
        if not vocab:
            return
        high = self.band.max_high()
        ceiling = math.log(vocab)
        if high > ceiling:
            raise ValueError(
                f"Entrocraft band reaches {high:.3f} nats, above log(vocab_size={vocab}) = {ceiling:.3f} — "
                "unreachable target"
            )

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        low, high = self.band(self.progress(trainer))
        m = band_direction(entropy, low, high)
        if batch.advantages is None:
            raise ValueError("Entrocraft needs batch.advantages (run the advantage estimator first)")
        if self.mode == "paper":
            keep = sample_keep(batch.advantages, m, self.gamma, self.generator)
            batch.keep = batch.keep & keep
            if self.renormalise == "prompt":
                batch.row_weight = group_renormalised_weights(batch.keep, batch.group_size)
            kept_frac = float(keep.float().mean()) if keep.numel() else 1.0
        else:
            if m != 0:
                adv = hard_advantages(batch.rewards, batch.advantages, m, self.nsr_reward_offset)
                batch.advantages = adv
                batch.token_advantages = adv[:, None].expand_as(batch.input_ids).clone()
            kept_frac = 1.0
        return {
            "control/band_low": low,
            "control/band_high": high,
            "control/direction": float(m),
            "control/band_error": max(low - entropy, 0.0, entropy - high),
            "control/entrocraft_kept_frac": kept_frac,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Checkpoints written before Entrocraft moved onto EntropyController hold only the generator and
        # the last metrics; their progress was iteration-based, so the base defaults are exact for them.
        defaults = {"first_entropy": None, "samples_seen": 0, "clamp_run": 0, "clamp_warned": False}
        super().load_state_dict({**defaults, **state_dict})

    def extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
