"""One side of the lit-entropy vs TRL benchmark, in a fresh interpreter:
``python -m benchmarks.vs_trl_sides SPEC.json``.

:mod:`benchmarks.vs_trl` writes SPEC (side, setting, iterations, Hydra overrides, output path) and reads
back a JSON of per-iteration wall seconds, phase seconds and accuracy. Both sides are derived from the
same composed Hydra config (``conf/train.yaml`` plus the overrides), so prompts, policy, sampling and
optimizer settings cannot drift apart:

* ``ours``: the real thing, ``lit_entropy.train.build`` + ``trainer.fit``, with a timing callback and a
  logger that captures our ``time/*`` and ``rollout/accuracy`` metrics.
* ``trl``: ``trl.GRPOTrainer`` on the same warm-started weights and token ids, the same Countdown
  prompts in iteration order, the Countdown verifier in-process, and the GRPOConfig of :func:`trl_config`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.vs_trl_patches import apply_vllm_cpu_patches


def compose(overrides: list[str]) -> Any:
    """``train.yaml`` plus ``overrides``, from the same config tree the commands read (a checkout's ``conf/``
    or an installed wheel's ``lit_entropy/conf``)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from lit_entropy.utils.config_path import config_dir

    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
        return hydra_compose(config_name="train", overrides=overrides)


class PhaseClock:
    """Exclusive wall time per phase: time spent in a nested phase is not counted in the outer one."""

    def __init__(self) -> None:
        self.totals: dict[str, float] = defaultdict(float)
        self._stack: list[list] = []  # [name, start, time in nested phases]

    def wrap(self, name: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._stack.append([name, time.perf_counter(), 0.0])
            try:
                return fn(*args, **kwargs)
            finally:
                _, start, nested = self._stack.pop()
                elapsed = time.perf_counter() - start
                self.totals[name] += elapsed - nested
                if self._stack:
                    self._stack[-1][2] += elapsed

        return timed

    def take(self) -> dict[str, float]:
        out, self.totals = dict(self.totals), defaultdict(float)
        return out


# ---- ours ------------------------------------------------------------------------------------------
def run_ours(spec: dict) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers.logger import Logger

    from lit_entropy.train import build
    from lit_entropy.utils.log_steps import ITERATION

    class Capture(Logger):
        """Keeps every logged ``time/*`` and ``rollout/accuracy`` value, keyed by epoch (= RL iteration, from 0;
        each iteration's values come with ``iteration`` = epoch + 1, lit_entropy/utils/log_steps.py)."""

        def __init__(self) -> None:
            super().__init__()
            self.by_epoch: dict[int, dict[str, float]] = defaultdict(dict)

        name = property(lambda self: "bench-capture")
        version = property(lambda self: 0)

        def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
            iteration = metrics.get(ITERATION)
            if iteration is None:  # an optimizer step's values
                return
            for key, value in metrics.items():
                if key.startswith("time/") or key == "rollout/accuracy":
                    self.by_epoch[int(iteration) - 1][key] = float(value)

        def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
            pass

    class IterationTimer(pl.Callback):
        """Wall time between consecutive epoch ends; the rollout runs in ``train_dataloader()`` before the
        epoch starts, so this interval holds one whole RL iteration (the first one also holds start-up)."""

        def __init__(self) -> None:
            self.last = (0.0, 0.0)
            self.seconds: list[tuple[float, float]] = []  # (wall, this process's CPU)

        def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            self.last = (time.perf_counter(), time.process_time())

        def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
            now = (time.perf_counter(), time.process_time())
            self.seconds.append((now[0] - self.last[0], now[1] - self.last[1]))
            self.last = now

    cfg = compose(spec["overrides"] + [f"paths.output_dir={spec['workdir']}"])
    trainer, module, datamodule = build(cfg)
    timer, capture = IterationTimer(), Capture()
    trainer.callbacks.append(timer)
    trainer.loggers = [*trainer.loggers, capture]
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        datamodule.close()
    iters = []
    for i, (seconds, cpu) in enumerate(timer.seconds):
        logged = capture.by_epoch.get(i, {})
        phases = {k.removeprefix("time/"): v for k, v in logged.items() if k.startswith("time/")}
        iters.append({"seconds": seconds, "cpu_seconds": cpu, "phases": phases,
                      "accuracy": logged.get("rollout/accuracy")})
    return {"iterations": iters}


# ---- TRL -------------------------------------------------------------------------------------------
def importance_sampling(cfg: Any) -> dict:
    """TRL's vLLM importance-sampling correction matching ``correction``: off, or token-level truncation at the
    same threshold (``correction=tis``)."""
    c = cfg.get("correction") or {}
    if c.get("name", "none") == "none":
        return {"vllm_importance_sampling_correction": False}
    if (c.get("name"), c.get("level"), c.get("mode")) != ("tis", "token", "truncate"):
        raise ValueError(f"no TRL equivalent of correction={c.get('name')} in this benchmark")
    return {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_max": float(c.threshold)}


def trl_config(cfg: Any, setting: str, iters: int, output_dir: str) -> dict:
    """GRPOConfig keyword arguments matching the composed lit-entropy config (docs/bench_trl.md)."""
    b, r, a, o = cfg.batch, cfg.rollout, cfg.algo, cfg.optim
    rows = b.prompts_per_iter * b.group_size
    minibatch, rem = divmod(rows, b.num_minibatches)
    accumulation, rem2 = divmod(minibatch, b.micro_batch_size)
    if rem or rem2:
        raise ValueError(f"{rows} rows / {b.num_minibatches} minibatches / micro-batch {b.micro_batch_size} "
                         "must divide exactly for TRL's batch arithmetic")
    return {
        "output_dir": output_dir, "seed": cfg.seed, "use_cpu": True, "bf16": "bf16" in str(cfg.trainer.precision),
        "fp16": False,
        "report_to": "none", "save_strategy": "no", "logging_steps": 1, "gradient_checkpointing": False,
        # Batches: TRL's "step" is a micro-batch; an optimizer step accumulates `gradient_accumulation_steps`.
        "per_device_train_batch_size": b.micro_batch_size, "gradient_accumulation_steps": accumulation,
        "steps_per_generation": b.num_minibatches * accumulation, "num_iterations": b.ppo_epochs,
        "max_steps": iters * b.num_minibatches * b.ppo_epochs, "shuffle_dataset": False,
        # Sampling.
        "num_generations": b.group_size, "max_completion_length": r.max_new_tokens,
        "temperature": r.temperature, "top_p": r.top_p, "top_k": 0,
        # Objective: group-normalised advantages, PPO clip, token-level ratio, no KL, token-mean over the step.
        "scale_rewards": "group", "loss_type": "dapo", "importance_sampling_level": "token",
        "epsilon": a.eps_low, "epsilon_high": a.eps_high, "beta": a.kl_coef, "mask_truncated_completions": False,
        # Optimizer: conf/optim/adamw.yaml (constant learning rate, no warm-up).
        "learning_rate": o.lr, "weight_decay": o.weight_decay, "adam_beta1": o.betas[0],
        "adam_beta2": o.betas[1], "adam_epsilon": o.eps, "max_grad_norm": o.max_grad_norm,
        "optim": "adamw_torch", "lr_scheduler_type": "constant", "warmup_steps": o.warmup_steps,
        # Rollout engine.
        "use_vllm": "vllm" in setting, "vllm_mode": "colocate", **importance_sampling(cfg),
        "vllm_gpu_memory_utilization": cfg.rollout.engine.get("gpu_memory_utilization", 0.3),
    }


def run_trl(spec: dict) -> dict:
    import torch
    from datasets import Dataset
    from hydra.utils import instantiate
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    cfg = compose(spec["overrides"])
    iters = spec["iters"]
    policy = instantiate(cfg.model).build()  # the same weights our side starts from
    tok = policy.tokenizer
    chat = bool(cfg.data.get("chat_template", False))
    hf_tok = tok.hf if chat else tok.to_hf()  # a real model's own tokenizer; the lab's as an HF tokenizer
    model_dir = Path(spec["workdir"]) / "policy"  # the weights, plus an HF tokenizer for vLLM to load
    shutil.copytree(policy.path, model_dir, dirs_exist_ok=True)
    hf_tok.save_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    source = instantiate(cfg.data.prompts)
    sampled = [p for it in range(iters) for p in source.sample(cfg.batch.prompts_per_iter, iteration=it)]
    texts, references = [p.text for p in sampled], [p.reference for p in sampled]
    system = cfg.data.get("system_prompt")
    if chat:  # conversational prompts: TRL applies the chat template, as our DataModule does
        prompts: list = [([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": t}]
                         for t in texts]
        for text, messages in list(zip(texts, prompts, strict=True))[:8]:
            theirs = hf_tok.apply_chat_template([messages], add_generation_prompt=True, tokenize=True,
                                                return_dict=True)["input_ids"][0]  # as TRL's generate calls it
            if list(theirs) != tok.encode_chat(text, system=system):
                raise AssertionError(f"TRL would tokenize {text!r} differently from lit-entropy")
    else:
        prompts = texts
        for text in texts[:8]:
            if hf_tok(text)["input_ids"] != tok.encode(text, add_bos=True):
                raise AssertionError(f"TRL would tokenize {text!r} differently from lit-entropy")
    accuracy: list[float] = []
    reward_fn, reward_kwargs, threshold = source.reward_fn, source.reward_kwargs, cfg.reward.correct_threshold

    def content(x: Any) -> str:  # a conversational prompt or completion: the last message's text
        return x[-1]["content"] if isinstance(x, list) else x

    def verifier(prompts: list, completions: list, reference: list | None = None, **_: Any) -> list[float]:
        refs = [json.loads(r) for r in reference] if reference else [None] * len(prompts)  # the dataset's column
        rewards = [float(reward_fn(content(p), content(c), r, **reward_kwargs))
                   for p, c, r in zip(prompts, completions, refs, strict=True)]
        accuracy.append(sum(r >= threshold for r in rewards) / max(1, len(rewards)))
        return rewards

    clock = PhaseClock()
    steps_per_iter = cfg.batch.num_minibatches * cfg.batch.ppo_epochs

    class Timed(GRPOTrainer):
        """Wraps TRL's own methods for the phase breakdown; nothing about what they do changes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            for name, method in (("generate", "_generate_single_turn"), ("score", "_calculate_rewards"),
                                 ("prepare", "_generate_and_score_completions"), ("other", "_prepare_inputs"),
                                 ("forward_backward", "training_step"), ("optimizer", "_clip_grad_norm")):
                setattr(self, method, clock.wrap(name, getattr(self, method)))
            self._logps = clock.wrap("prepare_forward", super()._get_per_token_logps_and_entropies)
            if getattr(self, "vllm_generation", None) is not None:
                gen = self.vllm_generation
                gen.sync_weights = clock.wrap("sync", gen.sync_weights)

        def _get_per_token_logps_and_entropies(self, *args: Any, **kwargs: Any) -> Any:
            if torch.is_grad_enabled():  # the update's forward: part of training_step's time
                return super()._get_per_token_logps_and_entropies(*args, **kwargs)
            return self._logps(*args, **kwargs)  # the pre-update (old log-prob) forward

    class IterationTimer(TrainerCallback):
        def __init__(self) -> None:
            self.last = (0.0, 0.0)
            self.opt_start = 0.0
            self.iterations: list[dict] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.last = (time.perf_counter(), time.process_time())
            clock.take()

        def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.opt_start = time.perf_counter()

        def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.totals["optimizer"] += time.perf_counter() - self.opt_start

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step % steps_per_iter:
                return
            now = (time.perf_counter(), time.process_time())
            phases = clock.take()
            phases["update"] = phases.get("forward_backward", 0.0) + phases.pop("optimizer", 0.0)
            phases["prepare"] = sum(phases.pop(k, 0.0) for k in ("prepare", "other")) + phases.get("prepare_forward", 0.0)
            self.iterations.append({"seconds": now[0] - self.last[0], "cpu_seconds": now[1] - self.last[1],
                                    "phases": phases})
            self.last = now

    patches = apply_vllm_cpu_patches(dtype=cfg.rollout.engine.get("dtype", "float32")) if "vllm" in spec["setting"] else {}
    args = GRPOConfig(**trl_config(cfg, spec["setting"], iters, str(Path(spec["workdir"]) / "trl")))
    timer = IterationTimer()
    trainer = Timed(model=model, reward_funcs=verifier, args=args, train_dataset=Dataset.from_dict(
                        {"prompt": prompts, "reference": [json.dumps(r) for r in references]}),
                    processing_class=hf_tok, callbacks=[timer])
    trainer.train()
    for it, acc in zip(timer.iterations, accuracy, strict=False):
        it["accuracy"] = acc
    return {"iterations": timer.iterations, "trl_config": trl_config(cfg, spec["setting"], iters, "<tmp>"),
            "patches": patches}


def main() -> None:
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # set before anything imports vLLM
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    spec = json.loads(Path(sys.argv[1]).read_text())
    Path(spec["workdir"]).mkdir(parents=True, exist_ok=True)
    result = (run_ours if spec["side"] == "ours" else run_trl)(spec)
    Path(spec["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
