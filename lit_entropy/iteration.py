"""One RL iteration, read top to bottom: :func:`run` is the whole algorithm up to the update (docs/design.md §3).

Lightning calls ``RolloutDataModule.train_dataloader()`` at the start of every epoch (one epoch is one iteration;
the trainer reloads its data every epoch), and that method is :func:`run`. Each step below is a call of a plain
function or of the object that owns that step's state:

====  =====================================================  ===========================================
step  what                                                   who owns it
====  =====================================================  ===========================================
0     the iteration boundary (checkpoints)                   callbacks' ``on_rollout_start``
1     weight sync into the engine                            the sampler (:mod:`lit_entropy.rollout`)
2     sample and score G completions per prompt              the DataModule and its sampler
3     pre-update pass: old log-probs, entropy, reference     the policy module (its forward; or, with
                                                             ``module.pre_update_pass=skip``, the first
                                                             minibatch's forward: :func:`skip_refusals`)
4     advantages (reward transform, estimator, shaping)      :mod:`lit_entropy.advantages`, token_shaping
5     mismatch correction, truncation mask, row filters      :mod:`lit_entropy.objectives.rollout_correction`
6     stop a run that diverged without a NaN                 :func:`check_divergence`
7     controllers and diagnostics read the batch and act     callbacks' ``on_rollout_batch``
8     the kept rows as minibatches, one optimizer step each  the DataModule
====  =====================================================  ===========================================

The update itself (token selection, micro-batch losses, clip, optimizer step) is the module's ``training_step``,
which Lightning calls once per minibatch. The module logs the batch's per-iteration metrics at the epoch's start
from the loader Lightning holds (:class:`UpdateData`): nothing is parked on another object to be picked up later.

Callbacks are the one mechanism for controllers, diagnostics and checkpoints: Lightning calls their usual hooks,
and :func:`call_rollout_hooks` calls the two that Lightning has no place for (steps 0 and 7), in callback order.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any, Protocol

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lit_entropy import advantages as adv
from lit_entropy import token_shaping
from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives.policy_loss import masked_mean
from lit_entropy.objectives.rollout_correction import CorrectionConfig, correct_rollout, corrects
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from lit_entropy.rollout.filters import apply_filters
from lit_entropy.rollout.overlap import staleness_metrics

if TYPE_CHECKING:
    from lit_entropy.data.rollout_datamodule import RolloutDataModule


class TrainablePolicy(Protocol):
    """What an iteration needs of the LightningModule (:class:`~lit_entropy.module.PolicyModule`)."""

    model: torch.nn.Module
    tokenizer: Any
    policy_path: str
    algo: AlgoConfig
    correction: CorrectionConfig
    batch_cfg: BatchConfig
    uniform_entropy_tol: float | None
    max_logp_mismatch_mean: float | None

    def pre_update_pass(self, batch: RolloutBatch) -> None:
        """Old log-probs, entropy (and the reference's log-probs, scores, top-K mass when asked for) into ``batch``."""


def run(data: RolloutDataModule, trainer: pl.Trainer, policy: TrainablePolicy, iteration: int) -> DataLoader:
    """One RL iteration up to the update; the loader serves its minibatches to ``training_step``."""
    dropped = 0
    if data.producer is not None:  # rollout.max_staleness >= 1: steps 0-2 overlap the previous update
        batch, metrics, dropped = data.overlapped_batch(trainer, policy, iteration)
    else:
        call_rollout_hooks(trainer, "on_rollout_start")  # 0. the boundary: checkpoints are written here
        data.start(policy)
        metrics = {"time/generate": 0.0, "time/score": 0.0}
        t0 = time.perf_counter()
        data.sampler.sync(policy.model, iteration)  # 1. the engine samples from the weights being trained
        metrics["time/sync"] = time.perf_counter() - t0
        batch = data.sample_batch(policy.tokenizer, iteration, metrics)  # 2. G scored completions per prompt
    prepare_update(policy, batch)  # 3.-6.
    batch.metrics = {**metrics, **batch.metrics}
    t0 = time.perf_counter()
    call_rollout_hooks(trainer, "on_rollout_batch", batch)  # 7. controllers read rollout/entropy and act
    if dropped:  # rows over the staleness bound (policy `drop`) leave the update after the hooks saw them
        batch.keep = torch.zeros_like(batch.keep)
    batch.metrics.update(staleness_metrics(batch, iteration))  # none on the synchronous path
    batch.metrics["control/kept_frac"] = float(batch.keep.float().mean())
    batch.metrics["time/prepare"] = batch.metrics.get("time/prepare", 0.0) + time.perf_counter() - t0
    return data.minibatch_loader(batch, iteration)  # 8. one optimizer step per minibatch


def prepare_update(policy: TrainablePolicy, batch: RolloutBatch) -> None:
    """Steps 3-6 on a sampled ``batch``: the pre-update pass, the advantages, the correction and the divergence
    checks, each written into ``batch`` (``rollout/entropy``, ``diag/*``, ``rollout_corr/*``, ``time/prepare``)."""
    t0 = time.perf_counter()
    policy.pre_update_pass(batch)  # 3.
    resp = batch.response_mask
    skipped = batch.entropy is None  # module.pre_update_pass=skip: measured in the first minibatch's forward
    if not (torch.isfinite(batch.old_logp[resp]).all() and (skipped or torch.isfinite(batch.entropy[resp]).all())):
        raise FloatingPointError("non-finite log-prob or entropy in the pre-update pass")
    assign_advantages(policy.algo, batch)  # 4.
    batch.metrics.update({
        "diag/zero_adv_frac": float((batch.advantages == 0).float().mean()),  # QAE's sparsity
        "time/prepare": time.perf_counter() - t0,
    })
    if not skipped:
        batch.metrics.update(first_pass_metrics(batch.entropy, batch.old_logp, batch.sampler_logp, resp))
    correct(policy.correction, policy.batch_cfg, policy.model, batch)  # 5.
    if skipped:  # old_logp is the sampler's: the weights are 1 and the mismatch 0 by construction, not measured
        batch.metrics = {k: v for k, v in batch.metrics.items() if not k.startswith("rollout_corr/")}
        return  # 6. runs in the first minibatch's step, before its optimizer step (PolicyModule.training_step)
    vocab = getattr(getattr(policy.model, "config", None), "vocab_size", None)
    check_divergence(batch.metrics, vocab, policy.uniform_entropy_tol, policy.max_logp_mismatch_mean,  # 6.
                     policy.correction, stale=batch.version is not None)


def first_pass_metrics(entropy: torch.Tensor, logp: torch.Tensor, sampler_logp: torch.Tensor,
                       mask: torch.Tensor) -> dict[str, float]:
    """``rollout/entropy`` and ``diag/logp_mismatch_mean|max`` (``|log π_sampler − log π|``) over the ``mask``
    tokens, from the first pass of the pre-update policy over them."""
    mismatch = (sampler_logp - logp).abs()[mask]
    return {
        "rollout/entropy": float(masked_mean(entropy, mask)),
        "diag/logp_mismatch_mean": float(mismatch.mean()) if mismatch.numel() else 0.0,
        "diag/logp_mismatch_max": float(mismatch.max()) if mismatch.numel() else 0.0,
    }


PRE_UPDATE_PASS = ("run", "skip")
"""``module.pre_update_pass``: ``run`` (step 3 as a no-grad pass over every row) or ``skip``."""


def skip_refusals(algo: AlgoConfig, correction: CorrectionConfig, changes: list[str], replays: bool) -> list[str]:
    """Why ``module.pre_update_pass=skip`` cannot run with these settings (empty: it can).

    Skipping is verl's bypass mode: the sampler's log-probs are the old ones (``correction=bypass``), and the
    entropy and the mismatch are measured by the first minibatch's own forward, which sees the pre-update policy.
    So everything that reads the pre-update pass's values before the update, or its entropy in the update, is
    refused: a rule or change on the pre-update entropy or scores, entropy shaping, the unlikeliness reward, the
    correction rules that measure ``π_old/π_sampler``, and the untruncated entropy of a truncated sampler.
    ``changes``: the active surrogate changes' names; ``replays``: the sampler truncates (top-p/top-k). The
    callbacks' rollout hooks are checked when the trainer is known (:func:`hook_refusals`)."""
    out = []
    if not correction.bypass:
        out.append(f"correction={correction.name} (skip uses the sampler's log-probs as the old ones: correction=bypass)")
    for key in ("reject", "veto", "opsm_delta"):
        if getattr(correction, key) is not None:
            out.append(f"correction.{key} (measures the true mismatch, which needs the pass)")
    if algo.selection is not None:
        from lit_entropy.objectives.registry import SELECTION_RULES

        read = {"entropy", "disc_s", "disc_n"} & set(SELECTION_RULES[algo.selection].inputs.values())
        if read:
            out.append(f"algo.selection={algo.selection} (reads the pre-update {', '.join(sorted(read))})")
    out += [f"algo.{name} (reads the pre-update entropy)" for name in changes]  # Archer, ERC, SimKO
    if algo.token_shaping is not None:
        out.append(f"algo.token_shaping={algo.token_shaping} (shapes on the pre-update entropy)")
    if algo.reward_transform == "unlikeliness":
        out.append("algo.reward_transform=unlikeliness (ranks on the pre-update log-probs)")
    if replays:
        out.append("rollout.top_p / rollout.top_k (the untruncated entropy, rollout/entropy_full, needs the pass)")
    return out


def hook_refusals(callbacks: list[Any]) -> list[str]:
    """The callbacks that read the batch before the update (``on_rollout_batch``: controllers, diagnostics, the
    law fit, the stop rule): with ``module.pre_update_pass=skip`` it has no entropy yet."""
    return [type(cb).__name__ for cb in callbacks if callable(getattr(cb, "on_rollout_batch", None))]


def assign_advantages(algo: AlgoConfig, batch: RolloutBatch) -> None:
    """``batch.advantages`` (one per row) and ``batch.token_advantages`` (per token): the reward transform, the
    estimator (docs/design.md §7.1), then the per-token shaping rules on the pre-update entropy (§7.9)."""
    rewards, resp = batch.rewards, batch.response_mask
    if algo.reward_transform == "unlikeliness":
        seq_logp = torch.where(resp, batch.old_logp, 0.0).sum(-1) / resp.sum(-1).clamp(min=1)
        rewards = adv.unlikeliness_rewards(rewards, seq_logp, batch.group_size, beta_rank=algo.beta_rank)
    batch.advantages = adv.compute_advantages(algo.advantage, rewards, batch.group_size, **algo.advantage_args)
    batch.token_advantages = batch.advantages[:, None].expand_as(batch.input_ids).clone()
    if algo.token_shaping is not None:
        batch.advantages, batch.token_advantages = token_shaping.shape(
            algo.token_shaping, batch.advantages, rewards, batch.entropy, resp, batch.group_size,
            **algo.token_shaping_args)


def correct(correction: CorrectionConfig, cfg: BatchConfig, model: torch.nn.Module, batch: RolloutBatch) -> None:
    """The mismatch correction's weights and kept tokens and its bypass (docs/correction.md), the mask of truncated
    completions, the row filters; their metrics into ``batch.metrics``."""
    cor = correct_rollout(correction, batch.old_logp, batch.sampler_logp, batch.response_mask, batch.advantages)
    batch.is_weight, batch.loss_mask = cor.weight, cor.keep
    batch.metrics.update(cor.metrics)
    if correction.bypass:  # the PPO ratio becomes pi_theta / pi_sampler
        batch.old_logp = torch.where(batch.response_mask, batch.sampler_logp, batch.old_logp)
    if cfg.mask_truncated_completions and batch.truncated is not None:
        keep = batch.response_mask if batch.loss_mask is None else batch.loss_mask
        batch.loss_mask = keep & ~batch.truncated[:, None]
        batch.metrics["rollout/masked_truncated"] = float(batch.truncated.sum())
    batch.metrics.update(apply_filters(batch, cfg, model))  # rollout/filtered_*, when on


def check_divergence(metrics: dict[str, float], vocab: int | None, uniform_entropy_tol: float | None,
                     max_logp_mismatch_mean: float | None, correction: CorrectionConfig, stale: bool = False) -> None:
    """Stop with the cause named when the run has diverged without producing a NaN: the entropy at log(vocab) (a
    policy collapsed to uniform), or the sampler's and the trainer's log-probs apart by more than
    ``max_logp_mismatch_mean`` nats on average. ``stale``: the rows were sampled by an older policy on purpose
    (``rollout.max_staleness``), which names another cause. A ``None`` bound turns its check off."""
    entropy = metrics["rollout/entropy"]
    if uniform_entropy_tol is not None and vocab and entropy >= math.log(vocab) - uniform_entropy_tol:
        raise RuntimeError(
            f"the policy has collapsed to uniform: rollout/entropy={entropy:.4f} = log(vocabulary {vocab}) "
            f"= {math.log(vocab):.4f}; the learning rate is likely far too large (optim.lr). "
            "module.uniform_entropy_tol=null turns this check off")
    mismatch = metrics["diag/logp_mismatch_mean"]
    if max_logp_mismatch_mean is not None and mismatch > max_logp_mismatch_mean:
        if not stale:
            cause = ("the rollout engine is not sampling from the trained weights (a failed weight sync, a dtype "
                     "or temperature mismatch)")
        elif corrects(correction):
            cause = ("the rows were sampled by an older policy (rollout.max_staleness >= 1) and the policy has "
                     "moved away from it: lower rollout.max_staleness or use correction=mis (docs/overlap.md)")
        else:
            cause = ("the rows were sampled by an older policy (rollout.max_staleness >= 1) and the policy has "
                     "moved away from it: an off-policy correction (correction=mis) keeps the lag in check")
        raise RuntimeError(f"sampler and trainer disagree: diag/logp_mismatch_mean={mismatch:.3f} nats > "
                           f"module.max_logp_mismatch_mean={max_logp_mismatch_mean}; {cause}")


def call_rollout_hooks(trainer: pl.Trainer, name: str, *args: Any) -> None:
    """Call ``name(trainer, module, *args)`` on every callback that defines it, in the callback list's order: the
    entropy controller first, then the diagnostics and the law fit (docs/design.md §6.2)."""
    for cb in trainer.callbacks:
        hook = getattr(cb, name, None)
        if callable(hook):
            hook(trainer, trainer.lightning_module, *args)


class UpdateData(Dataset):
    """An iteration's minibatches in the order the update takes them, and the rollout batch they were cut from
    (which the module logs at the epoch's start: ``trainer.train_dataloader.dataset.rollout``)."""

    def __init__(self, rollout: RolloutBatch, minibatches: list[dict[str, torch.Tensor]]) -> None:
        self.rollout = rollout
        self.minibatches = minibatches

    def __len__(self) -> int:
        return len(self.minibatches)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return self.minibatches[i]


def rollout_of(trainer: pl.Trainer | None) -> RolloutBatch | None:
    """The rollout batch of the trainer's current epoch, or None (no epoch yet, or a loader that is not ours)."""
    if trainer is None:
        return None
    try:
        loader = trainer.train_dataloader
    except (AttributeError, RuntimeError):
        return None
    data = getattr(loader, "dataset", None)
    return data.rollout if isinstance(data, UpdateData) else None
