"""AEPOCallback — hold entropy with REINFORCE rows sampled at a temperature chosen by the entropy.

Wang et al. 2025; docs/design.md §7.4.9.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy import advantages as adv
from lit_entropy.callbacks.base import Dose, EntropyController, config_error
from lit_entropy.rollout.batch import RolloutBatch

REINFORCE_ROWS = 60 / 2560
"""The paper's code: 60 REINFORCE rows in a batch of 512 prompts × 5 samples."""


def aepo_choice(entropy: float, target: float, t_high: float, t_low: float, rows: int) -> tuple[float, int]:
    """AEPO's switch: the temperature of the extra draw and how many of its rows may enter the batch. Entropy at
    or under the target: the high temperature and all ``rows``; above it: the low one and half of them."""
    return (t_high, rows) if entropy <= target else (t_low, rows // 2)


def eligible_rows(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """The rows (in row order) whose group-normalised (GRPO) advantage exceeds ``threshold``: the
    temperature-adjusted samples that did better than their group, which AEPO trains on with advantage +1."""
    return torch.nonzero(adv.compute_advantages("grpo", rewards, group_size) > threshold).flatten()


class AEPOCallback(EntropyController):
    """AEPO (Wang et al. 2025, "Arbitrary Entropy Policy Optimization", arXiv 2510.08141; code
    github.com/597358816/AEPO): the entropy bonus replaced by REINFORCE on samples from a temperature-adjusted policy.

    Law, once per RL iteration, with H = ``rollout/entropy`` of this batch (pre-update) and H* the target:

    1. ``T′ = t_high`` (1.2) and ``n = rows`` if ``H ≤ H*``, else ``T′ = t_low`` (0.8) and ``n = rows // 2``,
       where ``rows = max(1, round(rows_frac·B))`` (the code's 60 of 2,560);
    2. G more completions are drawn at temperature T′ for the first ``prompt_frac`` (¼) of this iteration's
       prompts and scored (:meth:`~lit_entropy.data.rollout_datamodule.RolloutDataModule.sample_extra`);
    3. the first ``n`` of them whose GRPO advantage within their own group exceeds ``threshold`` (0.05: better than
       the group) go through the pre-update pass (log-probs at the training temperature, not T′) and replace the
       batch's first ``n`` rows, with advantage +1 on every token, the sampler's log-probs set to the trainer's
       (they are taken as on-policy, as the paper's code does: no importance weight for T′) and no correction weight.

    The update then treats them like every row (the algo's loss, clip and aggregation): the REINFORCE term
    ``∇log π(o)·1`` on samples ``o ~ π^{T′}``, which sharpens the policy at T′ < 1 and flattens it at T′ > 1.

    Deliberate differences from the paper's code: the switch reads this batch's full-vocabulary entropy before the
    update (the code reads the previous update's sampled-token estimate ``−mean log π``, one step late, and starts
    from 0, i.e. ``T′ = t_high``); fewer eligible samples than ``n`` replace fewer rows, and none replace none (the
    code fails there). Refused with ``rollout.max_staleness`` ≥ 1 (the extra draw must come from the current weights).

    Args:
        target: H* in nats (the code's default 0.5; its README's best 0.75), ``"first"`` or a schedule.
        t_high, t_low: the two temperatures (1.2, 0.8).
        prompt_frac: the fraction of the iteration's prompts drawn again at T′ (¼).
        rows_frac: the most rows, as a fraction of the batch, that REINFORCE samples may replace (60/2560).
        threshold: the GRPO advantage a T′ sample must exceed (0.05).
        **common: ``progress``, ``clamp_patience``.
    """

    knobs = ("batch_rows",)
    """It replaces whole rows of the batch (every other controller drives a knob or one slot of the rows)."""
    methods = {"aepo": Dose("aepo_rows_frac", "fraction of the batch's rows replaced by temperature-adjusted "
                            "REINFORCE samples (control/aepo_rows_frac)", tag="control/aepo_rows_frac")}

    def __init__(
        self,
        target: Any = 0.5,
        t_high: float = 1.2,
        t_low: float = 0.8,
        prompt_frac: float = 0.25,
        rows_frac: float = REINFORCE_ROWS,
        threshold: float = 0.05,
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        if not 0 < t_low <= t_high:
            raise config_error("t_low", f"need 0 < t_low <= t_high, got t_low={t_low}, t_high={t_high}")
        if not 0 < prompt_frac <= 1:
            raise config_error("prompt_frac", f"{prompt_frac} must be in (0, 1]")
        if not 0 < rows_frac <= 1:
            raise config_error("rows_frac", f"{rows_frac} must be in (0, 1]")
        if not math.isfinite(threshold):
            raise config_error("threshold", f"{threshold} must be finite")
        self.t_high, self.t_low = float(t_high), float(t_low)
        self.prompt_frac, self.rows_frac, self.threshold = float(prompt_frac), float(rows_frac), float(threshold)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        data = getattr(trainer, "datamodule", None)
        sampling = getattr(getattr(data, "sampler", None), "sampling", None)
        if sampling is not None and sampling.max_staleness > 0:
            raise config_error("", f"AEPO draws its extra rows from the current weights, but rollout.max_staleness="
                               f"{sampling.max_staleness} samples ahead: use rollout.max_staleness=0")

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        data = trainer.datamodule
        t0 = time.perf_counter()
        rows = max(1, round(self.rows_frac * batch.batch_size))
        temperature, limit = aepo_choice(entropy, target, self.t_high, self.t_low, rows)
        times: dict[str, float] = {}
        extra = data.sample_extra(pl_module.tokenizer, trainer.current_epoch, temperature, self.prompt_frac, "aepo",
                                  times)
        eligible = eligible_rows(extra.rewards, extra.group_size, self.threshold)
        chosen = eligible[:limit]
        if chosen.numel():
            self.replace(pl_module, batch, extra.take(chosen))
        batch.metrics["time/aepo"] = time.perf_counter() - t0  # not in the returned metrics: they go into the state
        return {
            "control/aepo_temperature": temperature,
            "control/aepo_rows_frac": chosen.numel() / batch.batch_size,
            "control/aepo_eligible_frac": eligible.numel() / extra.batch_size,
            "control/aepo_reward_mean": float(extra.rewards.mean()),
        }

    @staticmethod
    def replace(pl_module: pl.LightningModule, batch: RolloutBatch, rows: RolloutBatch) -> None:
        """The pre-update pass on ``rows``, advantage +1, on-policy weights, then into the batch's first rows."""
        pl_module.pre_update_pass(rows)
        resp = rows.response_mask
        if not (torch.isfinite(rows.old_logp[resp]).all() and torch.isfinite(rows.entropy[resp]).all()):
            raise FloatingPointError("non-finite log-prob or entropy in AEPO's rows' pre-update pass")
        rows.advantages = torch.ones(rows.batch_size)
        rows.token_advantages = torch.where(resp, 1.0, 0.0)
        rows.sampler_logp = torch.where(resp, rows.old_logp, 0.0)
        rows.group_index = batch.group_index[: rows.batch_size].clone()
        if batch.is_weight is not None:
            rows.is_weight = torch.where(resp, 1.0, 0.0)
        if batch.loss_mask is not None:
            rows.loss_mask = resp.clone()
        if batch.row_weight is not None:
            rows.row_weight = torch.ones(rows.batch_size)
        if batch.version is not None:
            rows.version = torch.full((rows.batch_size,), int(batch.version.max()), dtype=batch.version.dtype)
        if batch.truncated is not None and rows.truncated is None:
            rows.truncated = torch.zeros(rows.batch_size, dtype=torch.bool)
        if batch.sampler_kept is None:
            rows.sampler_kept = None
        elif rows.sampler_kept is None:
            raise ValueError("the batch carries the sampler's kept sets but the extra draw does not")
        batch.replace_rows(rows, pad_id=pl_module.tokenizer.pad_id)
