"""ADAPOCallback — adapt the upper clip bound ε_high toward a target entropy.

Petrenko et al. 2026; docs/design.md §7.4.3.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from lit_entropy.callbacks.base import Dose, EntropyController, check_delta, config_error, step_toward
from lit_entropy.objectives.losses import LOSSES
from lit_entropy.rollout.batch import RolloutBatch


class ADAPOCallback(EntropyController):
    """Adaptive asymmetric clipping: nudge ε_high by ±δ each iteration toward a target entropy H*.

    Law (once per RL iteration, H = ``rollout/entropy`` of the current batch)::

        ε_high ← clip(ε_high + δ·sign(H* − H), ε_min, ε_max)

    Entropy below target widens the upper clip (low-probability tokens may rise more, entropy goes up);
    entropy above target narrows it; ``H == H*`` leaves it unchanged. ε_low is never touched.

    Paper: Petrenko et al. 2026, "Entropy-Preserving Reinforcement Learning" (ADAPO; arXiv 2603.11682).
    The paper starts from ε_high = 0.28 with ε_low = 0.2 and, by default, targets the first iteration's
    entropy. It does not print the step δ or the range, so ``delta=0.01`` and ``[eps_min, eps_max] =
    [0.2, 0.4]`` are OUR choices.

    Timing: the knob is adapted *before* it is used — this batch's entropy sets the ε_high used for this
    batch's update (``on_rollout_batch`` runs after the pre-update pass and before the update). With
    ``target="first"`` the first iteration measures H == H*, so its update uses ``eps_high_init``.

    Refused at fit start with ``algo.loss=gspo`` (one sequence ratio with its own ε ≈ 4e-4) and
    ``algo.selection=kl_cov`` (unclipped loss): neither uses ε_high as a token clip.

    Args:
        target: ``"first"``, a fixed entropy in nats, or a schedule mapping (see
            :class:`~lit_entropy.callbacks.base.EntropyController`).
        eps_high_init: starting ε_high; ``None`` takes the module's ``eps_high`` at fit start.
        delta: step per iteration (> 0).
        eps_min / eps_max: clamp range of ε_high.
        **common: ``progress``, ``clamp_patience`` (see :class:`~lit_entropy.callbacks.base.EntropyController`).
    """

    knobs = ("eps_high",)
    methods = {"adapo": Dose("clipfrac_high", "fraction of tokens at the upper clip ε_high (train/clipfrac_high)")}
    refused_losses = tuple(name for name, loss in LOSSES.items() if not loss.ppo_clip and not loss.per_sequence)
    """The losses that replace the clip (CISPO, SAPO, DPPO) read eps_high another way, or not at all."""
    refusal = "drives eps_high as PPO's token clip, but algo.loss={loss} (algo={algo}) replaces that clip: pick one"

    def __init__(
        self,
        target: Any = "first",
        eps_high_init: float | None = 0.28,
        delta: float = 0.01,
        eps_min: float = 0.2,
        eps_max: float = 0.4,
        **common: Any,
    ) -> None:
        super().__init__(target=target, **common)
        self.delta = check_delta(delta)
        if not 0 <= eps_min <= eps_max:
            raise config_error("eps_min", f"need 0 <= eps_min <= eps_max, got eps_min={eps_min}, eps_max={eps_max}")
        self.eps_min = float(eps_min)
        self.eps_max = float(eps_max)
        self.eps_high: float | None = None
        if eps_high_init is not None:
            self.eps_high = self._check_init(eps_high_init)

    def _check_init(self, value: float) -> float:
        value = float(value)
        if not self.eps_min <= value <= self.eps_max:
            raise config_error(
                "eps_high_init", f"{value} must lie in [eps_min, eps_max] = [{self.eps_min}, {self.eps_max}]"
            )
        return value

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_fit_start(trainer, pl_module)
        algo = getattr(pl_module, "algo", None)
        if getattr(algo, "loss", "ppo") == "gspo" or getattr(algo, "selection", None) == "kl_cov":
            raise config_error(
                "",
                f"ADAPO drives the token-level clip eps_high, which algo={getattr(algo, 'name', '?')} does not use "
                "as a token clip (gspo clips one sequence ratio with its own tiny eps; kl_cov is unclipped)",
            )
        if self.eps_high is None:
            self.eps_high = self._check_init(pl_module.eps_high)
        pl_module.eps_high = self.eps_high  # a resumed run starts from the restored value

    def control(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: RolloutBatch, entropy: float, target: float
    ) -> dict[str, float]:
        if self.eps_high is None:  # on_fit_start was not called (e.g. driven by hand)
            self.eps_high = self._check_init(pl_module.eps_high)
        proposal, self.eps_high = step_toward(self.eps_high, entropy, target, self.delta, self.eps_min, self.eps_max)
        self.note_clamp(proposal != self.eps_high, "eps_high")
        pl_module.eps_high = self.eps_high
        return {"control/eps_high": self.eps_high}

    def extra_state(self) -> dict[str, Any]:
        return {"eps_high": self.eps_high}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.eps_high = state["eps_high"]
