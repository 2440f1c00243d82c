"""The policy objective of one minibatch, assembled from the pure pieces of this package.

Two steps, so that nothing depends on how a minibatch is split into micro-batches:

1. :func:`select_tokens` runs once on the WHOLE minibatch: the token selection rule (docs/design.md §7.3), the
   global counts that normalise the aggregation, and what the active loss terms need over the whole
   minibatch (EntroPIC's confident tokens and their count).
2. :func:`micro_batch_loss` runs per micro-batch: surrogate (PPO-clip, GSPO, KL-Cov, CISPO, SAPO or DPPO), selection,
   aggregation with the global counts, then every active loss term (EntroPIC, entropy bonus, KL
   penalty). Summing its value over the micro-batches (gradient accumulation) gives exactly the
   minibatch loss. One deliberate exception: STARE's token weights rank the tokens of each micro-batch, as
   its authors' code does (:func:`lit_entropy.objectives.stare.micro_batch_weights`).

Which rules and terms exist, and what each needs, is declared in :mod:`lit_entropy.objectives.registry`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_entropy.objectives import changes, losses, registry, stare
from lit_entropy.objectives import entropy_methods as em
from lit_entropy.objectives.losses.ppo import clip_active
from lit_entropy.objectives.policy_loss import (
    aggregate,
    global_counts,
    ratio,
)
from lit_entropy.objectives.registry import ObjectiveConfig, TermInputs
from lit_entropy.objectives.selection.kl_cov import kl_cov_loss


class Knobs(Mapping[str, Any]):
    """Knob name -> value for one optimizer step, read from the module (controllers change them between steps).

    The knobs are the clip range (``eps_low``, ``eps_high``), GPPO's ``gppo_beta_low``/``gppo_beta_high``
    (default 1), STARE's ``stare_top_frac``/``stare_w``/``stare_m`` (default 0, 1, 1: off) and each registered loss
    term's coefficient (:data:`~lit_entropy.objectives.registry.KNOBS`);
    a coefficient left out is 0 (its term is off).
    ``knobs["kl_coef"]`` and ``knobs.kl_coef`` read the same value.
    """

    def __init__(self, eps_low: float, eps_high: float, **coefs: Any) -> None:
        unknown = set(coefs) - set(registry.TERM_KNOBS) - set(registry.DEFAULT_KNOBS)
        if unknown:
            raise TypeError(f"unknown knobs {sorted(unknown)}; the knobs are {registry.KNOBS}")
        self._values = {"eps_low": eps_low, "eps_high": eps_high, **registry.DEFAULT_KNOBS,
                        **dict.fromkeys(registry.TERM_KNOBS, 0.0), **coefs}

    @classmethod
    def read(cls, owner: object) -> Knobs:
        """The current values of the attributes of ``owner`` (the module) named like the knobs."""
        return cls(**{name: getattr(owner, name) for name in registry.KNOBS})

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no knob {name!r}; the knobs are {registry.KNOBS}") from None

    def __repr__(self) -> str:
        return f"Knobs({self._values})"


@dataclass
class TokenSelection:
    loss_mask: Tensor
    """[B, L] bool: response tokens that enter the loss."""
    detach: Tensor | None = None
    """[B, L] bool: tokens whose gradient is stopped (Clip-Cov)."""
    kl_selected: Tensor | None = None
    """[B, L] bool: tokens that get KL-Cov's penalty."""
    frac: float | None = None
    """Fraction of response tokens the rule touched (``train/masked_frac_<rule>``)."""
    num_tokens: Tensor | None = None
    num_seqs: Tensor | None = None
    prepared: dict[str, Tensor] = field(default_factory=dict)
    """What the active loss terms' ``prepare`` computed over the whole minibatch ([B, L] tensors, 0-dim totals)."""

    def rows(self, rows: slice | Tensor, width: int | None = None) -> TokenSelection:
        """The selection of a micro-batch: ``rows`` (slice or index tensor), the first ``width`` columns."""
        cut = lambda t: None if t is None else t[rows][:, :width]  # noqa: E731
        prepared = {k: v if v.dim() == 0 else cut(v) for k, v in self.prepared.items()}
        return TokenSelection(cut(self.loss_mask), cut(self.detach), cut(self.kl_selected), self.frac,
                              self.num_tokens, self.num_seqs, prepared)


