"""One RL iteration, read top to bottom: :func:`run` is the whole algorithm up to the update (docs/design.md §3).

Lightning asks the DataModule for a new loader at the start of every epoch (one epoch is one iteration; the trainer
reloads its data every epoch); ``RolloutDataModule.train_dataloader()`` hands itself, as the :class:`RolloutSource`,
to the module's ``iteration_loader``, which is :func:`run`. Every step below is called from :func:`run` itself, for
the synchronous and the overlapped path (``rollout.max_staleness`` >= 1) alike:

====  =====================================================  ===========================================
step  what                                                   who owns it
====  =====================================================  ===========================================
0     the iteration boundary (checkpoints)                   callbacks' ``on_rollout_start``
1     weight sync into the engine                            the sampler (:mod:`lit_entropy.rollout`)
2     sample and score G completions per prompt (or take     the source (:class:`RolloutSource`); ahead
      the batch sampled ahead, :func:`sample_ahead`)         of time, the sampler's producer
3     pre-update pass: old log-probs, entropy, reference     the policy module (its forward; or, with
                                                             ``module.pre_update_pass=skip``, the first
                                                             minibatch's forward: :func:`skip_refusals`)
4     advantages (reward transform, estimator, shaping)      :mod:`lit_entropy.objectives.advantages`,
5     mismatch correction, truncation mask, row filters      :mod:`lit_entropy.objectives.rollout_correction`
6     stop a run that diverged without a NaN                 :func:`check_divergence`
7     controllers and diagnostics read the batch and act;    callbacks' ``on_rollout_batch``; a
      a controller that needs more samples returns a         :class:`DrawRequest` is drawn here
      :class:`DrawRequest` and :func:`draw` serves it        (:func:`draw`), before the next callback
8     the kept rows as minibatches, one optimizer step each  :func:`minibatch_loader`
====  =====================================================  ===========================================

The update itself (token selection, micro-batch losses, clip, optimizer step) is the module's ``training_step``,
which Lightning calls once per minibatch. The module logs the batch's per-iteration metrics at the epoch's start
from the loader Lightning holds (:class:`UpdateData`): nothing is parked on another object to be picked up later.

Callbacks are the one mechanism for controllers, diagnostics and checkpoints: Lightning calls their usual hooks,
and :func:`run` calls the two that Lightning has no place for (steps 0 and 7), in callback order. This module
imports nothing of ``lit_entropy.data``, ``lit_entropy.module`` or ``lit_entropy.callbacks``: they depend on it,
through :class:`RolloutSource`, :class:`TrainablePolicy` and :class:`DrawRequest`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import advantages as adv
from lit_entropy.objectives import token_shaping
from lit_entropy.objectives.policy_loss import masked_mean
from lit_entropy.objectives.reward_transforms import REWARD_TRANSFORMS
from lit_entropy.objectives.rollout_correction import CorrectionConfig, correct_rollout, corrects
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from lit_entropy.rollout.filters import apply_filters
from lit_entropy.rollout.overlap import Job, Producer, staleness_metrics

log = logging.getLogger(__name__)


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


class RolloutSource(Protocol):
    """What an iteration needs of its data (:class:`~lit_entropy.data.rollout_datamodule.RolloutDataModule`):
    prompts drawn, sampled and scored into batches, and the engine's weights kept in step."""

    sampler: Any
    """Syncs the engine's weights (``sync(model, version)``) and owns the overlap's producer."""
    batch: BatchConfig
    seed: int

    @property
    def producer(self) -> Producer | None:
        """The producer that samples batches ahead (``rollout.max_staleness`` >= 1), or None."""

    def start(self, policy: TrainablePolicy) -> None:
        """Start the engine and the reward workers for ``policy`` (once; later calls do nothing)."""

    def sample_batch(self, tok: Any, iteration: int, metrics: dict[str, float]) -> RolloutBatch:
        """Batch ``iteration``: its prompts sampled and scored now (step 2); times and ``rollout/*`` into
        ``metrics``."""

    def generation_job(self, tok: Any, iteration: int) -> Job:
        """The engine's part of batch ``iteration``, to run on the producer's thread."""

    def finish_batch(self, iteration: int, first: Any) -> tuple[RolloutBatch, dict[str, float]]:
        """Batch ``iteration`` and its metrics from its :meth:`generation_job`'s result, in the trainer's thread."""

    def sample_extra(self, tok: Any, iteration: int, temperature: float, n: int, label: str,
                     metrics: dict[str, float]) -> RolloutBatch:
        """G more completions for the first ``n`` prompts of the iteration, at ``temperature``, scored."""


