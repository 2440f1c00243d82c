"""Small config objects for the RL objective and the optimizer (the ``algo/`` and ``optim/`` groups).

Batching (how many prompts, minibatches, micro-batches) is :class:`lit_entropy.rollout.batch.BatchConfig`."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from omegaconf import DictConfig, ListConfig

from lit_entropy.objectives import changes, losses, registry, token_shaping
from lit_entropy.objectives.advantages import ESTIMATORS as ADVANTAGE_ESTIMATORS
from lit_entropy.objectives.entropy_methods import ArcherArgs, ErcArgs, SimkoArgs
from lit_entropy.objectives.reward_transforms import REWARD_TRANSFORMS

LOSSES = tuple(losses.LOSSES)
"""Every registered policy loss (:mod:`lit_entropy.objectives.losses`)."""
PPO_CLIP_LOSSES = tuple(name for name, loss in losses.LOSSES.items() if loss.ppo_clip)
"""The losses built on PPO's per-token ratio clip (what dual_clip, archer, simko and the clip rules change)."""


@dataclass
class AlgoConfig:
    """Advantage estimator, policy loss and the shape of the update."""

    name: str = "grpo"
    """Preset name (for run names and logs)."""
    advantage: str = "grpo"
    """Advantage estimator: grpo, dr_grpo, rloo, reinforce_pp, w_reinforce, qae, passk, maxrl, grpo_batch, signed
    (docs/design.md §7.1)."""
    advantage_args: dict[str, Any] = field(default_factory=dict)
    """Extra estimator arguments, e.g. ``{lam: 0.1}`` for w_reinforce, ``{quantile_k: 0.4}`` for qae,
    ``{k: 4}`` for passk."""
    token_shaping: str | None = None
    """Per-token shaping of the advantages from the pre-update entropy: entropy_adv, gtpo, grpo_s
    (:mod:`lit_entropy.objectives.token_shaping`), or null. gtpo and grpo_s replace the estimator."""
    token_shaping_args: dict[str, Any] = field(default_factory=dict)
    """Arguments of the shaping rule (e.g. ``{alpha: 0.4, kappa: 2}`` for entropy_adv)."""
    reward_transform: str | None = None
    """``unlikeliness`` (He et al. 2025): rank penalty on likely samples before the estimator."""
    beta_rank: float = 0.25
    """Unlikeliness rank penalty."""
    loss: str = "ppo"
    """``ppo``: per-token clipped ratio; ``gspo``: one clipped ratio per sequence (Zheng et al. 2025);
    ``gppo``: PPO's value with a gradient kept on clipped tokens (GPPO / CE-GPPO, docs/objectives.md);
    ``cispo``, ``sapo``, ``dppo_tv``, ``dppo_kl``: losses that replace the clip
    (:mod:`lit_entropy.objectives.losses.trust_region`)."""
    loss_args: dict[str, Any] = field(default_factory=dict)
    """Arguments of the loss beyond the clip knobs: ``{tau_pos, tau_neg}`` for sapo, ``{ratio_cap}`` for dppo_*."""
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped at ``1 - eps_low`` (initial value of the knob)."""
    eps_high: float = 0.2
    """Upper clip range: ``1 + eps_high`` (0.28 is DAPO's clip-higher; initial value of the knob)."""
    gppo_beta_low: float = 1.0
    """``loss=gppo``: gradient scale β₁ kept on tokens clipped at ``1 − eps_low`` (A < 0); initial value of the knob."""
    gppo_beta_high: float = 1.0
    """``loss=gppo``: gradient scale β₂ kept on tokens clipped at ``1 + eps_high`` (A > 0); initial value of the knob."""
    dual_clip: float | None = None
    """Dual-clip constant c for negative advantages (None = off; 3 is the usual value)."""
    loss_agg: str = "token-mean"
    """token-mean, seq-mean-token-mean, seq-mean-token-sum or seq-mean-token-sum-norm (global counts)."""
    loss_norm_constant: float | None = None
    """The fixed divisor of ``seq-mean-token-sum-norm`` (e.g. the maximum response length)."""
    selection: str | None = None
    """Token selection rule: clip_cov, kl_cov, clip_b, clip_v, forking (docs/design.md §7.3; any rule of
    :data:`lit_entropy.objectives.registry.SELECTION_RULES`), or null."""
    selection_args: dict[str, Any] = field(default_factory=dict)
    """Arguments of the rule (e.g. ``{rho: 2e-4}`` for clip_cov, ``{k: 2e-3, beta: 1}`` for kl_cov)."""
    entropy_coef: float = 0.0
    """Initial entropy-bonus coefficient (knob); 0 = off."""
    kl_coef: float = 0.0
    """Initial KL-to-reference coefficient (knob); 0 = off and no reference model is loaded."""
    term_coefs: dict[str, float] = field(default_factory=dict)
    """Initial coefficients of registered loss terms that have no key of their own (a new term's knob,
    e.g. ``{my_coef: 0.01}``); a knob left out starts at 0, off until a controller sets it."""
    kl_kind: str = "k3"
    """KL estimator: k1, k2 or k3 (Schulman 2020)."""
    kl_clamp: float | None = None
    """Clamp each token's KL estimate to [−kl_clamp, kl_clamp] (None = off). k3's gradient,
    1 − π_ref/π_θ, grows like exp(log-ratio) where the policy has moved far below the reference; a
    clamp of 10 (verl's ``low_var_kl``) bounds it at about 12.5 and drops such tokens from the penalty."""
    erc: ErcArgs | None = None
    """Entropy ratio clipping ``{low, high}`` (None = off): tokens whose current/old entropy ratio leaves
    (1 − low, 1 + high) lose their gradient."""
    archer: ArcherArgs | None = None
    """Archer's dual-token constraints ``{quantile, eps, kl_high}`` (None = off)."""
    simko: SimkoArgs | None = None
    """SimKO ``{k, alpha, lam, quantile}`` (None = off): top-K boost / top-1 penalty on high-entropy tokens."""
    surrogate_changes: dict[str, Any] = field(default_factory=dict)
    """Settings of registered per-token surrogate changes that have no key of their own
    (:mod:`lit_entropy.objectives.changes`), by name: ``{my_change: {...}}``; a change left out is off."""

    def __post_init__(self) -> None:
        self.advantage_args = dict(self.advantage_args or {})
        self.token_shaping_args = dict(self.token_shaping_args or {})
        self.selection_args = dict(self.selection_args or {})
        self.loss_args = dict(self.loss_args or {})
        self.term_coefs = dict(self.term_coefs or {})
        self._parse_surrogate_changes()
        self._check_choices()
        self._check_combinations()
        if self.advantage not in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"algo.advantage={self.advantage!r}; choose one of {tuple(ADVANTAGE_ESTIMATORS)}")
        if self.loss_agg not in registry.LOSS_AGGREGATIONS:
            raise ValueError(f"algo.loss_agg={self.loss_agg!r}; choose one of {registry.LOSS_AGGREGATIONS}")
        if not 0 <= self.eps_low < 1:
            raise ValueError(f"algo.eps_low={self.eps_low} must be in [0, 1)")
        if not self.eps_high >= 0:
            raise ValueError(f"algo.eps_high={self.eps_high} must be >= 0")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"algo.dual_clip={self.dual_clip} must be > 1 (or null)")
        for name in ("entropy_coef", "kl_coef", "beta_rank", "gppo_beta_low", "gppo_beta_high"):
            if getattr(self, name) < 0:
                raise ValueError(f"algo.{name}={getattr(self, name)} must be >= 0")
        if self.kl_clamp is not None and not self.kl_clamp > 0:
            raise ValueError(f"algo.kl_clamp={self.kl_clamp} must be > 0 (or null for no clamp)")
        own_key = [k for k in self.term_coefs if k not in registry.TERM_KNOBS or hasattr(self, k)]
        if own_key:
            others = [k for k in registry.TERM_KNOBS if not hasattr(self, k)]
            raise ValueError(f"algo.term_coefs {own_key}: not a loss term's coefficient without a key of its "
                             f"own (set algo.<knob> for those); it takes {others}")
        if not all(math.isfinite(v) for v in self.term_coefs.values()):
            raise ValueError(f"algo.term_coefs={self.term_coefs} must be finite numbers")

    def _parse_surrogate_changes(self) -> None:
        """Each registered change's settings as its dataclass: ``algo.<name>`` for the changes with a key of their
        own (archer, simko, erc), ``algo.surrogate_changes.<name>`` for the others."""
        self.surrogate_changes = dict(self.surrogate_changes or {})
        unknown = [k for k in self.surrogate_changes if k not in changes.CHANGES or hasattr(self, k)]
        if unknown:
            others = [k for k in changes.CHANGES if not hasattr(self, k)]
            raise ValueError(f"algo.surrogate_changes {unknown}: not a registered surrogate change without a key of "
                             f"its own (set algo.<name> for those); it takes {others}")
        for name, change in changes.CHANGES.items():
            if hasattr(self, name):
                setattr(self, name, change.parse(getattr(self, name)))
            elif name in self.surrogate_changes:
                self.surrogate_changes[name] = change.parse(self.surrogate_changes[name])

    def _check_choices(self) -> None:
        for name, value, allowed in (
            ("loss", self.loss, LOSSES),
            ("kl_kind", self.kl_kind, registry.KL_KINDS),
            ("reward_transform", self.reward_transform, (None, *REWARD_TRANSFORMS)),
            ("selection", self.selection, (None, *registry.SELECTION_RULES)),
        ):
            if value not in allowed:
                raise ValueError(f"algo.{name}={value!r}; choose one of {allowed}")
        registry.check_selection_args(self.selection, self.selection_args)
        losses.LOSSES[self.loss].check_args(self.loss_args)
        token_shaping.check_args(self.token_shaping, self.token_shaping_args)
        k, q = self.advantage_args.get("k"), self.advantage_args.get("quantile_k")
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
            raise ValueError(f"algo.advantage_args.k={k!r} must be an integer >= 1 (and <= batch.group_size)")
        if q is not None and not 0 < q < 1:
            raise ValueError(f"algo.advantage_args.quantile_k={q} must be in (0, 1)")

    def _check_combinations(self) -> None:
        """Combinations that cannot work fail here, at start-up, naming both sides."""
        rule = registry.SELECTION_RULES.get(self.selection) if self.selection is not None else None
        if token_shaping.replaces_estimator(self.token_shaping) and self.advantage != "grpo":
            raise ValueError(f"algo.token_shaping={self.token_shaping} computes the advantages itself; "
                             f"algo.advantage={self.advantage} would be ignored: leave it at grpo")
        loss = losses.LOSSES[self.loss]
        if loss.per_sequence and rule is not None and rule.per_token_ratios:
            raise ValueError(
                f"algo.loss={self.loss} uses one ratio per sequence; algo.selection={self.selection} acts on "
                "per-token ratios and covariances: pick one"
            )
        if not loss.ppo_clip and not loss.per_sequence and rule is not None and rule.per_token_ratios:
            raise ValueError(
                f"algo.loss={self.loss} replaces PPO's clip; algo.selection={self.selection} is defined on PPO's "
                "clipped ratio (it detaches or replaces PPO-clip tokens): pick one")
        if loss.sequence_ratio and rule is not None and rule.effect == "loss_mask":
            raise ValueError(
                f"algo.loss={self.loss} weighs each row by the ratio of its whole sampled sequence; "
                f"algo.selection={self.selection} takes tokens out of the loss, which would make it the ratio of the "
                "tokens left: pick one (docs/design.md §7.2)")
        replaces_ppo = rule is not None and rule.effect == "kl_selected"  # KL-Cov's loss has no clip
        no_clip = self.loss not in PPO_CLIP_LOSSES or replaces_ppo
        if self.dual_clip is not None and no_clip:
            raise ValueError(
                "algo.dual_clip applies to the per-token PPO ratio; it has no meaning with "
                f"algo.loss={self.loss} / algo.selection={self.selection}"
            )
        per_token = [change.name for change, _ in changes.active(self) if change.needs_ppo_clip]
        if per_token and no_clip:
            raise ValueError(f"algo.{per_token[0]} changes the per-token PPO surrogate; it has no meaning with "
                             f"algo.loss={self.loss} / algo.selection={self.selection}")
        if self.loss == "gppo" and replaces_ppo:
            raise ValueError(f"algo.loss=gppo changes the PPO clip; algo.selection={self.selection} replaces it")
        for change, args in changes.active(self):
            if change.check is not None:
                change.check(args, self)
        if self.loss_agg == "seq-mean-token-sum-norm" and not (self.loss_norm_constant or 0) > 0:
            raise ValueError("algo.loss_agg=seq-mean-token-sum-norm needs algo.loss_norm_constant > 0")