def select_tokens(
    algo: ObjectiveConfig,
    mb: dict[str, Tensor],
    knobs: Mapping[str, Any],
    current_logp: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> TokenSelection:
    """Apply ``algo.selection`` to the whole minibatch ``mb``, compute the global counts and what the active
    loss terms prepare over the whole minibatch."""
    mask = mb["response_mask"].bool()
    if "loss_mask" in mb:  # the mismatch correction's and the overlong filter's kept tokens
        mask = mask & mb["loss_mask"].bool()
    sel = TokenSelection(loss_mask=mask)
    if algo.selection is not None:
        rule = registry.SELECTION_RULES[algo.selection]
        inputs = {param: _rule_input(source, mb, mask, knobs, current_logp, generator)
                  for param, source in rule.inputs.items()}
        args = {k: v for k, v in algo.selection_args.items() if k not in rule.extra_args}
        chosen, frac = rule.fn(**inputs, **args)
        setattr(sel, rule.effect, chosen)
        sel.frac = float(1.0 - frac if rule.reports_kept else frac)  # report the fraction removed
    sel.num_tokens, sel.num_seqs = global_counts(sel.loss_mask)
    for change, args in changes.active(algo):  # Archer's and SimKO's entropy splits
        if change.prepare is not None:
            sel.prepared.update(change.prepare(args, mb, mask, sel.loss_mask))
    for term in registry.active_terms(knobs):
        if term.prepare is not None:
            sel.prepared.update(term.prepare(mb, sel.loss_mask))
    return sel


def _rule_input(source: str, mb: dict[str, Tensor], mask: Tensor, knobs: Mapping[str, Any],
                current_logp: Tensor | None, generator: torch.Generator | None) -> Any:
    """The :data:`~lit_entropy.objectives.registry.RULE_INPUTS` entry ``source`` for this minibatch."""
    if source in ("current_logp", "ppo_clipped") and current_logp is None:
        raise ValueError(f"the selection rule needs {source}: pass the current policy's log-probs (current_logp)")
    match source:
        case "mask":
            return mask
        case "current_logp":
            return current_logp
        case "ppo_clipped":
            low, high = clip_active(ratio(current_logp, mb["old_logp"]), mb["token_advantages"], knobs["eps_low"],
                                    knobs["eps_high"])
            return (low | high) & mask
        case "generator":
            return generator
        case _:
            return mb[source]


def micro_batch_loss(
    algo: ObjectiveConfig,
    knobs: Mapping[str, Any],
    mb: dict[str, Tensor],
    sel: TokenSelection,
    logp: Tensor,
    entropy: Tensor | None,
    topk: tuple[Tensor, Tensor] | None = None,
    kl_bias_correction: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch (rows of ``mb`` and ``sel`` already sliced) and token-sum statistics.

    ``topk`` is the micro-batch's (top-K log-probs [B, L, K] with gradient, target is top-1 [B, L]), which
    SimKO needs (:attr:`lit_entropy.policy.passes.MicroBatch.topk`). ``mb["is_weight"]`` (when present) multiplies
    the per-token surrogate: the detached mismatch weight π_old/π_sampler
    (:mod:`lit_entropy.objectives.correction`). ``kl_bias_correction``: the KL penalty's per-token estimate is
    multiplied by π_θ/π_old (TRL ``use_bias_correction_kl``)."""
    mask = sel.loss_mask
    adv, old = mb["token_advantages"], mb["old_logp"]
    active = changes.active(algo)
    logp_pg = logp  # what the surrogate sees: SimKO mixes the top-K candidates into it
    for change, args in active:
        if change.inputs is not None:
            logp_pg, adv = change.inputs(args, logp_pg, old, adv, topk, sel.prepared)
    counts = {"num_tokens": sel.num_tokens, "num_seqs": sel.num_seqs, "norm_constant": algo.loss_norm_constant}
    policy_loss = losses.LOSSES[algo.loss]
    if policy_loss.per_sequence:  # GSPO: on the plain log-probs
        loss_tok, info = _clipped(algo, knobs, logp, old, adv, mask, knobs["eps_low"], knobs["eps_high"])
    elif sel.kl_selected is not None:
        loss_tok = kl_cov_loss(logp, old, adv, sel.kl_selected, beta=algo.selection_args.get("beta", 1.0))
        none = torch.zeros_like(mask)
        info = {"clipped_low": none, "clipped_high": none}
    else:
        loss_tok, info = _clipped(algo, knobs, logp_pg, old, adv, mask, knobs["eps_low"], knobs["eps_high"])
        clipped = lambda lp, a, lo, hi: _clipped(algo, knobs, lp, old, a, mask, lo, hi)  # noqa: E731
        for change, args in active:  # Archer: the high-entropy tokens at their own clip range
            if change.surrogate is not None:
                loss_tok, info = change.surrogate(args, loss_tok, info, clipped, logp_pg, adv, sel.prepared)
    acted: dict[str, Tensor] = {}
    for change, args in active:  # ERC: tokens whose entropy moved too far lose their gradient
        if change.gradient is not None:
            loss_tok, acted[change.stat] = change.gradient(args, loss_tok, entropy, mb)
    if sel.detach is not None:  # Clip-Cov: no gradient, and no value either (train/pg_loss reports the rest)
        loss_tok = torch.where(sel.detach, torch.zeros((), device=loss_tok.device), loss_tok)
    if "row_weight" in mb:  # a rollout hook's reweighting (Entrocraft's per-prompt 1/|S_x|)
        loss_tok = loss_tok * mb["row_weight"][:, None]
    if "is_weight" in mb:  # the sampler/trainer mismatch correction (detached)
        loss_tok = loss_tok * mb["is_weight"]
    if stare.is_on(knobs):  # STARE's ω, ranked on this micro-batch's current log-probs as the authors' code does
        omega, acted["stare_acted"] = stare.micro_batch_weights(knobs, mb["token_advantages"], logp, mask)
        loss_tok = loss_tok * omega
    pg_loss = aggregate(loss_tok, mask, algo.loss_agg, **counts)
    loss = pg_loss
    inputs = TermInputs(algo, mb, mask, logp, entropy, counts, sel.prepared, kl_bias_correction)
    for term in registry.active_terms(knobs):
        missing = [registry.TERM_NEEDS[need] for need in term.needs if not inputs.has(need)]
        if missing:
            raise ValueError(f"loss term {term.name} ({term.knob}={knobs[term.knob]}) needs {', '.join(missing)}")
        loss = loss + term.fn(inputs, knobs[term.knob])
    with torch.no_grad():
        r = ratio(logp.detach(), old)
        stats = {
            "pg_loss": pg_loss.detach(),
            "clip_low": (info["clipped_low"] & mask).sum(),
            "clip_high": (info["clipped_high"] & mask).sum(),
            "ratio": torch.where(mask, r, 0.0).sum(),
            "tokens": mask.sum(),
        }
        if entropy is not None:
            stats["entropy"] = torch.where(mask, entropy.detach(), 0.0).sum()
            if "entropy" in mb:  # train/entropy_ratio: current over pre-update entropy, per token
                stats["entropy_ratio"] = torch.where(mask, em.entropy_ratio(entropy, mb["entropy"]), 0.0).sum()
        for stat, tokens in acted.items():
            stats[stat] = (mask & tokens).sum()
    if "ref_logp" in mb:  # logged whatever kl_coef is (the KL term computed it with gradient when on)
        stats["kl"] = torch.where(mask, inputs.kl_tokens.detach(), 0.0).sum()
    return loss, stats


def _clipped(algo: ObjectiveConfig, knobs: Mapping[str, Any], logp: Tensor, old: Tensor, adv: Tensor, mask: Tensor,
             eps_low: float, eps_high: float) -> tuple[Tensor, dict[str, Tensor]]:
    """The per-token surrogate of ``algo.loss`` (:mod:`lit_entropy.objectives.losses`) at the clip range
    ``(eps_low, eps_high)``."""
    return losses.LOSSES[algo.loss].surrogate(logp, old, adv, mask, eps_low, eps_high, knobs, algo.dual_clip,
                                              algo.loss_args)
