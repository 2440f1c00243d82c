"""RolloutDataModule: every epoch generates, scores and measures a fresh batch (DESIGN §3 steps 1–6).

``train_dataloader()`` is called once per epoch (``reload_dataloaders_every_n_epochs=1``); it syncs
the engine to the trainer's weights, draws prompts, samples G completions per prompt, scores them in
an isolated reward runner, asks the module for advantages and the pre-update pass, lets every callback
with an ``on_rollout_batch(trainer, pl_module, batch)`` hook reshape the batch, and serves the kept rows
as minibatches (one optimizer step each).

On W ranks (``trainer=ddp`` / ``trainer=fsdp``) each rank generates and scores a contiguous block of
whole groups, seeded by global prompt index, and the groups are all-gathered in rank order: every
rank then holds exactly the batch one rank would have built, so advantages, the pre-update pass,
``rollout/entropy`` and every controller's decision are identical on all ranks. The minibatch list is
the same on every rank too; the module shards each minibatch's rows (``PolicyModule.training_step``).
"""

from __future__ import annotations

import inspect
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lit_entropy.checkpointing import preserved_rng
from lit_entropy.data.batch import RolloutBatch
from lit_entropy.data.prompts import PromptSource
from lit_entropy.precision import engine_dtype_for
from lit_entropy.rewards.runner import MODES, RewardRunner
from lit_entropy.rewards.shaping import soft_overlong_penalty
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig, truncate_at_stop
from lit_entropy.utils import dist

log = logging.getLogger(__name__)


