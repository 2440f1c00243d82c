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


class STARECallback(EntropyController):
    """STARE (Luo et al. 2026, arXiv 2606.19236): gated surprisal-quantile reweighting of the advantages.

    Law, once per RL iteration, with H = ``rollout/entropy`` of this batch (pre-update, full-vocabulary, token
    mean) and H* the target:

    1. gate = ``H < H*`` (strict; bang-bang, no memory: the paper's code);
    2. with ``adaptive``: ``W ← clip(W + α·sign(H* − H), 1, w_max)``, ``M ← clip(M − α·sign(H* − H), m_min, 1)``;
    3. when the gate is on: ``A′_t = ω_t·A_t`` with ω of :func:`~lit_entropy.objectives.stare.stare_weights`:
       ``W`` on the ``top_frac`` highest-surprisal tokens of ``A > 0`` (``L⁺``), in variant ``c2`` also ``M`` on
       those of ``A < 0`` (``L⁻``), 1 elsewhere. Surprisal is ``−batch.old_logp``.

    This batch's entropy sets this batch's gate (as in the paper's code: the controller updates between the
    log-prob pass and the actor update). ``batch.token_advantages`` is reweighted in place of the loss's ω (the
    same product, since ω > 0); ``batch.advantages`` is left alone. Rows already rejected (``keep`` False) and
    tokens with ``A = 0`` are never picked.

    Deliberate difference: the quantile is taken over the whole batch's response tokens, as the paper writes
    ("batch-internal"), where its code ranks inside each micro-batch on each rank; here the result does not
    depend on how the update is cut into micro-batches.

    Refused with a per-sequence loss (GSPO): its one ratio per sequence has no per-token advantage to reweight.

    Args:
        target: H* in nats (the paper's 0.3), ``"first"`` or a schedule (see :class:`EntropyController`).
        variant: ``"o1"`` (``L⁺`` only, the paper's default) or ``"c2"`` (``L⁺`` and ``L⁻``).
        top_frac: P, the fraction of each sign's tokens picked (0.1).
        w, m: the weights on ``L⁺`` (1.1, > 1) and ``L⁻`` (0.9, in (0, 1]); the paper suggests 1.05 / 0.95 at 14B-32B.
        adaptive: step W and M each iteration (the paper's §4.4; off by default), with ``alpha`` (0.01),
            ``w_max`` (1.5) and ``m_min`` (0.5).
        **common: ``progress``, ``clamp_patience``.
    """

    knobs = ("token_advantages",)
    methods = {"stare": Dose("stare_reweighted_frac", "fraction of response tokens reweighted "
                             "(control/stare_reweighted_frac, 0 while the gate is shut)",
                             tag="control/stare_reweighted_frac")}
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
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        if variant not in VARIANTS:
            raise config_error("variant", f"{variant!r}; choose one of {VARIANTS}")
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
        self.gate = True

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        if batch.token_advantages is None or batch.old_logp is None:
            raise config_error("", "STARE needs batch.token_advantages and batch.old_logp (pre-update pass)")
        self.gate = entropy < target
        if self.adaptive:
            self.w, self.m = adapt_weights(self.w, self.m, entropy, target, self.alpha, self.w_max, self.m_min)
            self.note_clamp(self.w >= self.w_max, "stare_w")
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
            "control/stare_gate": float(self.gate),
            "control/stare_w": self.w,
            "control/stare_m": self.m,
            "control/stare_reweighted_frac": float(acted.sum()) / tokens if self.gate else 0.0,
            # the cut: the least surprising token of L+ (the code's stand-in for the paper's critical surprisal)
            "control/stare_surprisal_cut": float(surprisal[l_plus].min()) if bool(l_plus.any()) else 0.0,
        }

    def extra_state(self) -> dict[str, Any]:
        return {"w": self.w, "m": self.m, "gate": self.gate}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.w, self.m, self.gate = float(state["w"]), float(state["m"]), bool(state["gate"])
