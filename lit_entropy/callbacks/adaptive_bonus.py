"""AdaptiveEntropyBonusCallback — an entropy bonus whose coefficient tracks a target entropy.

Skywork-OR1 (He et al. 2025); docs/design.md §7.4.5.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lit_entropy.callbacks.base import Dose, EntropyController, check_delta, config_error, step_toward
from lit_entropy.rollout.batch import RolloutBatch


class AdaptiveEntropyBonusCallback(EntropyController):
    """Adaptive entropy bonus: a coefficient c that rises while entropy is low, applied only below target.

    Law (once per RL iteration, H = ``rollout/entropy`` of the current batch, target H*)::

        c ← clip(c + δ·sign(H* − H), 0, c_max);   entropy_coef = c·1[H ≤ H*]

    The module's loss then adds ``−entropy_coef·H̄`` (full-vocabulary entropy, with gradient). Above the
    target the bonus is switched off at once (entropy_coef = 0) while c decays by δ per iteration, so a
    later dip below target restarts from where c had got to rather than from zero.

    Paper: the adaptive entropy control of Skywork-OR1 (He et al. 2025, "Skywork Open Reasoner 1
    Technical Report", arXiv 2505.22312), in the form TRL-style trainers use. The defaults
    ``coef_init=0.0``, ``delta=5e-4``, ``coef_max=0.01`` and ``target="first"`` are OUR choices for the
    lab's scale (the report tunes its own values for long-CoT 7B/32B models): starting at 0 makes the
    controller a no-op until entropy falls below target; 20 consecutive low iterations reach c_max,
    twice the fixed ``algo=entropy_bonus`` coefficient (0.005).

    Timing: c is adapted *before* it is applied — this batch's entropy sets the coefficient used for this
    batch's update (updating c only after the step would lag the measurement by one iteration).

    Clamp note: only the upper clamp counts (c stuck at c_max with entropy still below target means the
    target is out of reach). c at 0 with entropy above target is the controller's rest state: the bonus
    cannot lower entropy and is simply off.

    Args:
        target: ``"first"``, a fixed entropy in nats, or a schedule mapping (see
            :class:`~lit_entropy.callbacks.base.EntropyController`).
        coef_init: starting c, in [0, coef_max].
        delta: step of c per iteration (> 0).
        coef_max: upper clamp of c (> 0).
        **common: ``progress``, ``clamp_patience`` (see :class:`~lit_entropy.callbacks.base.EntropyController`).
    """

    knobs = ("entropy_coef",)
    methods = {"adaptive_bonus": Dose("entropy_coef_mean", "mean entropy coefficient (control/entropy_coef)")}

    def __init__(
        self,
        target: Any = "first",
        coef_init: float = 0.0,
        delta: float = 5e-4,
        coef_max: float = 0.01,
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        self.delta = check_delta(delta)
        if not coef_max > 0:
            raise config_error("coef_max", f"{coef_max} must be > 0")
        if not 0 <= coef_init <= coef_max:
            raise config_error("coef_init", f"{coef_init} must lie in [0, coef_max={coef_max}]")
        self.coef_max = float(coef_max)
        self.coef = float(coef_init)

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        proposal, self.coef = step_toward(self.coef, entropy, target, self.delta, 0.0, self.coef_max)
        self.note_clamp(proposal > self.coef_max, "entropy_coef")
        applied = self.coef if entropy <= target else 0.0
        pl_module.entropy_coef = applied
        return {"control/entropy_coef": applied, "control/entropy_coef_state": self.coef}

    def extra_state(self) -> dict[str, Any]:
        return {"entropy_coef_state": self.coef}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.coef = state["entropy_coef_state"]