@dataclass
class DrawRequest:
    """More samples a controller asks the iteration for (AEPO), returned from its ``on_rollout_batch``: :func:`draw`
    samples them from the current weights, lets ``choose`` pick rows, runs the pre-update pass on those, lets
    ``prepare`` set their fields and puts them in place of the batch's first rows, before the next callback reads
    the batch. The controller itself touches neither the data nor the module."""

    temperature: float
    """The sampling temperature of the extra completions."""
    prompts: int
    """How many of the iteration's first prompts are sampled again (G completions each)."""
    label: str
    """Names the draw's own sampling seed (so the iteration's batch is unchanged by it) and its ``time/<label>``."""
    choose: Callable[[RolloutBatch], torch.Tensor]
    """The rows of the scored draw to keep (indices), before their pre-update pass."""
    prepare: Callable[[RolloutBatch, RolloutBatch], None]
    """``prepare(batch, rows)``: the kept rows' advantages, weights and masks, after their pass (called when any)."""


def run(source: RolloutSource, trainer: pl.Trainer, policy: TrainablePolicy, iteration: int) -> DataLoader:
    """One RL iteration up to the update; the loader serves its minibatches to ``training_step``."""
    producer = source.producer  # rollout.max_staleness >= 1: step 2 was sampled during the previous update
    waited = producer.drain(source.finish_batch) if producer is not None else 0.0  # in the boundary's checkpoint
    call_rollout_hooks(trainer, "on_rollout_start")  # 0. the boundary: checkpoints are written here
    source.start(policy)
    t0 = time.perf_counter()
    source.sampler.sync(policy.model, iteration)  # 1. the engine samples from the weights being trained
    t_sync = time.perf_counter() - t0
    dropped = 0
    if producer is None:
        metrics = {"time/generate": 0.0, "time/score": 0.0, "time/sync": t_sync}
        batch = source.sample_batch(policy.tokenizer, iteration, metrics)  # 2. G scored completions per prompt
    else:
        batch, metrics, dropped, wait_more = sample_ahead(source, producer, policy.tokenizer, iteration)  # 2.
        metrics.update({"time/sync": t_sync, "time/wait_rollout": waited + wait_more,
                        "rollout/stale_dropped_rows": float(dropped)})
    prepare_update(policy, batch)  # 3.-6.
    batch.metrics = {**metrics, **batch.metrics}
    t0 = time.perf_counter()
    for hook in rollout_hooks(trainer, "on_rollout_batch"):  # 7. controllers read rollout/entropy and act
        request = hook(trainer, trainer.lightning_module, batch)
        if request is not None:  # more samples, drawn before the next callback reads the batch
            draw(source, policy, batch, request, iteration)
    if dropped:  # rows over the staleness bound (policy `drop`) leave the update after the hooks saw them
        batch.keep = torch.zeros_like(batch.keep)
    batch.metrics.update(staleness_metrics(batch, iteration))  # none on the synchronous path
    batch.metrics["control/kept_frac"] = float(batch.keep.float().mean())
    batch.metrics["time/prepare"] = batch.metrics.get("time/prepare", 0.0) + time.perf_counter() - t0
    return minibatch_loader(batch, source.batch, source.seed, iteration)  # 8. one optimizer step per minibatch


def sample_ahead(source: RolloutSource, producer: Producer, tok: Any, iteration: int
                 ) -> tuple[RolloutBatch, dict[str, float], int, float]:
    """Step 2 with ``rollout.max_staleness = k >= 1`` (:mod:`lit_entropy.rollout.overlap`): launch batch
    ``iteration + k`` from the weights just synced (and any other batch of ``[iteration, iteration + k]`` neither
    ready nor in flight), then take batch ``iteration``, sampled by version ``max(0, iteration - k)``. Returns the
    batch, its metrics, how many of its rows are over the staleness bound (policy ``drop``) and the seconds waited."""
    for j in producer.wanted(iteration):
        producer.launch(j, iteration, source.generation_job(tok, j))  # past max_epochs too: a longer resume
    # The first iteration of a process (the start, a resume) waits for every batch it launched: the uninterrupted
    # run's first background generation ran beside no update (iteration 0 fills the pipeline), and a resumed
    # process whose first one did changed the update's last bits in the SIGKILL resume test.
    waited = producer.drain(source.finish_batch, upto=iteration if producer.warm else None)
    producer.warm = True
    taken = producer.take(iteration)
    if taken is None:  # policy `wait` on a batch over the bound: sampled again from the current weights
        producer.launch(iteration, iteration, source.generation_job(tok, iteration))
        waited += producer.drain(source.finish_batch, upto=iteration)
        taken = producer.take(iteration)
    batch, metrics, dropped = taken
    return batch, metrics, dropped, waited


