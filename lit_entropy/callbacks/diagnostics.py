"""EntropyDiagnosticsCallback: per-iteration entropy-dynamics metrics.

Rules and names: docs/design.md §6.4, §7.5; user guide: docs/diagnostics.md.

Computed once per RL iteration in ``on_rollout_batch``, from the tensors of the pre-update pass that
the module already filled (``old_logp``, ``entropy``, ``disc_s``, ``disc_n``): no extra forward. The
callback sets ``pl_module.want_scores = True`` in ``setup`` so that pass also computes the
discriminator scores S_t, N_t. It drives no knob and changes nothing in the batch except
``batch.metrics``.

Metrics (written into ``batch.metrics``, which the module logs as per-iteration scalars):

* ``diag/cov_logp_adv``, ``diag/dH_pred``, ``diag/entropy_pos_adv``, ``diag/entropy_neg_adv``,
  ``diag/loglik_pos``, ``diag/loglik_neg`` — over the tokens the loss will see: response tokens of
  rows still kept (``batch.keep``), with the advantages the loss will use (``batch.token_advantages``
  when set, else ``batch.advantages``). Controllers that reshape these (Entrocraft, REPO) act in the
  same hook, so list this callback after the entropy controller (``callbacks/diagnostics`` after
  ``callbacks/entropy``) for the metrics to describe the post-controller batch.
* ``diag/grad_mass_{pos,neg}_{high,low}p`` — share of ``Σ|A_t|·(1 − p_t)`` in each quadrant of advantage
  sign × sampled-token probability (``p ≥ 0.5`` or below), over the same tokens.
* ``diag/entropy_high_quantile``, ``diag/entropy_low_quantile`` (mean entropy of the top-20 % / bottom-80 %
  of tokens by entropy), ``diag/disc_centered_mean``, ``diag/entropy_q10|q50|q90|q99`` and the
  ``diag/token_entropy`` histogram — over all response tokens (a property of the sampled batch, before any rejection).
* ``diag/dH_actual`` — ``rollout/entropy`` of this iteration minus that of the previous iteration.
  It is attached to (logged with) **this** iteration k: ``dH_actual[k] = H[k] − H[k−1]`` is the
  realised change caused by the update of iteration k−1, so compare it with ``dH_pred[k−1]`` (one
  row earlier). It is absent on the first iteration (no previous entropy; the module rejects NaN).
  The previous entropy is kept in ``state_dict`` so a resumed run continues the series.

``dH_pred`` is a first-order change *per unit step* of SGD on the logits; ``dH_actual`` is the change
after a whole iteration of Adam steps on the network weights, so compare signs and trends, not scales.
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy.diagnostics.entropy_dynamics import (
    DEFAULT_QUANTILES,
    cov_logp_adv,
    dh_pred,
    disc_centered_mean,
    entropy_by_sign,
    entropy_quantiles,
    mean_loglik_by_sign,
    response_values,
)
from lit_entropy.diagnostics.token_split import QUADRANTS, entropy_high_low, grad_mass_quadrants
from lit_entropy.rollout.batch import RolloutBatch
from lit_entropy.utils.log_steps import iteration_step

log = logging.getLogger(__name__)

HISTOGRAM_TAG = "diag/token_entropy"


def _quantile_name(q: float) -> str:
    """``0.1 -> diag/entropy_q10``, ``0.99 -> diag/entropy_q99``, ``0.999 -> diag/entropy_q99.9``."""
    pct = round(q * 100, 6)
    text = f"{pct:g}" if pct != int(pct) else str(int(pct))
    return f"diag/entropy_q{text}"


class EntropyDiagnosticsCallback(pl.Callback):
    """Logs ``diag/*`` entropy-dynamics metrics each iteration from the pre-update pass (no knob).

    Args:
        quantiles: entropy quantiles to log as ``diag/entropy_q<percent>``.
        histogram: add the ``diag/token_entropy`` histogram of response-token entropies to every
            logger whose ``experiment`` has ``add_histogram`` (TensorBoard), at the iteration's step
            (``trainer.current_epoch + 1``, the step of the iteration's scalars: lit_entropy/utils/log_steps.py).
        max_histogram_values: cap on the number of entropies sent to the histogram (an evenly strided
            subsample beyond it); ``None`` sends all.
    """

    knobs: tuple[str, ...] = ()

    def __init__(
        self,
        quantiles: tuple[float, ...] | list[float] = DEFAULT_QUANTILES,
        histogram: bool = True,
        max_histogram_values: int | None = 1_000_000,
    ) -> None:
        qs = tuple(float(q) for q in quantiles)
        if any(not 0.0 <= q <= 1.0 for q in qs):
            raise ValueError(f"quantiles={list(qs)} must lie in [0, 1]")
        if max_histogram_values is not None and max_histogram_values < 1:
            raise ValueError(f"max_histogram_values={max_histogram_values} must be >= 1 or null")
        self.quantiles = qs
        self.histogram = bool(histogram)
        self.max_histogram_values = max_histogram_values
        # State: the last iteration seen, its entropy, and the entropy it was compared with.
        self.last_epoch: int | None = None
        self.last_entropy: float | None = None
        self.ref_entropy: float | None = None
        self._warned_scores = False

    # ---- hooks -----------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        pl_module.want_scores = True

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        pl_module.want_scores = True  # in case the module was swapped after setup

    def on_rollout_batch(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch
    ) -> None:
        metrics = self.compute(batch)
        dh_actual = self._entropy_change(int(getattr(trainer, "current_epoch", 0)), batch)
        if dh_actual is not None:
            metrics["diag/dH_actual"] = dh_actual
        batch.metrics.update(metrics)
        if self.histogram and batch.entropy is not None:
            self._add_histogram(trainer, batch)

    # ---- computation -----------------------------------------------------------------------------
    def compute(self, batch: RolloutBatch) -> dict[str, float]:
        """The ``diag/*`` metrics of one batch (all but ``diag/dH_actual``)."""
        if batch.entropy is None or batch.old_logp is None:
            raise ValueError(
                "EntropyDiagnosticsCallback needs batch.entropy and batch.old_logp (the pre-update pass)"
            )
        adv = batch.token_advantages if batch.token_advantages is not None else batch.advantages
        if adv is None:
            raise ValueError(
                "EntropyDiagnosticsCallback needs batch.advantages (run after the advantage estimator)"
            )
        resp = batch.response_mask.bool()
        keep = batch.keep if batch.keep is not None else torch.ones(resp.shape[0], dtype=torch.bool)
        loss_mask = resp & keep.to(resp.device).bool()[:, None]

        out: dict[str, float] = {"diag/cov_logp_adv": float(cov_logp_adv(batch.old_logp, adv, loss_mask))}
        pos, neg = entropy_by_sign(batch.entropy, adv, loss_mask)
        out["diag/entropy_pos_adv"], out["diag/entropy_neg_adv"] = float(pos), float(neg)
        pos, neg = mean_loglik_by_sign(batch.old_logp, adv, loss_mask)
        out["diag/loglik_pos"], out["diag/loglik_neg"] = float(pos), float(neg)
        if batch.disc_s is not None and batch.disc_n is not None:
            out["diag/disc_centered_mean"] = float(disc_centered_mean(batch.disc_s, batch.disc_n, resp))
            out["diag/dH_pred"] = float(dh_pred(batch.disc_s, batch.disc_n, adv, loss_mask))
        elif not self._warned_scores:
            self._warned_scores = True
            log.warning(
                "EntropyDiagnosticsCallback: batch.disc_s/disc_n are not set (pl_module.want_scores is off?); "
                "diag/dH_pred and diag/disc_centered_mean are skipped"
            )
        shares = grad_mass_quadrants(adv, batch.old_logp, loss_mask)
        out.update({f"diag/grad_mass_{name}": float(v) for name, v in zip(QUADRANTS, shares.tolist(), strict=True)})
        high, low = entropy_high_low(batch.entropy, resp)
        out["diag/entropy_high_quantile"], out["diag/entropy_low_quantile"] = float(high), float(low)
        values = entropy_quantiles(batch.entropy, resp, self.quantiles)
        for q, v in zip(self.quantiles, values.tolist(), strict=True):
            out[_quantile_name(q)] = float(v)
        return out

    def _entropy_change(self, epoch: int, batch: RolloutBatch) -> float | None:
        """``H[k] − H[k−1]`` with ``H = rollout/entropy``; updates the state. ``None`` on the first iteration."""
        entropy = batch.metrics.get("rollout/entropy")
        if entropy is None:
            return None
        entropy = float(entropy)
        # A second batch for the same iteration replaces the first: compare it with the same reference.
        ref = self.ref_entropy if self.last_epoch == epoch else self.last_entropy
        self.ref_entropy, self.last_entropy, self.last_epoch = ref, entropy, epoch
        return None if ref is None else entropy - ref

    def _add_histogram(self, trainer: pl.Trainer, batch: RolloutBatch) -> None:
        loggers = getattr(trainer, "loggers", None)
        if loggers is None:
            single = getattr(trainer, "logger", None)
            loggers = [single] if single is not None else []
        targets = []
        for logger in loggers:
            add = getattr(getattr(logger, "experiment", None), "add_histogram", None)
            if callable(add):
                targets.append(add)
        if not targets:
            return
        values = response_values(batch.entropy, batch.response_mask)
        if values.numel() == 0:
            return
        cap = self.max_histogram_values
        if cap is not None and values.numel() > cap:
            values = values[torch.linspace(0, values.numel() - 1, cap).long()]
        step = iteration_step(getattr(trainer, "current_epoch", 0))
        for add in targets:
            add(HISTOGRAM_TAG, values, global_step=step)

    # ---- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "last_epoch": self.last_epoch,
            "last_entropy": self.last_entropy,
            "ref_entropy": self.ref_entropy,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_epoch = state_dict.get("last_epoch")
        self.last_entropy = state_dict.get("last_entropy")
        self.ref_entropy = state_dict.get("ref_entropy")
