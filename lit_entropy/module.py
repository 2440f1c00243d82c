"""PolicyModule: owns the policy and the policy-gradient loss; wires the pure functions together.

One Lightning epoch is one RL iteration (:mod:`lit_entropy.iteration` reads it top to bottom): the module does its
step 3, the pre-update pass (:meth:`PolicyModule.pre_update_pass`), and the update. Each training step is one
optimizer step on a minibatch, accumulated over micro-batches with the minibatch's global token count as the
normaliser (manual optimisation, so no hidden division by the accumulation count), then clipped and stepped.

Knobs the loss reads every step, and which entropy controllers may change: ``eps_low``, ``eps_high``,
``gppo_beta_low``, ``gppo_beta_high``, ``entropy_coef``, ``kl_coef``, ``pic_alpha``.

Every forward pass goes through :mod:`lit_entropy.policy.passes` (:meth:`PolicyModule.row_passes`): rows run
whole, or, with ``share_prompts``, each group's prompt once and its completions on the prompt's cached keys
and values. A training step reads: token selection over the whole minibatch; for each of this rank's
micro-batches, the loss and its backward; ``finish_backward`` (the shared prompts' prompt pass); gradient
clipping and the optimizer step; ``train/*`` logging. On W ranks (DDP or FSDP2) every rank holds the same
rollout batch and the same minibatches; each optimizer step normalises with the whole minibatch's counts
and scales the loss by W so that the strategies' gradient averaging yields the one-rank gradient sum.
``train/*`` sums are reduced over ranks before they are logged. ``train/*`` is logged at the optimizer step, every
per-iteration value at the iteration (``step`` = ``iteration`` = ``current_epoch + 1``, lit_entropy/utils/log_steps.py).
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lit_entropy import iteration
from lit_entropy.algo import AlgoConfig, OptimConfig, build_optimizer
from lit_entropy.diagnostics.topk import topk_mass
from lit_entropy.diagnostics.vocab_kernels import check_mode as vocab_kernels_mode
from lit_entropy.iteration import rollout_of
from lit_entropy.objectives import changes as surrogate_changes
from lit_entropy.objectives import stare
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.policy_loss import masked_mean
from lit_entropy.objectives.registry import (
    initial_knobs,
    needs_current_logp,
    needs_entropy_grad,
    needs_scores,
)
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.policy import passes, replay
from lit_entropy.policy.lora import is_peft
from lit_entropy.policy.strategies import fully_shard_policy
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from lit_entropy.utils import dist
from lit_entropy.utils.log_steps import ITERATION, iteration_step


class PolicyModule(pl.LightningModule):
    def __init__(
        self,
        policy: Any,
        algo: AlgoConfig | None = None,
        optim: OptimConfig | None = None,
        batch: BatchConfig | None = None,
        temperature: float = 1.0,
        logit_chunk_size: int = 2048,
        vocab_kernels: str = "auto",
        num_text_samples: int = 4,
        uniform_entropy_tol: float | None = 1e-3,
        max_logp_mismatch_mean: float | None = 1.0,
        share_prompts: bool = True,
        topk_mass: int = 3,
        top_p: float = 1.0,
        top_k: int | None = 0,
        correction: CorrectionConfig | None = None,
        pre_update_pass: str = "run",
    ) -> None:
        """``uniform_entropy_tol``: stop the run when ``rollout/entropy`` is within this of log(vocabulary)
        — a policy collapsed to uniform (e.g. a far too large learning rate) produces no NaN, only noise.
        ``max_logp_mismatch_mean``: stop when the sampler's and the trainer's log-probs differ by more than
        this on average (nats) — the engine is not sampling from the trained weights. None turns either off.
        ``share_prompts``: run each group's prompt once and its completions on the prompt's cached keys and
        values (:mod:`lit_entropy.policy.prefix`); rows that do not allow it run whole. ``vocab_kernels``: ``compiled``,
        ``eager`` or ``auto`` (compiled on the CPU for wide vocabularies), how the fp32 log-prob, entropy and
        score work over the vocabulary runs (:mod:`lit_entropy.diagnostics.vocab_kernels`). ``top_p``, ``top_k``: the
        sampler's truncation (the ``rollout`` group's), replayed by every pass (:mod:`lit_entropy.policy.replay`).
        ``topk_mass``: K of ``diag/top1_mass`` / ``diag/topk_mass``, the policy's mean top-1 and top-K
        probability on response tokens in the pre-update pass (0 = off; SimKO's K when SimKO is on).
        ``correction``: the sampler/trainer mismatch correction (the ``correction`` group, docs/correction.md).
        ``pre_update_pass``: ``run``, or ``skip`` (verl's bypass mode, with ``correction=bypass``): no pass before the
        update; the sampler's log-probs are the old ones. ``diag/logp_mismatch_*`` and the divergence checks come
        from the first minibatch's own forward (the pre-update policy), before its optimizer step;
        ``rollout/entropy`` from the forwards of the iteration's first pass over its rows (minibatch k's rows
        after k − 1 optimizer steps: with one minibatch, exactly the pre-update entropy). Refused, naming each,
        where something reads the pass before the update (:func:`lit_entropy.iteration.skip_refusals`,
        :func:`~lit_entropy.iteration.hook_refusals`)."""
        super().__init__()
        self.model = policy.model
        self.model.train()  # from_pretrained hands it over in eval mode
        self.tokenizer = policy.tokenizer
        self.policy_path = policy.path
        self.algo = algo or AlgoConfig()
        self.optim_cfg = optim or OptimConfig()
        self.batch_cfg = batch or BatchConfig()
        self.temperature = temperature
        self.logit_chunk_size = logit_chunk_size
        self.vocab_kernels = vocab_kernels_mode(vocab_kernels)
        self.num_text_samples = num_text_samples
        self.uniform_entropy_tol = uniform_entropy_tol
        self.max_logp_mismatch_mean = max_logp_mismatch_mean
        self.share_prompts = share_prompts
        self.topk_mass = surrogate_changes.topk(self.algo) or topk_mass  # SimKO's K when SimKO is on
        self.top_p, self.top_k = top_p, top_k
        self.correction = correction or CorrectionConfig()
        if pre_update_pass not in iteration.PRE_UPDATE_PASS:
            raise ValueError(f"module.pre_update_pass={pre_update_pass!r} must be one of {iteration.PRE_UPDATE_PASS}")
        self.pre_update_pass_mode = pre_update_pass
        if pre_update_pass == "skip":
            refused = iteration.skip_refusals(self.algo, self.correction,
                                              [c.name for c, _ in surrogate_changes.active(self.algo)],
                                              replay.active(top_p, top_k))
            if refused:
                raise ValueError("module.pre_update_pass=skip: these read the pre-update pass, which skip leaves "
                                 "out: " + "; ".join(refused))
        self.automatic_optimization = False
        # Knobs (plain attributes; controllers change them, the loss reads them): eps_low, eps_high and each
        # registered loss term's coefficient (entropy_coef, kl_coef, pic_alpha, ...).
        for name, value in initial_knobs(self.algo).items():
            setattr(self, name, value)
        self.want_scores = False  # set by diagnostics callbacks: the pre-update pass also computes S, N
        self.selection_generator = torch.Generator().manual_seed(0)
        # Frozen reference for the KL term, loaded only when it is used; kept out of the module's
        # submodules so it is neither optimised nor checkpointed (it is the initial policy).
        self.ref_model: torch.nn.Module | None = None
        if self.algo.kl_coef > 0 and not is_peft(self.model):  # LoRA: the reference is adapters-off
            ref = copy.deepcopy(self.model).eval().requires_grad_(False)
            object.__setattr__(self, "ref_model", ref)
        self._update_started = self._update_ended = 0.0  # time/update: epoch start to the last batch's end
        self.time_forward = 0.0  # seconds in no-grad forwards (pre-update pass, Clip-Cov's current log-probs)
        self.time_forward_backward = 0.0  # seconds in the update's micro-batch forward + backward
        self._grad_norm = torch.zeros(())
        self._entropy_sums = [0.0, 0.0]  # pre_update_pass=skip: rollout/entropy's sum and token count this iteration

    # ---- forward -------------------------------------------------------------------------------
    def row_passes(self, fields: dict[str, torch.Tensor]) -> passes.RowPasses:
        """The passes over ``fields``' rows: on their shared prompts where that works, else whole
        (:mod:`lit_entropy.policy.passes`)."""
        return passes.for_rows(self._forward(), fields, share_prompts=self.share_prompts)

    def _forward(self) -> passes.Forward:
        return passes.Forward(self.model, self.batch_cfg.micro_batch_size, self.temperature, self.logit_chunk_size,
                              self._precision_context, self.device, self.top_p, self.top_k, self.vocab_kernels,
                              self.batch_cfg.micro_batch_tokens)

    def token_stats(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, with_entropy: bool = True,
        with_scores: bool = False, model: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """fp32 per-token ``(log-prob, entropy[, S, N])`` of whole rows in one forward (entropy None without
        ``with_entropy``); :meth:`row_passes` gives the named :class:`~lit_entropy.policy.passes.TokenStats`."""
        out = self._forward().token_stats(model or self.model, input_ids, attention_mask, with_entropy, with_scores)
        return (out.logp, out.entropy) + ((out.disc_s, out.disc_n) if with_scores else ())

    def _no_grad_pass(self, rows: passes.RowPasses, model: torch.nn.Module | None = None,
                      **kw: Any) -> passes.TokenStats:
        """``rows.no_grad`` (eval mode; every rank gets every row's values, on the CPU), timed as ``time/forward``."""
        t0 = time.perf_counter()
        out = rows.no_grad(model or self.model, **kw)
        self.time_forward += time.perf_counter() - t0
        return out

    def _precision_context(self) -> contextlib.AbstractContextManager:
        """The trainer's precision context (autocast for bf16/fp16), or nothing outside a Trainer."""
        trainer = self._trainer
        return trainer.precision_plugin.forward_context() if trainer is not None else contextlib.nullcontext()

    @torch.no_grad()
    def pre_update_pass(self, batch: RolloutBatch) -> None:
        """Step 3 of the iteration (:mod:`lit_entropy.iteration`): one no-grad pass over the batch for the old
        log-probs and the entropy, and, when asked for, the discriminator scores, the top-K mass, the untruncated
        entropy and the reference's log-probs."""
        rows = self.row_passes(batch.tensor_fields())
        if self.pre_update_pass_mode == "skip":  # the sampler's log-probs; entropy from the first minibatch's step
            batch.old_logp = torch.where(batch.response_mask, batch.sampler_logp, 0.0)
            batch.entropy = None
            self._reference_pass(rows, batch)
            return
        scores = self.want_scores or needs_scores(self.algo)
        full = rows.fwd.replays  # truncated sampling: also the untruncated entropy, as rollout/entropy_full
        out = self._no_grad_pass(rows, with_entropy=True, with_scores=scores, with_full_entropy=full,
                                 topk=self.topk_mass)
        batch.old_logp, batch.entropy = out.logp, out.entropy
        if scores:
            batch.disc_s, batch.disc_n = out.disc_s, out.disc_n
        if out.topk_logp is not None:
            top1, topk = topk_mass(out.topk_logp, batch.response_mask)
            batch.metrics.update({"diag/top1_mass": top1, "diag/topk_mass": topk})
        if full:
            batch.metrics["rollout/entropy_full"] = float(masked_mean(out.full_entropy, batch.response_mask))
        self._reference_pass(rows, batch)

    def _reference_pass(self, rows: passes.RowPasses, batch: RolloutBatch) -> None:
        """The reference's log-probs into ``batch.ref_logp`` when the KL term is used."""
        if self.ref_model is not None:  # the reference pass needs log-probs only
            batch.ref_logp = self._no_grad_pass(rows, model=self.ref_model, with_entropy=False).logp
        elif self.algo.kl_coef > 0:  # LoRA: the frozen base model is the reference, with no second copy
            with self.model.disable_adapter():
                batch.ref_logp = self._no_grad_pass(rows, with_entropy=False).logp

    # ---- update ----------------------------------------------------------------------------------
    def knobs(self) -> Knobs:
        return Knobs.read(self)

    def training_step(self, minibatch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        """One optimizer step: selection over the whole minibatch, then accumulated micro-batches."""
        opt, sched = self.optimizers(), self.lr_schedulers()
        if minibatch["input_ids"].shape[0] == 0:  # a rollout hook rejected every row: nothing to learn
            return torch.zeros((), device=self.device)
        knobs = self.knobs()
        rows = self.row_passes(minibatch)
        current = None
        if needs_current_logp(self.algo):
            current = self._no_grad_pass(rows, with_entropy=False).logp.to(self.device)
        sel = select_tokens(self.algo, minibatch, knobs, current, self.selection_generator)
        sums: dict[str, torch.Tensor] = {}
        loss_total = torch.zeros((), device=self.device)
        world = dist.world_size()
        t0 = time.perf_counter()
        topk = surrogate_changes.topk(self.algo)  # SimKO reads the top-K candidates
        entropy_grad = needs_entropy_grad(knobs)  # an active loss term back-propagates through the entropy
        measured = [] if self.pre_update_pass_mode == "skip" and batch_idx < self._measured_steps() else None
        for mb in rows.micro_batches(topk):  # this rank's share; padding ones keep the collectives in step
            ent = mb.ent if entropy_grad else mb.ent.detach()
            loss, stats = micro_batch_loss(self.algo, knobs, mb.fields, sel.rows(mb.rows, mb.width), mb.logp, ent,
                                           mb.topk, kl_bias_correction=self.correction.bias_corrected_kl)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at global step {self.global_step}")
            # DDP and FSDP2 average gradients over ranks; x W turns the average into the one-rank sum.
            self.manual_backward(loss * (0.0 if mb.padding else float(world)))
            if measured is not None and not mb.padding:  # module.pre_update_pass=skip: step 3's values
                measured.append(first_pass_sums(mb))
            if not mb.padding:
                loss_total += loss.detach()
                for key, v in stats.items():
                    sums[key] = sums.get(key, 0) + v
        rows.finish_backward(self.manual_backward, self._loss_scale())  # shared prompts: the prompt pass
        sums, loss_total = self._sum_over_ranks(sums, loss_total, with_kl="ref_logp" in minibatch,
                                                with_stare=stare.is_on(knobs))
        self.time_forward_backward += time.perf_counter() - t0
        if measured is not None:  # module.pre_update_pass=skip: at step 0, the iteration's step 6
            self._measured_metrics(measured, batch_idx)
        grad_norm = self._clip_and_step(opt, sched)
        self._log_step(sums, loss_total, grad_norm, opt.param_groups[0]["lr"], sel.num_tokens, sel.frac,
                       minibatch["input_ids"].shape[0])
        return loss_total

    def _measured_steps(self) -> int:
        """The optimizer steps of the iteration's first pass over its rows: one per minibatch
        (:meth:`~lit_entropy.rollout.batch.RolloutBatch.minibatches` cuts no more minibatches than kept rows)."""
        rollout = rollout_of(self._trainer)
        rows = int(rollout.keep.sum()) if rollout is not None else self.batch_cfg.num_minibatches
        return max(1, min(self.batch_cfg.num_minibatches, rows))

    def _measured_metrics(self, sums: list[dict[str, torch.Tensor]], batch_idx: int) -> None:
        """``module.pre_update_pass=skip``: the values the pass would have given, from the update's forwards. At
        the first step (the pre-update policy, before its optimizer step) ``diag/logp_mismatch_*`` over its rows
        and the divergence checks; after the last minibatch of the first pass over the rows, ``rollout/entropy``
        over all of them. Into the iteration's metrics (the progress line, the dashboard and the records read them)
        and the log."""
        total = {k: sum((s[k] for s in sums), torch.zeros((), dtype=torch.float64)) for k in ("ent", "mis", "n")}
        total = dist.all_reduce_sum(total, device=self.device)
        rollout = rollout_of(self._trainer)
        metrics: dict[str, float] = {}
        if batch_idx == 0:
            self._entropy_sums = [0.0, 0.0]
            peak = max([float(s["max"]) for s in sums] or [0.0])
            if dist.world_size() > 1:
                peak = max(dist.gather_objects(peak))
            n = max(float(total["n"]), 1.0)
            metrics = {"diag/logp_mismatch_mean": float(total["mis"]) / n, "diag/logp_mismatch_max": peak}
            vocab = getattr(getattr(self.model, "config", None), "vocab_size", None)
            iteration.check_divergence({**metrics, "rollout/entropy": float(total["ent"]) / n}, vocab,
                                       self.uniform_entropy_tol, self.max_logp_mismatch_mean, self.correction,
                                       stale=rollout is not None and rollout.version is not None)
        self._entropy_sums = [self._entropy_sums[0] + float(total["ent"]), self._entropy_sums[1] + float(total["n"])]
        if batch_idx == self._measured_steps() - 1:
            metrics["rollout/entropy"] = self._entropy_sums[0] / max(self._entropy_sums[1], 1.0)
        if rollout is not None:
            rollout.metrics.update(metrics)
        if metrics:
            self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1)

    def _sum_over_ranks(self, sums: dict[str, torch.Tensor], loss_total: torch.Tensor,
                        with_kl: bool, with_stare: bool = False) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The step's ``train/*`` sums over ranks: the same keys on every rank, even one that ran only padding."""
        if dist.world_size() == 1:
            return sums, loss_total
        keys = ["pg_loss", "entropy", "entropy_ratio", "clip_low", "clip_high", "ratio", "tokens"]
        keys += (["kl"] if with_kl else []) + (["stare_acted"] if with_stare else [])
        keys += [c.stat for c, _ in surrogate_changes.active(self.algo) if c.metric]
        local = {key: torch.as_tensor(sums.get(key, 0.0), dtype=torch.float32) for key in keys}
        sums = dist.all_reduce_sum({**local, "loss": loss_total}, device=self.device)
        return sums, sums.pop("loss")

    def _log_step(self, sums: dict[str, torch.Tensor], loss_total: torch.Tensor, grad_norm: torch.Tensor, lr: float,
                  num_tokens: torch.Tensor, masked_frac: float | None, n: int) -> None:
        """The step's ``train/*`` scalars; per-token means over the ``num_tokens`` selected tokens."""
        denom = num_tokens.clamp(min=1)
        metrics = {
            "train/loss": loss_total,
            "train/pg_loss": sums.get("pg_loss", loss_total),
            "train/entropy": sums.get("entropy", torch.zeros(())) / denom,
            "train/clipfrac_low": sums.get("clip_low", torch.zeros(())) / denom,
            "train/clipfrac_high": sums.get("clip_high", torch.zeros(())) / denom,
            "train/ratio_mean": sums.get("ratio", torch.zeros(())) / denom,
            "train/grad_norm": grad_norm,
            "train/lr": torch.tensor(lr),
        }
        if "kl" in sums:
            metrics["train/kl_ref"] = sums["kl"] / denom
        if "entropy_ratio" in sums:
            metrics["train/entropy_ratio"] = sums["entropy_ratio"] / denom
        for change, _ in surrogate_changes.active(self.algo):  # ERC's train/erc_clipfrac
            if change.metric is not None and change.stat in sums:
                metrics[f"train/{change.metric}"] = sums[change.stat] / denom
        if "stare_acted" in sums:  # STARE: the fraction of the loss tokens its weights changed this step
            metrics["train/stare_reweighted_frac"] = sums["stare_acted"] / denom
        if masked_frac is not None:
            metrics[f"train/masked_frac_{self.algo.selection}"] = torch.tensor(masked_frac)
        self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False, batch_size=n)
        self.log("train/loss_epoch", loss_total, on_step=False, on_epoch=True, batch_size=n, prog_bar=True,
                 sync_dist=True)

    def _loss_scale(self) -> float:
        """The factor ``manual_backward`` multiplies losses by (fp16's loss scaler), 1 otherwise."""
        scaler = getattr(self._trainer.precision_plugin, "scaler", None) if self._trainer is not None else None
        return float(scaler.get_scale()) if scaler is not None and scaler.is_enabled() else 1.0

    def _clip_and_step(self, opt: Any, sched: Any) -> torch.Tensor:
        """Clip, then step the optimizer and the scheduler; the gradient norm before clipping. Lightning's
        ``opt.step()`` unscales fp16 gradients, then calls :meth:`on_before_optimizer_step`, which measures and clips
        them, then runs the optimizer: the clip lives in that hook because the unscaling comes first (a clip here,
        before ``opt.step()``, would see fp16's scaled gradients, and unscaling twice is an error)."""
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        return self._grad_norm

    def on_before_optimizer_step(self, optimizer) -> None:
        """Gradient norm and clipping, on unscaled gradients (Lightning unscales fp16 ones before this)."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
            self._grad_norm = dist.full_tensor(norm).float()  # FSDP2: the norm over every rank's shard
        else:
            self._grad_norm = torch.zeros((), device=self.device)
        if not torch.isfinite(self._grad_norm):
            if self.trainer.precision == "16-mixed":
                return  # the loss scaler skips this step and lowers its scale
            raise FloatingPointError(f"non-finite gradient norm at global step {self.global_step}")
        if self.optim_cfg.max_grad_norm > 0:
            self.clip_gradients(optimizer, gradient_clip_val=self.optim_cfg.max_grad_norm,
                                gradient_clip_algorithm="norm")

    def configure_model(self) -> None:
        """FSDP2 (``trainer=fsdp``): Lightning's ``ModelParallelStrategy`` calls this with its device mesh;
        other strategies leave the model as it is (:func:`lit_entropy.policy.strategies.fully_shard_policy`)."""
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None and not any(dist.is_dtensor(p) for p in self.model.parameters()):
            fully_shard_policy(self.model, mesh, precision=self.trainer.precision)

    def configure_optimizers(self) -> Any:
        cfg = self.optim_cfg
        params = [p for p in self.parameters() if p.requires_grad]  # LoRA: the adapters only
        opt = build_optimizer(cfg, params)  # the `optim` group's optimizer (AdamW by default)
        warm = max(1, cfg.warmup_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- the iteration ---------------------------------------------------------------------------
    def iteration_loader(self, source: iteration.RolloutSource) -> DataLoader:
        """This epoch's RL iteration up to the update, from ``source`` (the DataModule, whose ``train_dataloader``
        Lightning calls at every epoch's start): :func:`lit_entropy.iteration.run`; its minibatches as the loader."""
        return iteration.run(source, self.trainer, self, self.trainer.current_epoch)

    # ---- per-iteration logging -------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["selection_generator"] = self.selection_generator.get_state()  # Clip-Cov's draws

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "selection_generator" in checkpoint:
            self.selection_generator.set_state(checkpoint["selection_generator"])

    def on_fit_start(self) -> None:
        readers = iteration.hook_refusals(self.trainer.callbacks) if self.pre_update_pass_mode == "skip" else []
        if readers:
            raise ValueError(f"module.pre_update_pass=skip: {', '.join(readers)} read the batch before the update, "
                             "where skip has no entropy yet (callbacks/entropy=none callbacks/diagnostics=none "
                             "callbacks/law=none callbacks/stop=none leave them out)")
        if self.ref_model is not None:
            self.ref_model.to(self.device)

    def on_train_epoch_start(self) -> None:
        """Log the iteration's rollout metrics, from the loader Lightning holds for this epoch."""
        self._update_started = time.perf_counter()
        rollout = rollout_of(self._trainer)
        if rollout is None:
            return
        metrics = {k: float(v) for k, v in rollout.metrics.items()}
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"non-finite rollout metrics: {bad}")
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        self._log_text_samples(rollout)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._update_ended = time.perf_counter()

    def on_train_epoch_end(self) -> None:
        # The update ends with the last minibatch: the callbacks' epoch ends (an evaluation: time/evaluate) run
        # before this hook and are not part of it.
        ended = self._update_ended if self._update_ended > self._update_started else time.perf_counter()
        times = {
            "time/update": ended - self._update_started,
            "time/forward": self.time_forward,  # this iteration's no-grad forwards, pre-update pass included
            "time/forward_backward": self.time_forward_backward,
        }
        # This epoch's values go to the iteration's step, not the optimizer step (lit_entropy/utils/log_steps.py).
        k = float(iteration_step(self.current_epoch))
        self.log_dict({**times, "step": k, ITERATION: k}, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        self.time_forward = self.time_forward_backward = 0.0

    def _log_text_samples(self, batch: RolloutBatch) -> None:
        # The first logger that takes text (TensorBoard), wherever it sits in a list of several.
        writers = [getattr(lg, "experiment", None) for lg in self.loggers]
        experiment = next((w for w in writers if hasattr(w, "add_text")), None)
        if experiment is None or not batch.completions:
            return
        k = min(self.num_text_samples, len(batch.completions))
        idx = torch.linspace(0, len(batch.completions) - 1, k).long().tolist()
        lines = ["| prompt | completion | reward | advantage |", "|---|---|---|---|"]
        for i in idx:
            comp = batch.completions[i].replace("|", "\\|") or "(empty)"
            a = float(batch.advantages[i]) if batch.advantages is not None else float("nan")
            lines.append(f"| `{batch.prompts[i]}` | `{comp}` | {float(batch.rewards[i]):.2f} | {a:+.2f} |")
        experiment.add_text("rollout/samples", "\n".join(lines), global_step=iteration_step(self.current_epoch))


def first_pass_sums(mb: passes.MicroBatch) -> dict[str, torch.Tensor]:
    """A micro-batch's response-token sums of entropy and of ``|log π_sampler − log π|`` (fp64), their count and
    the largest mismatch, from its own forward: the pre-update values when the policy has not stepped yet."""
    mask = mb.fields["response_mask"].bool()
    logp, ent = mb.logp.detach(), mb.ent.detach()
    mismatch = (mb.fields["sampler_logp"] - logp).abs()[mask].double()
    return {"ent": ent[mask].double().sum(), "mis": mismatch.sum(), "n": mask.sum().double(),
            "max": mismatch.max() if mismatch.numel() else torch.zeros((), dtype=torch.float64)}
