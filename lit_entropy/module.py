"""PolicyModule: owns the policy and the policy-gradient loss; wires the pure functions together.

One Lightning epoch is one RL iteration. The rollout DataModule hands over a :class:`RolloutBatch`
after calling :meth:`PolicyModule.prepare_rollout` (advantages, pre-update pass); each training step is
one optimizer step on a minibatch, accumulated over micro-batches with the minibatch's global token
count as the normaliser (manual optimisation, so no hidden division by the accumulation count).

Knobs the loss reads every step, and which entropy controllers may change: ``eps_low``, ``eps_high``,
``entropy_coef``, ``kl_coef``.
"""

from __future__ import annotations

import math
import time
from typing import Any

import lightning.pytorch as pl
import torch

from lit_entropy import advantages as adv
from lit_entropy.algo import AlgoConfig, OptimConfig
from lit_entropy.data.batch import RolloutBatch
from lit_entropy.diagnostics.entropy import align_to_input, shift_for_causal_lm, token_logprobs_and_entropy
from lit_entropy.objectives.policy_loss import aggregate_token_mean, clipped_surrogate, masked_mean


class PolicyModule(pl.LightningModule):
    def __init__(
        self,
        policy: Any,
        algo: AlgoConfig | None = None,
        optim: OptimConfig | None = None,
        temperature: float = 1.0,
        logit_chunk_size: int = 2048,
        num_text_samples: int = 4,
    ) -> None:
        super().__init__()
        self.model = policy.model
        self.model.train()  # from_pretrained hands it over in eval mode
        self.tokenizer = policy.tokenizer
        self.policy_path = policy.path
        self.algo = algo or AlgoConfig()
        self.optim_cfg = optim or OptimConfig()
        self.temperature = temperature
        self.logit_chunk_size = logit_chunk_size
        self.num_text_samples = num_text_samples
        self.automatic_optimization = False
        # Knobs (plain attributes; controllers change them, the loss reads them).
        self.eps_low = self.algo.eps_low
        self.eps_high = self.algo.eps_high
        self.entropy_coef = self.algo.entropy_coef
        self.kl_coef = self.algo.kl_coef
        self.rollout: RolloutBatch | None = None
        self._update_started = 0.0
        self._grad_norm = torch.zeros(())

    # ---- forward -------------------------------------------------------------------------------
    def token_stats(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, with_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """fp32 log-prob of each token and the full-vocabulary entropy, aligned with ``input_ids``."""
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask.long()).logits
        shifted, targets = shift_for_causal_lm(logits, input_ids)
        logp, ent = token_logprobs_and_entropy(
            shifted, targets, temperature=self.temperature, chunk_size=self.logit_chunk_size,
            with_entropy=with_entropy,
        )
        return align_to_input(logp), (align_to_input(ent) if ent is not None else None)

    @torch.no_grad()
    def prepare_rollout(self, batch: RolloutBatch) -> None:
        """Advantages and the pre-update pass (old log-probs, entropy, mismatch); logs ``rollout/entropy``."""
        t0 = time.perf_counter()
        batch.advantages = adv.grpo(
            batch.rewards, batch.group_size, scale_std=self.algo.advantage == "grpo"
        ).to(torch.float32)
        batch.token_advantages = batch.advantages[:, None].expand_as(batch.input_ids).clone()
        was_training = self.model.training
        self.model.eval()
        logps, ents = [], []
        step = self.algo.micro_batch_size
        for s in range(0, batch.batch_size, step):
            ids = batch.input_ids[s : s + step].to(self.device)
            mask = batch.attention_mask[s : s + step].to(self.device)
            lp, en = self.token_stats(ids, mask, with_entropy=True)
            logps.append(lp.cpu())
            ents.append(en.cpu())
        self.model.train(was_training)
        batch.old_logp = torch.cat(logps)
        batch.entropy = torch.cat(ents)
        resp = batch.response_mask
        finite = torch.isfinite(batch.old_logp[resp]).all() and torch.isfinite(batch.entropy[resp]).all()
        if not finite:
            raise FloatingPointError("non-finite log-prob or entropy in the pre-update pass")
        mismatch = (batch.sampler_logp - batch.old_logp).abs()[resp]
        batch.metrics.update(
            {
                "rollout/entropy": float(masked_mean(batch.entropy, resp)),
                "diag/logp_mismatch_mean": float(mismatch.mean()) if mismatch.numel() else 0.0,
                "diag/logp_mismatch_max": float(mismatch.max()) if mismatch.numel() else 0.0,
                "time/prepare": time.perf_counter() - t0,
            }
        )

    # ---- update ----------------------------------------------------------------------------------
    def training_step(self, minibatch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        opt = self.optimizers()
        sched = self.lr_schedulers()
        mask_all = minibatch["response_mask"]
        num_tokens = mask_all.sum()
        stats = {k: torch.zeros((), device=self.device) for k in ("loss", "clip_low", "clip_high", "ratio", "ent")}
        step = self.algo.micro_batch_size
        n = mask_all.shape[0]
        for s in range(0, n, step):
            mb = {k: v[s : s + step] for k, v in minibatch.items()}
            mask = mb["response_mask"]
            logp, ent = self.token_stats(mb["input_ids"], mb["attention_mask"], with_entropy=True)
            loss_tok, info = clipped_surrogate(
                logp, mb["old_logp"], mb["token_advantages"], self.eps_low, self.eps_high, self.algo.dual_clip
            )
            loss = aggregate_token_mean(loss_tok, mask, num_tokens=num_tokens)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite loss at global step {self.global_step}")
            self.manual_backward(loss)
            with torch.no_grad():
                ratio = torch.exp(logp - mb["old_logp"])
                stats["loss"] += loss.detach()
                stats["clip_low"] += (info["clipped_low"] & mask).sum()
                stats["clip_high"] += (info["clipped_high"] & mask).sum()
                stats["ratio"] += (ratio * mask).sum()
                stats["ent"] += (ent.detach() * mask).sum()
        denom = num_tokens.clamp(min=1)
        grad_norm = self._clip_and_step(opt, sched)
        metrics = {
            "train/loss": stats["loss"],
            "train/pg_loss": stats["loss"],
            "train/entropy": stats["ent"] / denom,
            "train/clipfrac_low": stats["clip_low"] / denom,
            "train/clipfrac_high": stats["clip_high"] / denom,
            "train/ratio_mean": stats["ratio"] / denom,
            "train/grad_norm": grad_norm,
            "train/lr": torch.tensor(opt.param_groups[0]["lr"]),
        }
        self.log_dict(metrics, on_step=True, on_epoch=False, prog_bar=False, batch_size=n)
        self.log("train/loss_epoch", stats["loss"], on_step=False, on_epoch=True, batch_size=n, prog_bar=True,
                 sync_dist=True)
        return stats["loss"]

    def _clip_and_step(self, opt, sched) -> torch.Tensor:
        opt.step()  # runs on_before_optimizer_step (norm, clipping) after any fp16 unscaling
        opt.zero_grad(set_to_none=True)
        sched.step()
        return self._grad_norm

    def on_before_optimizer_step(self, optimizer) -> None:
        """Gradient norm and clipping, on unscaled gradients (Lightning unscales fp16 ones before this)."""
        norms = [p.grad.detach().float().norm() for p in self.parameters() if p.grad is not None]
        self._grad_norm = torch.linalg.vector_norm(torch.stack(norms)) if norms else torch.zeros((), device=self.device)
        if not torch.isfinite(self._grad_norm):
            if self.trainer.precision == "16-mixed":
                return  # the loss scaler skips this step and lowers its scale
            raise FloatingPointError(f"non-finite gradient norm at global step {self.global_step}")
        if self.optim_cfg.max_grad_norm > 0:
            self.clip_gradients(optimizer, gradient_clip_val=self.optim_cfg.max_grad_norm,
                                gradient_clip_algorithm="norm")

    def configure_optimizers(self) -> Any:
        cfg = self.optim_cfg
        opt = torch.optim.AdamW(self.parameters(), lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
        warm = max(1, cfg.warmup_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # ---- per-iteration logging -------------------------------------------------------------------
    def on_train_epoch_start(self) -> None:
        self._update_started = time.perf_counter()
        if self.rollout is None:
            return
        metrics = {k: float(v) for k, v in self.rollout.metrics.items()}
        bad = [k for k, v in metrics.items() if not math.isfinite(v)]
        if bad:
            raise FloatingPointError(f"non-finite rollout metrics: {bad}")
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=1, sync_dist=True)
        self._log_text_samples(self.rollout)

    def on_train_epoch_end(self) -> None:
        self.log(
            "time/update", time.perf_counter() - self._update_started, on_step=False, on_epoch=True, sync_dist=True
        )

    def _log_text_samples(self, batch: RolloutBatch) -> None:
        logger = self.logger
        experiment = getattr(logger, "experiment", None)
        if experiment is None or not hasattr(experiment, "add_text") or not batch.completions:
            return
        k = min(self.num_text_samples, len(batch.completions))
        idx = torch.linspace(0, len(batch.completions) - 1, k).long().tolist()
        lines = ["| prompt | completion | reward | advantage |", "|---|---|---|---|"]
        for i in idx:
            comp = batch.completions[i].replace("|", "\\|") or "(empty)"
            a = float(batch.advantages[i]) if batch.advantages is not None else float("nan")
            lines.append(f"| `{batch.prompts[i]}` | `{comp}` | {float(batch.rewards[i]):.2f} | {a:+.2f} |")
        experiment.add_text("rollout/samples", "\n".join(lines), global_step=self.current_epoch)