def draw(source: RolloutSource, policy: TrainablePolicy, batch: RolloutBatch, request: DrawRequest,
         iteration: int) -> None:
    """Serve a controller's :class:`DrawRequest` in step 7: sample and score the extra completions from the current
    weights, keep the rows it chooses, run the pre-update pass on them and put them in place of the batch's first
    rows; ``time/<label>`` into the batch's metrics."""
    t0 = time.perf_counter()
    extra = source.sample_extra(policy.tokenizer, iteration, request.temperature, request.prompts, request.label, {})
    chosen = request.choose(extra)
    if chosen.numel():
        rows = extra.take(chosen)
        policy.pre_update_pass(rows)
        resp = rows.response_mask
        if not (torch.isfinite(rows.old_logp[resp]).all() and torch.isfinite(rows.entropy[resp]).all()):
            raise FloatingPointError(f"non-finite log-prob or entropy in the pre-update pass of {request.label}'s rows")
        request.prepare(batch, rows)
        batch.replace_rows(rows, pad_id=policy.tokenizer.pad_id)
    batch.metrics[f"time/{request.label}"] = time.perf_counter() - t0


def draw_refusals(callbacks: list[Any], max_staleness: int) -> list[str]:
    """The callbacks that return a :class:`DrawRequest` (their class sets ``draws = True``) cannot run with
    ``rollout.max_staleness`` >= 1: their extra samples must come from the current weights."""
    if max_staleness <= 0:
        return []
    return [type(cb).__name__ for cb in callbacks if getattr(cb, "draws", False)]


def minibatch_loader(batch: RolloutBatch, cfg: BatchConfig, seed: int, iteration: int) -> DataLoader:
    """Step 8: the kept rows, shuffled into ``num_minibatches`` minibatches, ``ppo_epochs`` times."""
    gen = torch.Generator().manual_seed(seed * 7919 + iteration)
    minibatches = []
    for _ in range(cfg.ppo_epochs):
        minibatches.extend(batch.minibatches(cfg.num_minibatches, generator=gen))
    if not minibatches:
        log.warning("iteration %d: every row was rejected; no update this iteration", iteration)
        minibatches = [batch.select(torch.arange(0))]  # one empty step keeps Lightning's epoch going
    # generator=: each iterator draws a seed, and Lightning makes more iterators in a fresh process's later
    # epochs than in a resumed one's first; from the global RNG that would break exact resume.
    return DataLoader(UpdateData(batch, minibatches), batch_size=None, shuffle=False, collate_fn=lambda x: x,
                      generator=gen)


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
    transform = REWARD_TRANSFORMS.get(algo.reward_transform) if algo.reward_transform is not None else None
    if transform is not None and transform.reads_pass:
        out.append(f"algo.reward_transform={algo.reward_transform} ({transform.reads_pass})")
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
    if algo.reward_transform is not None:
        rewards = REWARD_TRANSFORMS[algo.reward_transform].apply(rewards, batch, algo)
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


def rollout_hooks(trainer: pl.Trainer, name: str) -> Iterator[Callable[..., Any]]:
    """The callbacks' hooks called ``name``, in the callback list's order: the entropy controller first, then the
    diagnostics and the law fit (docs/design.md §6.2)."""
    for cb in trainer.callbacks:
        hook = getattr(cb, name, None)
        if callable(hook):
            yield hook


def call_rollout_hooks(trainer: pl.Trainer, name: str, *args: Any) -> None:
    """Call ``name(trainer, module, *args)`` on every callback that defines it, in the callback list's order."""
    for hook in rollout_hooks(trainer, name):
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