def unread_clip_advice(algo: AlgoConfig) -> str | None:
    """A warning when a clip knob (``eps_low``, ``eps_high``) is set away from its default and the objective never
    reads it: KL-Cov's selection rule (``effect="kl_selected"``) replaces PPO's clipped surrogate with an unclipped
    one plus its penalty, and some losses read one knob or none (``PolicyLoss.clip_knobs``: CISPO only
    ``eps_high``, SAPO and TOPR neither). So ``algo=kl_cov algo.eps_high=0.28``, meant as
    DAPO's clip-higher beside KL-Cov, changes nothing. A warning, not an error: the verdicts study's ``dapo_kl_cov``
    candidate was declared with that setting, and its runs stay reproducible from the protocol as written
    (docs/results.md, the study's slips)."""
    rule = registry.SELECTION_RULES.get(algo.selection) if algo.selection is not None else None
    if rule is not None and rule.effect == "kl_selected":
        read: tuple[str, ...] = ()
        why = (f"algo.selection={algo.selection} trains the unclipped surrogate -A*r plus its penalty on the selected "
               "tokens (Cui et al. 2025), so no token is clipped")
    else:
        read = losses.LOSSES[algo.loss].clip_knobs
        why = f"algo.loss={algo.loss} reads {' and '.join(f'algo.{k}' for k in read) if read else 'no clip knob'}"
    defaults = {f.name: f.default for f in fields(AlgoConfig)}
    changed = [f"algo.{k}={getattr(algo, k)}" for k in ("eps_low", "eps_high")
               if k not in read and getattr(algo, k) != defaults[k]]
    if not changed:
        return None
    return f"{' and '.join(changed)} {'is' if len(changed) == 1 else 'are'} not read: {why}"


