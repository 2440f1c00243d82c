"""EntrocraftCallback — keep the batch entropy in a scheduled band (Li et al. 2026; docs/design.md §7.4.2).

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

The band (``band=``) is a schedule over training progress p read by
:func:`lit_entropy.callbacks.schedules.parse_schedule`, the grammar of every controller's ``target`` with
``[h_low, h_high]`` values: a fixed ``[h_low, h_high]``, ``{kind: constant|linear|cosine, start:
[h_low, h_high], end: [h_low, h_high]}``, ``{kind: piecewise, points: [[p, h_low, h_high], ...]}`` or
``{kind: "pkg.module:function"}`` (``p -> [h_low, h_high]``). It is the base class's target: the logged
``control/target_entropy`` is its centre, and at fit start its high edge is checked against
log(vocab_size). Progress (``progress=``, :class:`~lit_entropy.callbacks.base.ProgressConfig`) counts
iterations or samples, kept in the state, so a resumed run continues the band where it stopped.

Logged: ``control/direction`` (m), ``control/band_low``, ``control/band_high``,
``control/target_entropy`` (the band centre), ``control/band_error`` (distance of H outside the band,
0 inside) and ``control/entrocraft_kept_frac`` (fraction of rows this controller kept; 1 in hard mode).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.callbacks.base import CONFIG_PATH, Dose, EntropyController, config_error
from lit_entropy.callbacks.schedules import BandSchedule, parse_schedule
from lit_entropy.objectives.entrocraft import (
    band_direction,
    group_renormalised_weights,
    hard_advantages,
    sample_keep,
)
from lit_entropy.rollout.batch import RolloutBatch

MODES = ("paper", "hard")
RENORMALISE = ("prompt", "none")
class EntrocraftCallback(EntropyController):
    """Entrocraft band controller; see the module docstring and ``docs/controllers/entrocraft.md``.

    Args:
        band: the entropy band over training progress (see the module docstring).
        gamma: paper mode's rejection sharpness γ (> 0).
        mode: ``"paper"`` (rejection) or ``"hard"`` (RAFT++ / NSR advantages).
        seed: seed of the rejection draws (their generator is checkpointed).
        nsr_reward_offset: hard mode: NSR uses min(R − offset, 0).
        renormalise: paper mode: ``"prompt"`` (the paper's 1/|S_x|) or ``"none"``.
        **common: ``progress``, ``clamp_patience`` (see :class:`~lit_entropy.callbacks.base.EntropyController`).
    """

    methods = {
        "entrocraft": Dose("dropped_frac", "fraction of rows the controller dropped (1 − control/entrocraft_kept_frac)"),
        "entrocraft_hard": Dose("m_active_frac", "fraction of iterations with m ≠ 0 (advantages replaced)"),
    }

    @classmethod
    def method_of(cls, node: Mapping[str, Any]) -> str:
        return "entrocraft_hard" if node.get("mode") == "hard" else "entrocraft"

    def __init__(
        self,
        band: Any = (0.6, 0.7),
        gamma: float = 10.0,
        mode: str = "paper",
        seed: int = 0,
        nsr_reward_offset: float = 0.0,
        renormalise: str = "prompt",
        **common: Any,
    ) -> None:
        super().__init__(target=parse_schedule(band, f"{CONFIG_PATH}.band", band=True), **common)
        if mode not in MODES:
            raise config_error("mode", f"{mode!r}; choose one of {MODES}")
        if not (gamma > 0 and math.isfinite(gamma)):
            raise config_error("gamma", f"{gamma} must be finite and > 0")
        if renormalise not in RENORMALISE:
            raise config_error("renormalise", f"{renormalise!r}; choose one of {RENORMALISE}")
        nsr_reward_offset = float(nsr_reward_offset)
        if not math.isfinite(nsr_reward_offset):
            raise config_error("nsr_reward_offset", f"{nsr_reward_offset} must be finite")
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

    @property
    def band(self) -> BandSchedule:
        """The band: the base class's ``target`` (its centre is the logged target entropy)."""
        return self.target

    # ---- EntropyController ---------------------------------------------------------------------
    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        low, high = self.band(self.progress(trainer))
        m = band_direction(entropy, low, high)
        if batch.advantages is None:
            raise config_error("", "Entrocraft needs batch.advantages (run the advantage estimator first)")
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
