"""Small config objects for the RL objective and the optimizer (the ``algo/`` and ``optim/`` groups)."""

from __future__ import annotations

from dataclasses import dataclass

ADVANTAGE_ESTIMATORS = ("grpo", "dr_grpo")
LOSS_AGGREGATIONS = ("token-mean",)


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss and the shape of the update."""

    name: str = "grpo"
    """Preset name (for run names and logs)."""
    advantage: str = "grpo"
    """Advantage estimator: ``grpo`` (group mean and std) or ``dr_grpo`` (group mean only)."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - eps_low`` (initial value of the knob)."""
    eps_high: float = 0.2
    """Upper clip range: ``1 + eps_high`` (0.28 is DAPO's clip-higher; initial value of the knob)."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages (None = off; 3 is the usual value)."""
    loss_agg: str = "token-mean"
    """How token losses become one number: ``token-mean`` over the global minibatch."""
    entropy_coef: float = 0.0
    """Initial entropy-bonus coefficient (knob); 0 = off."""
    kl_coef: float = 0.0
    """Initial KL-to-reference coefficient (knob); 0 = off."""
    num_minibatches: int = 2
    """Optimizer steps per pass over the rollout batch."""
    ppo_epochs: int = 1
    """Passes over the rollout batch per iteration."""
    micro_batch_size: int = 64
    """Sequences per forward/backward; gradients are accumulated over a minibatch's micro-batches."""

    def __post_init__(self) -> None:
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"algo.advantage={self.advantage!r}; choose one of {ADVANTAGE_ESTIMATORS}")
        if self.loss_agg not in LOSS_AGGREGATIONS:
            raise ValueError(f"algo.loss_agg={self.loss_agg!r}; choose one of {LOSS_AGGREGATIONS}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"algo.eps_low={self.eps_low} must be in [0, 1)")
        if not self.eps_high >= 0:
            raise ValueError(f"algo.eps_high={self.eps_high} must be >= 0")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"algo.dual_clip={self.dual_clip} must be > 1 (or null)")
        for name in ("num_minibatches", "ppo_epochs", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"algo.{name}={getattr(self, name)} must be >= 1")
        for name in ("entropy_coef", "kl_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"algo.{name}={getattr(self, name)} must be >= 0")


@dataclass
class OptimConfig:
    """AdamW with a linear warm-up."""

    lr: float = 1e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # Hydra hands over a ListConfig
        if not self.lr > 0:
            raise ValueError(f"optim.lr={self.lr} must be > 0")
        if self.max_grad_norm < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.max_grad_norm, optim.weight_decay and optim.warmup_steps must be >= 0")
