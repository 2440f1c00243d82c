"""AEPOCallback — hold entropy with REINFORCE rows sampled at a temperature chosen by the entropy.

Wang et al. 2025; docs/design.md §7.4.9.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.callbacks.base import Dose, EntropyController, config_error
from lit_entropy.iteration import DrawRequest
from lit_entropy.objectives import advantages as adv
from lit_entropy.rollout.batch import RolloutBatch

REINFORCE_ROWS = 60 / 2560
"""The paper's code: 60 REINFORCE rows in a batch of 512 prompts × 5 samples."""


AUTHORS_CODE = "github.com/597358816/AEPO, verl/trainer/ray_trainer.py"
"""Where the counts below are transcribed from (the ``AEPO`` branch of the training loop, lines 784-812)."""


def aepo_temperature(entropy: float, target: float, t_high: float, t_low: float) -> float:
    """AEPO's switch: ``t_high`` at or under the target, ``t_low`` above it (the code's lines 787-790)."""
    return t_high if entropy <= target else t_low


def aepo_rows(eligible: int, rows: int, above: bool) -> int:
    """How many of the eligible samples replace rows: ``min(rows, eligible)``, halved (floor) when the entropy is
    above the target. The code's lines 804-807 (``min(reinforce_sample_num, len(selected)) // 2``): the halving
    comes after the cap, so 3 eligible of 60 allowed give 1 row above the target, and a single eligible one none."""
    n = min(rows, eligible)
    return n // 2 if above else n


def aepo_prompts(prompt_frac: float, prompts: int) -> int:
    """How many of the iteration's first prompts are drawn again: ``⌊prompt_frac·P⌋`` (the code's line 791,
    ``gen_batch[:len(gen_batch) // 4]``, at ``prompt_frac`` = ¼); a 1e-9 tolerance so that e.g. 0.3·10 counts 3."""
    return math.floor(prompt_frac * prompts + 1e-9)


def eligible_rows(rewards: torch.Tensor, group_size: int, threshold: float) -> torch.Tensor:
    """The rows (in row order) whose group-normalised (GRPO) advantage exceeds ``threshold``: the
    temperature-adjusted samples that did better than their group, which AEPO trains on with advantage +1."""
    return torch.nonzero(adv.compute_advantages("grpo", rewards, group_size) > threshold).flatten()


