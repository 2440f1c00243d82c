"""STARECallback — reweight the entropy-critical tokens' advantages while the entropy is under a target.

Luo et al. 2026; docs/design.md §7.4.8.
"""

from __future__ import annotations

import math
from typing import Any

import lightning.pytorch as pl

from lit_entropy.callbacks.base import Dose, EntropyController, config_error
from lit_entropy.objectives.losses import LOSSES
from lit_entropy.objectives.stare import VARIANTS, adapt_weights, stare_weights
from lit_entropy.rollout.batch import RolloutBatch

TARGET = 0.3
"""The paper's target entropy (nats, its code's default for Qwen2.5-Math-7B): a number in the units of the model at
hand, not a fraction; give your own for another model or task."""


RANKS = ("micro_batch", "iteration")
"""Where ω is computed (:mod:`lit_entropy.objectives.stare`): ``micro_batch``, the authors' rule; ``iteration``, once
on the pre-update log-probs (this package's rule before 2026-12)."""


class STARECallback(EntropyController):
    """STARE (Luo et al. 2026, arXiv 2606.19236): gated surprisal-quantile reweighting of the advantages.

    Law, once per RL iteration, with H = ``rollout/entropy`` of this batch (pre-update, full-vocabulary, token
    mean) and H* the target:

    1. gate = ``H < H*`` (strict; bang-bang, no memory: the paper's code);
    2. with ``adaptive``: ``W ← clip(W + α·sign(H* − H), 1, w_max)``, ``M ← clip(M − α·sign(H* − H), m_min, 1)``;
    3. when the gate is on, each token's surrogate is weighted by ω: ``W`` on the ``top_frac`` highest-surprisal
       tokens of ``A > 0`` (``L⁺``), in variant ``c2`` also ``M`` on those of ``A < 0`` (``L⁻``), 1 elsewhere.

    Where step 3 happens is ``rank``:

    * ``micro_batch`` (default; the authors' code): the controller sets the module's knobs ``stare_top_frac``,
      ``stare_w`` and ``stare_m`` (1 and 1 while the gate is shut, ``stare_m`` 1 in ``o1``) and the loss ranks the
      loss tokens of every micro-batch of every optimizer step on the current policy's surprisal
      (:func:`~lit_entropy.objectives.stare.micro_batch_weights`). ω multiplies the per-token surrogate only: the
      selection rules, the loss terms (entropy bonus, KL penalty, EntroPIC) and ``batch.token_advantages`` see
      the advantages unweighted. Dose ``train/stare_reweighted_frac``, per optimizer step.
    * ``iteration``: ω once per iteration over the whole batch's kept response tokens, ranked on the pre-update
      log-probs (``batch.old_logp``), multiplied into ``batch.token_advantages``; everything that reads the
      advantages (the covariance rules, KL-Cov's term, EntroPIC) then reads them reweighted. Equal to the authors'
      rule on the first optimizer step of an iteration with one micro-batch; it does not depend on how the update
      is cut. Dose ``control/stare_reweighted_frac`` (with ``control/stare_surprisal_cut``).

    This batch's entropy sets this batch's gate (as in the paper's code: the controller updates between the
    log-prob pass and the actor update). Rows already rejected (``keep`` False) and tokens with ``A = 0`` are
    never picked.

    Refused with a per-sequence loss (GSPO): its one ratio per sequence has no per-token advantage to reweight.

    Args:
        target: H* in nats (the paper's 0.3), ``"first"`` or a schedule (see :class:`EntropyController`).
        variant: ``"o1"`` (``L⁺`` only, the paper's default) or ``"c2"`` (``L⁺`` and ``L⁻``).
        top_frac: P, the fraction of each sign's tokens picked (0.1).
        w, m: the weights on ``L⁺`` (1.1, > 1) and ``L⁻`` (0.9, in (0, 1]); the paper suggests 1.05 / 0.95 at 14B-32B.
        adaptive: step W and M each iteration (the paper's §4.4; off by default), with ``alpha`` (0.01),
            ``w_max`` (1.5) and ``m_min`` (0.5).
        rank: ``"micro_batch"`` (the authors' rule) or ``"iteration"`` (see above).
        **common: ``progress``, ``clamp_patience``.
    """

    knobs = ("stare_top_frac", "stare_w", "stare_m")
    methods = {"stare": Dose("stare_reweighted_frac", "fraction of tokens reweighted, 0 while the gate is shut "
                             "(train/stare_reweighted_frac per optimizer step; control/stare_reweighted_frac per "
                             "iteration with rank: iteration and in runs before 2026-12-05)",
                             tag="train/stare_reweighted_frac", legacy_tags=("control/stare_reweighted_frac",))}
    refused_losses = tuple(name for name, loss in LOSSES.items() if loss.per_sequence)
    refusal = "reweights per-token advantages, but algo.loss={loss} (algo={algo}) has one ratio a sequence: pick one"

    def __init__(
        self,
        target: Any = TARGET,
        variant: str = "o1",
        top_frac: float = 0.1,
        w: float = 1.1,
        m: float = 0.9,
        adaptive: bool = False,
        alpha: float = 0.01,
        w_max: float = 1.5,
        m_min: float = 0.5,
        rank: str = "micro_batch",
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        if variant not in VARIANTS:
            raise config_error("variant", f"{variant!r}; choose one of {VARIANTS}")
        if rank not in RANKS:
            raise config_error("rank", f"{rank!r}; choose one of {RANKS}")
        if not 0 < top_frac <= 1:
            raise config_error("top_frac", f"{top_frac} must be in (0, 1]")
        if not (w >= 1 and (w <= w_max or not adaptive)):
            raise config_error("w", f"{w} must be >= 1 (and <= w_max={w_max} when adaptive): W > 1 strengthens the "
                               "entropy-raising tokens")
        if not (0 < m <= 1 and (m >= m_min > 0 or not adaptive)):
            raise config_error("m", f"{m} must be in (0, 1] (and >= m_min={m_min} > 0 when adaptive)")
        if not (math.isfinite(alpha) and alpha >= 0):
            raise config_error("alpha", f"{alpha} must be a finite number >= 0")
        self.variant, self.top_frac, self.adaptive = variant, float(top_frac), bool(adaptive)
        self.alpha, self.w_max, self.m_min = float(alpha), float(w_max), float(m_min)
        self.w, self.m = float(w), float(m)
        self.rank = rank
        if rank == "iteration":
            self.knobs = ("token_advantages",)
        self.gate = True

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        self.gate = entropy < target
        if self.adaptive:
            self.w, self.m = adapt_weights(self.w, self.m, entropy, target, self.alpha, self.w_max, self.m_min)
            self.note_clamp(self.w >= self.w_max, "stare_w")
        metrics = {"control/stare_gate": float(self.gate), "control/stare_w": self.w, "control/stare_m": self.m}
        if self.rank == "micro_batch":
            pl_module.stare_top_frac = self.top_frac
            pl_module.stare_w = self.w if self.gate else 1.0
            pl_module.stare_m = self.m if self.gate and self.variant == "c2" else 1.0
            return metrics
        return {**metrics, **self._reweight_batch(batch)}

    def _reweight_batch(self, batch: RolloutBatch) -> dict[str, float]:
        """``rank: iteration``: ω over the whole batch on the pre-update log-probs, into ``batch.token_advantages``."""
        if batch.token_advantages is None or batch.old_logp is None:
            raise config_error("", "STARE needs batch.token_advantages and batch.old_logp (pre-update pass)")
        mask = batch.response_mask.bool()
        if batch.keep is not None:
            mask = mask & batch.keep.bool()[:, None]
        weights, l_plus, l_minus = stare_weights(batch.token_advantages, batch.old_logp, mask, self.top_frac,
                                                 self.w, self.m, self.variant)
        acted = l_plus | l_minus if self.variant == "c2" else l_plus
        tokens = max(1, int(mask.sum()))
        if self.gate:
            batch.token_advantages = (batch.token_advantages.float() * weights.to(batch.token_advantages.device))
        surprisal = -batch.old_logp.float()
        return {
            "control/stare_reweighted_frac": float(acted.sum()) / tokens if self.gate else 0.0,
            # the cut: the least surprising token of L+ (the code's stand-in for the paper's critical surprisal)
            "control/stare_surprisal_cut": float(surprisal[l_plus].min()) if bool(l_plus.any()) else 0.0,
        }

    def extra_state(self) -> dict[str, Any]:
        return {"w": self.w, "m": self.m, "gate": self.gate}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.w, self.m, self.gate = float(state["w"]), float(state["m"]), bool(state["gate"])