@dataclass
class OptimConfig:
    """The optimizer (AdamW by default) with a linear warm-up.

    ``optimizer`` is the optimizer's class with its own arguments bound (a Hydra ``_partial_: true`` target,
    ``conf/optim/*.yaml``): the module calls ``optimizer(params, lr=lr, weight_decay=weight_decay)``, so the
    learning rate and the weight decay are ``optim.lr`` and ``optim.weight_decay`` whatever the optimizer."""

    lr: float = 2e-4
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas (``optim=adamw`` binds them to the optimizer)."""
    eps: float = 1e-8
    """Adam's epsilon (``optim=adamw`` binds it to the optimizer). Adam divides by |g|: a gradient that is 0 in exact arithmetic (e.g. attention key
    biases) but rounding noise in fp32 moves its parameter by about ±lr; a larger eps damps that."""
    max_grad_norm: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up."""
    optimizer: Callable[..., torch.optim.Optimizer] | None = None
    """The optimizer class with its own arguments bound (``functools.partial``); None: AdamW with ``betas`` and
    ``eps``. Called with the parameters, ``lr=`` and (when it takes one) ``weight_decay=``."""

    def __post_init__(self) -> None:
        self.betas = tuple(self.betas)  # Hydra hands over a ListConfig
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"optim.lr={self.lr} must be a finite number > 0")
        if not self.eps > 0:
            raise ValueError(f"optim.eps={self.eps} must be > 0")
        if self.max_grad_norm < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.max_grad_norm, optim.weight_decay and optim.warmup_steps must be >= 0")
        if self.optimizer is None:
            self.optimizer = functools.partial(torch.optim.AdamW, betas=self.betas, eps=self.eps)
        self.optimizer = _checked_optimizer(self.optimizer, self.weight_decay)

    def build(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """:func:`build_optimizer` of this config."""
        return build_optimizer(self, params)


def build_optimizer(cfg: Any, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The optimizer of an :class:`OptimConfig` (or the DictConfig Hydra makes of one when it hands it to the
    module) over ``params``, at ``cfg.lr`` (the warm-up scheduler scales it) and ``cfg.weight_decay``."""
    kwargs: dict[str, Any] = {"lr": cfg.lr}
    if _accepts(cfg.optimizer, "weight_decay"):
        kwargs["weight_decay"] = cfg.weight_decay
    return cfg.optimizer(params, **kwargs)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    params = inspect.signature(fn).parameters
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _plain(value: Any) -> Any:
    """Hydra's containers as plain Python: lists (``betas``) as tuples, as the optimizers' defaults are."""
    if isinstance(value, ListConfig | list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, DictConfig):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _checked_optimizer(factory: Any, weight_decay: float) -> Callable[..., torch.optim.Optimizer]:
    """``factory`` with plain arguments, checked at start-up: its arguments (``optim.optimizer.*``) must be ones
    the optimizer takes, and the learning rate and weight decay come from ``optim.lr`` / ``optim.weight_decay``."""
    if not callable(factory):
        raise ValueError(f"optim.optimizer={factory!r} must be an optimizer class (a `_partial_: true` target)")
    func, bound = (factory.func, dict(factory.keywords)) if isinstance(factory, functools.partial) else (factory, {})
    for own in ("lr", "weight_decay"):
        if own in bound:
            raise ValueError(f"optim.optimizer.{own}: set optim.{own} instead (the module passes it to the optimizer)")
    if not _accepts(func, "lr"):
        raise ValueError(f"optim.optimizer={func!r} takes no `lr` argument")
    if weight_decay > 0 and not _accepts(func, "weight_decay"):
        raise ValueError(f"optim.weight_decay={weight_decay}: optim.optimizer={func!r} takes no weight_decay")
    params = inspect.signature(func).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(bound) - set(params))
        if unknown:
            raise ValueError(f"optim.optimizer.{unknown[0]} is not an argument of {getattr(func, '__name__', func)}; "
                             f"it takes {sorted(set(params) - {'params', 'lr', 'weight_decay'})}")
    return functools.partial(func, **{k: _plain(v) for k, v in bound.items()})
