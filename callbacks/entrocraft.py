"""EntrocraftCallback — keep the batch entropy inside a scheduled band (Li et al. 2026, DESIGN §7.4).

Paper mode: with H the pre-update batch entropy (``rollout/entropy``) and the band [h_low, h_high] at
training progress p, m = 1[H > h_high] − 1[H < h_low]; each sequence is kept with probability
min(1, exp(γ·m·A_i)). Entropy too high (m = +1) rejects mostly negative-advantage samples, whose
updates raise entropy; too low (m = −1) rejects mostly positive ones. Rejected rows leave the loss, and
the token-mean aggregation renormalises over the kept rows (the paper's 1/|S_x|).
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.data.batch import RolloutBatch
from lit_entropy.objectives.entrocraft import band_direction, sample_keep
from lit_entropy.schedules import BandSchedule, progress


class EntrocraftCallback(pl.Callback):
    def __init__(
        self,
        band_start: tuple[float, float] = (0.6, 0.7),
        band_end: tuple[float, float] | None = None,
        schedule: str = "linear",
        gamma: float = 10.0,
        mode: str = "paper",
        seed: int = 0,
    ) -> None:
        if mode != "paper":
            raise ValueError(f"callbacks.entropy.mode={mode!r}: only 'paper' is implemented so far")
        if not gamma > 0:
            raise ValueError(f"callbacks.entropy.gamma={gamma} must be > 0")
        band_start = tuple(float(x) for x in band_start)
        band_end = tuple(float(x) for x in band_end) if band_end is not None else band_start
        if len(band_start) != 2 or len(band_end) != 2:
            raise ValueError("callbacks.entropy.band_start / band_end must be [h_low, h_high] pairs")
        self.band = BandSchedule.from_endpoints(start=band_start, end=band_end, kind=schedule)
        self.gamma = gamma
        self.mode = mode
        self.generator = torch.Generator().manual_seed(seed)
        self.last: dict[str, float] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        vocab = getattr(getattr(pl_module.model, "config", None), "vocab_size", None)
        high = max(self.band(0.0)[1], self.band(1.0)[1])
        if vocab and high > float(torch.log(torch.tensor(float(vocab)))):
            raise ValueError(
                f"Entrocraft band reaches {high:.3f} nats, above log(vocab_size={vocab}) — unreachable target"
            )

    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch) -> None:
        p = progress(trainer.current_epoch, trainer.max_epochs or 1)
        low, high = self.band(p)
        entropy = batch.metrics["rollout/entropy"]
        m = band_direction(entropy, low, high)
        keep = sample_keep(batch.advantages, m, self.gamma, self.generator)
        batch.keep = batch.keep & keep
        self.last = {
            "control/band_low": low,
            "control/band_high": high,
            "control/target_entropy": 0.5 * (low + high),
            "control/direction": float(m),
            "control/band_error": max(low - entropy, 0.0, entropy - high),
            "control/entrocraft_kept_frac": float(keep.float().mean()),
        }
        batch.metrics.update(self.last)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "last": dict(self.last)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"])
        self.last = dict(state_dict.get("last", {}))