class AEPOCallback(EntropyController):
    """AEPO (Wang et al. 2025, "Arbitrary Entropy Policy Optimization", arXiv 2510.08141; code
    github.com/597358816/AEPO): the entropy bonus replaced by REINFORCE on samples from a temperature-adjusted policy.

    Law, once per RL iteration, with H = ``rollout/entropy`` of this batch (pre-update) and H* the target
    (transcribed from the authors' code, :data:`AUTHORS_CODE`, lines 784-812):

    1. ``T′ = t_high`` (1.2) if ``H ≤ H*``, else ``T′ = t_low`` (0.8) (:func:`aepo_temperature`);
    2. G more completions are drawn at temperature T′ for the first ``⌊prompt_frac·P⌋`` (¼) of this iteration's
       P prompts (:func:`aepo_prompts`) and scored: AEPO returns the request (a
       :class:`~lit_entropy.iteration.DrawRequest`) and the iteration draws them (:func:`lit_entropy.iteration.draw`);
    3. those whose GRPO advantage within their own group exceeds ``threshold`` (0.05: better than the group) are
       eligible; ``n = min(rows, eligible)`` at or under the target, ``min(rows, eligible) // 2`` above it
       (:func:`aepo_rows`), with ``rows = max(1, round(rows_frac·B))`` (the code's 60 of 2,560); the first ``n``
       eligible in row order go through the pre-update pass (log-probs at the training temperature, not T′) and
       replace the batch's first ``n`` rows, with advantage +1 on every token, the sampler's log-probs set to the
       trainer's (they are taken as on-policy, as the paper's code does: no importance weight for T′) and no
       correction weight. ``n = 0`` replaces nothing (the code then updates on its batch unchanged).

    The update then treats them like every row (the algo's loss, clip and aggregation): the REINFORCE term
    ``∇log π(o)·1`` on samples ``o ~ π^{T′}``, which sharpens the policy at T′ < 1 and flattens it at T′ > 1.

    Deliberate differences from the paper's code (docs/design.md §7.4.9): the switch reads this batch's
    full-vocabulary entropy before the update (the code reads the previous update's sampled-token estimate
    ``−mean log π``, one step late, and starts from 0, i.e. ``T′ = t_high``); ``rows`` is a fraction of the batch,
    not the code's fixed count of 60; no eligible sample replaces no row (the code fails there: its selection
    returns None). Refused at fit start when ``⌊prompt_frac·P⌋ = 0`` (the code would draw an empty batch) and with
    ``rollout.max_staleness`` ≥ 1 (the extra draw must come from the current weights).

    Args:
        target: H* in nats (the code's default 0.5; its README's best 0.75), ``"first"`` or a schedule.
        t_high, t_low: the two temperatures (1.2, 0.8).
        prompt_frac: the fraction of the iteration's prompts drawn again at T′ (¼; rounded down).
        rows_frac: the most rows, as a fraction of the batch, that REINFORCE samples may replace at or under the
            target (60/2560); half of ``min(rows, eligible)`` above it.
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

    draws = True
    """It asks the iteration for extra samples (a :class:`~lit_entropy.iteration.DrawRequest`), which must come from
    the current weights: refused with ``rollout.max_staleness`` >= 1 (:func:`lit_entropy.iteration.draw_refusals`)."""

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        prompts = getattr(getattr(pl_module, "batch_cfg", None), "prompts_per_iter", None)
        if prompts is not None and aepo_prompts(self.prompt_frac, prompts) < 1:
            raise config_error("prompt_frac", f"{self.prompt_frac} of batch.prompts_per_iter={prompts} prompts is "
                               f"{aepo_prompts(self.prompt_frac, prompts)} (the authors' code takes "
                               "⌊prompt_frac·P⌋, ⌊P/4⌋): AEPO would draw nothing; raise prompt_frac or the prompts")

    def on_rollout_batch(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch
                         ) -> DrawRequest:
        """Steps 1-2 of the law: the temperature from this batch's entropy, and the request for the extra samples,
        which the iteration draws (:func:`lit_entropy.iteration.draw`); step 3 runs in the request's ``choose``
        (which rows) and :meth:`prepare` (their fields, after their pre-update pass), which it calls."""
        entropy, target = self.read(trainer, batch)
        temperature = aepo_temperature(entropy, target, self.t_high, self.t_low)
        prompts = aepo_prompts(self.prompt_frac, pl_module.batch_cfg.prompts_per_iter)  # of the first round's P

        def choose(extra: RolloutBatch) -> torch.Tensor:
            rows = max(1, round(self.rows_frac * batch.batch_size))
            eligible = eligible_rows(extra.rewards, extra.group_size, self.threshold)
            chosen = eligible[: aepo_rows(eligible.numel(), rows, above=entropy > target)]
            self.record(batch, target, {
                "control/aepo_temperature": temperature,
                "control/aepo_rows_frac": chosen.numel() / batch.batch_size,
                "control/aepo_eligible_frac": eligible.numel() / extra.batch_size,
                "control/aepo_reward_mean": float(extra.rewards.mean()),
            })
            return chosen

        return DrawRequest(temperature, prompts, "aepo", choose, self.prepare)

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        raise TypeError("AEPO acts through the draw request of its on_rollout_batch, not through control()")

    @staticmethod
    def prepare(batch: RolloutBatch, rows: RolloutBatch) -> None:
        """The chosen rows, after their pre-update pass, as REINFORCE rows of ``batch``: advantage +1 on every token,
        taken as on-policy (the sampler's log-probs set to the trainer's; no correction weight), and every field
        the batch carries set, so that they can take the place of its first rows."""
        resp = rows.response_mask
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