class RolloutDataModule(pl.LightningDataModule):
    def __init__(
        self,
        prompts: PromptSource,
        engine: Callable[..., RolloutEngine] | None = None,
        prompts_per_iter: int = 32,
        group_size: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 24,
        reward_mode: str = "auto",
        reward_timeout_s: float = 5.0,
        reward_workers: int = 2,
        correct_threshold: float = 1.0,
        seed: int = 0,
        chat_template: bool = False,
        system_prompt: str | None = None,
        stop: list[str] | None = None,
        overlong_buffer: int = 0,
        overlong_penalty: float = 1.0,
    ) -> None:
        """``chat_template``: wrap each prompt as the user's turn with the tokenizer's chat template
        (instruct models; ``system_prompt`` adds a system turn); false feeds the prompt text as it is (base
        models, e.g. an R1-Zero-style ``prompts.template``). ``stop``: strings that end a completion
        (engine-agnostic, see :func:`~lit_entropy.rollout.base.truncate_at_stop`). ``overlong_buffer`` > 0:
        DAPO's soft overlong punishment over the last that many of ``max_new_tokens`` tokens, scaled by
        ``overlong_penalty`` and added to the reward."""
        super().__init__()
        if prompts_per_iter < 1:
            raise ValueError(f"data.prompts_per_iter={prompts_per_iter} must be >= 1")
        if group_size < 2:
            raise ValueError(f"data.group_size={group_size}: group baselines need G >= 2")
        self.prompts = prompts
        self.engine_factory = engine
        self.prompts_per_iter = prompts_per_iter
        self.group_size = group_size
        self.sampling = SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)
        self.reward_mode = reward_mode
        if reward_mode not in MODES:
            raise ValueError(f"data.reward_mode={reward_mode!r} must be one of {MODES}")
        if not (isinstance(reward_timeout_s, int | float) and math.isfinite(reward_timeout_s) and reward_timeout_s > 0):
            raise ValueError(f"data.reward_timeout_s={reward_timeout_s!r} must be a finite number > 0")
        if not isinstance(reward_workers, int) or reward_workers < 1:
            raise ValueError(f"data.reward_workers={reward_workers!r} must be an integer >= 1")
        self.reward_timeout_s = reward_timeout_s
        self.reward_workers = reward_workers
        self.correct_threshold = correct_threshold
        self.seed = seed
        if overlong_buffer < 0 or overlong_buffer > max_new_tokens:
            raise ValueError(f"data.overlong_buffer={overlong_buffer} must be in [0, max_new_tokens={max_new_tokens}]")
        if overlong_penalty < 0:
            raise ValueError(f"data.overlong_penalty={overlong_penalty} must be >= 0")
        self.chat_template = chat_template
        self.system_prompt = system_prompt
        self.stop = [str(x) for x in (stop or [])]
        if any(not x for x in self.stop):
            raise ValueError("data.stop: empty stop strings")
        self.overlong_buffer = overlong_buffer
        self.overlong_penalty = overlong_penalty
        self.engine: RolloutEngine | None = None
        self.rewards: RewardRunner | None = None

    # ---- lifecycle -------------------------------------------------------------------------------
    def encode_prompt(self, tok: Any, text: str) -> list[int]:
        """Token ids of a prompt: the chat template's user turn, or the text after BOS."""
        if self.chat_template:
            return tok.encode_chat(text, system=self.system_prompt)
        return tok.encode(text, add_bos=True)

    def _ensure_started(self, module: Any) -> None:
        if self.chat_template and not getattr(module.tokenizer, "has_chat_template", False):
            raise ValueError("data.chat_template=true needs a tokenizer with a chat template (model=hf with an "
                             "instruct model's tokenizer); the lab's character tokenizer has none")
        if self.rewards is None:
            self.rewards = RewardRunner(
                self.prompts.reward_fn, timeout_s=self.reward_timeout_s, mode=self.reward_mode,
                num_workers=self.reward_workers, fn_kwargs=self.prompts.reward_kwargs,
            )
            self.rewards.start()  # the workers start while the engine starts
        if self.engine is None:
            if self.engine_factory is None:
                raise ValueError("RolloutDataModule needs a rollout engine (the `rollout` config group)")
            tok = module.tokenizer
            max_len = getattr(module.model.config, "max_position_embeddings", None)
            trainer = getattr(module, "_trainer", None)
            world = trainer.world_size if trainer is not None else 1
            kwargs = dict(model_path=module.policy_path, eos_id=tok.eos_id, pad_id=tok.pad_id,
                          max_model_len=max_len, world_size=world)
            if accepts(self.engine_factory, "generation_batch"):  # engines written before it was added may not
                kwargs["generation_batch"] = -(-self.prompts_per_iter // world) * self.group_size
            self.engine = self.engine_factory(**kwargs)
            want = engine_dtype_for(trainer.precision if trainer is not None else None)
            have = getattr(self.engine, "dtype", None)
            if want and have and want != have:
                log.warning("the rollout engine samples in %s but the trainer computes in %s (precision=%s): "
                            "sampler and trainer log-probs will disagree; set rollout.dtype=%s or use the "
                            "precision/ group, which sets both", have, want, trainer.precision, want)

    def teardown(self, stage: str) -> None:
        if self.rewards is not None:
            self.rewards.close()
            self.rewards = None

    def close(self) -> None:
        self.teardown("fit")
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    # ---- one iteration ---------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        module = trainer.lightning_module
        for cb in trainer.callbacks:  # the iteration boundary: checkpoints are written here (callbacks/checkpoint.py)
            hook = getattr(cb, "on_rollout_start", None)
            if callable(hook):
                hook(trainer, module)
        batch = self.collect(module, iteration=trainer.current_epoch)
        t0 = time.perf_counter()
        for cb in trainer.callbacks:
            hook = getattr(cb, "on_rollout_batch", None)
            if callable(hook):
                hook(trainer, module, batch)
        batch.metrics["control/kept_frac"] = float(batch.keep.float().mean())
        batch.metrics["time/prepare"] = batch.metrics.get("time/prepare", 0.0) + time.perf_counter() - t0
        module.rollout = batch
        gen = torch.Generator().manual_seed(self.seed * 7919 + trainer.current_epoch)
        minibatches = []
        for _ in range(module.algo.ppo_epochs):
            minibatches.extend(batch.minibatches(module.algo.num_minibatches, generator=gen))
        if not minibatches:
            log.warning("iteration %d: every row was rejected; no update this iteration", trainer.current_epoch)
            minibatches = [batch.select(torch.arange(0))]  # one empty step keeps Lightning's epoch going
        # generator=: each iterator draws a seed, and Lightning makes more iterators in a fresh process's later
        # epochs than in a resumed one's first; from the global RNG that would break exact resume.
        return DataLoader(minibatches, batch_size=None, shuffle=False, collate_fn=lambda x: x, generator=gen)

    def collect(self, module: Any, iteration: int) -> RolloutBatch:
        """Steps 1–5: sync, prompts, generate, score, advantages and the pre-update pass.

        With ``algo.dynamic_sampling`` (DAPO) groups whose rewards are all equal are dropped and more
        prompts are drawn, up to ``algo.max_sampling_rounds`` extra rounds, until the batch is full.
        """
        with preserved_rng():  # vLLM seeds the global RNGs when it starts; a resumed run starts it later
            self._ensure_started(module)
        algo = module.algo
        metrics: dict[str, float] = {"time/generate": 0.0, "time/score": 0.0}
        t0 = time.perf_counter()
        self.engine.sync_weights(module.model)
        metrics["time/sync"] = time.perf_counter() - t0
        rounds = 1 + (algo.max_sampling_rounds if algo.dynamic_sampling else 0)
        kept: list[tuple] = []  # (prompt, prompt ids, generations, rewards, texts) per group
        first_round_metrics: dict[str, float] = {}
        errors = 0
        for rnd in range(rounds):
            groups, round_metrics, round_errors = self._generate_round(module, iteration, rnd, metrics)
            errors += round_errors
            if rnd == 0:
                first_round_metrics, first_groups = round_metrics, groups
            if algo.dynamic_sampling:
                groups = [g for g in groups if max(g[3]) != min(g[3])]
            kept.extend(groups[: self.prompts_per_iter - len(kept)])
            if len(kept) >= self.prompts_per_iter:
                break
        signal_groups = len(kept)
        if not kept:  # nothing to learn from: keep the first round (zero advantages, a no-op update)
            log.warning("iteration %d: every group had equal rewards in %d rounds", iteration, rounds)
            kept = first_groups
        tok = module.tokenizer
        batch = build_batch([g[1] for g in kept], [g[2] for g in kept], [r for g in kept for r in g[3]],
                            self.group_size, pad_id=tok.pad_id)
        batch.prompts = [g[0].text for g in kept for _ in range(self.group_size)]
        batch.completions = [t for g in kept for t in g[4]]
        metrics.update(first_round_metrics)  # rollout/* describe what the policy generated
        metrics["rollout/reward_errors"] = float(errors)
        if algo.dynamic_sampling:
            metrics["rollout/sampling_rounds"] = float(rnd + 1)
            metrics["rollout/kept_groups_frac"] = signal_groups / self.prompts_per_iter
        module.prepare_rollout(batch)
        batch.metrics = {**metrics, **batch.metrics}
        return batch

    def _generate_round(self, module: Any, iteration: int, rnd: int, metrics: dict) -> tuple[list, dict, int]:
        """Draw, generate and score one round of prompts: this rank's block, then all-gathered."""
        tok = module.tokenizer
        prompts = self.prompts.sample(self.prompts_per_iter, iteration, rnd)
        prompt_ids = [self.encode_prompt(tok, p.text) for p in prompts]
        first, last = dist.shard_bounds(len(prompts))
        t0 = time.perf_counter()
        seed = random.Random(f"{self.seed}:gen:{iteration}:{rnd}").randrange(2**30)
        gens = self.engine.generate(prompt_ids[first:last], self.group_size, self.sampling, seed=seed,
                                    first_index=first) if last > first else []
        metrics["time/generate"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        G = self.group_size
        if self.stop:
            gens = [[truncate_at_stop(g, tok.decode, self.stop) for g in per_prompt] for per_prompt in gens]
        flat = [g for per_prompt in gens for g in per_prompt]
        texts = [tok.decode([t for t in g.token_ids if t != tok.eos_id]) for g in flat]
        mine = prompts[first:last]
        scores, stats = self.rewards.score([p.text for p in mine for _ in range(G)], texts,
                                           [p.reference for p in mine for _ in range(G)])
        errors = stats.errors + stats.timeouts + stats.non_finite
        if self.overlong_buffer > 0:
            L = self.sampling.max_new_tokens
            scores = [r + soft_overlong_penalty(len(g.token_ids), L, self.overlong_buffer, self.overlong_penalty)
                      for r, g in zip(scores, flat, strict=True)]
        parts = dist.gather_objects((gens, scores, texts, errors))  # rank order = global prompt order
        gens = [per_prompt for p in parts for per_prompt in p[0]]
        scores = [s for p in parts for s in p[1]]
        texts = [t for p in parts for t in p[2]]
        errors = sum(p[3] for p in parts)
        metrics["time/score"] += time.perf_counter() - t0
        flat = [g for per_prompt in gens for g in per_prompt]
        batch = build_batch(prompt_ids, gens, scores, G, pad_id=tok.pad_id)
        round_metrics = rollout_metrics(batch, flat, texts, self.correct_threshold)
        groups = [(p, ids, g, scores[i * G : (i + 1) * G], texts[i * G : (i + 1) * G])
                  for i, (p, ids, g) in enumerate(zip(prompts, prompt_ids, gens, strict=True))]
        return groups, round_metrics, errors


def accepts(factory: Callable, name: str) -> bool:
    """Whether ``factory`` (a class, function or ``functools.partial``) takes keyword ``name``."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def build_batch(
    prompt_ids: list[list[int]], gens: list[list[Generation]], rewards: list[float], group_size: int, pad_id: int
) -> RolloutBatch:
    """Right-padded [B, L] tensors from per-prompt generations (rows of a group are contiguous)."""
    rows, resp_starts, lps = [], [], []
    for p, per_prompt in zip(prompt_ids, gens, strict=True):
        if len(per_prompt) != group_size:
            raise RuntimeError(f"engine returned {len(per_prompt)} completions for a prompt, expected {group_size}")
        for g in per_prompt:
            rows.append(p + g.token_ids)
            resp_starts.append(len(p))
            lps.append(g.logprobs)
    width = max(len(r) for r in rows)
    # Padded Python lists, then one tensor each (a tensor per row is most of the cost at 1,024 rows).
    input_ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    starts = torch.tensor(resp_starts)
    cols = torch.arange(width)
    attention = cols[None, :] < lengths[:, None]
    response = attention & (cols[None, :] >= starts[:, None])
    sampler_logp = torch.tensor([[0.0] * s + (lp or [0.0] * (len(r) - s)) + [0.0] * (width - len(r))
                                 for r, s, lp in zip(rows, resp_starts, lps, strict=True)], dtype=torch.float32)
    group_index = torch.arange(len(prompt_ids)).repeat_interleave(group_size)
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=response,
        rewards=torch.tensor(rewards, dtype=torch.float32), group_index=group_index, group_size=group_size,
        sampler_logp=sampler_logp,
    )


def rollout_metrics(batch: RolloutBatch, gens: list[Generation], texts: list[str], threshold: float) -> dict:
    rewards = batch.rewards
    correct = rewards >= threshold
    grouped = rewards.view(-1, batch.group_size)
    distinct: dict[int, set] = defaultdict(set)
    for i, (ok, text) in enumerate(zip(correct.tolist(), texts, strict=True)):
        if ok:
            distinct[i // batch.group_size].add(text.strip())
    num_prompts = grouped.shape[0]
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/accuracy": float(correct.float().mean()),
        "rollout/response_len_mean": float(batch.response_mask.sum(-1).float().mean()),
        "rollout/truncated_frac": sum(g.truncated for g in gens) / max(1, len(gens)),
        "rollout/zero_std_frac": float((grouped.max(-1).values == grouped.min(-1).values).float().mean()),
        "rollout/distinct_correct": sum(len(s) for s in distinct.values()) / max(1, num_prompts),
    }
