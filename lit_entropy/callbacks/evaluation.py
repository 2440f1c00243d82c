"""PeriodicEvalCallback — the optional in-training validation loop.

Every ``every_n_iterations`` RL iterations (and after the last one, or the one where a callback such as
``callbacks/stop=diverged`` set ``trainer.should_stop``; with ``at_start`` also once before the
first update, logged at step 0, so a curve starts from the policy training began with) it samples ``n`` completions for
each of ``num_problems`` evaluation problems with the run's own sampler (engine, top_p and stop strings as
in training; ``temperature`` and ``max_new_tokens`` may differ) and scores them with the task's reward. An
evaluation after iteration k is logged with that iteration's metrics, at step k (lit_entropy/utils/log_steps.py). The
evaluation after the last iteration draws ``final_n`` samples per problem and reports pass@k for ``final_ks`` where
they are set (a study reads its large-k pass@k there only, and pays for 64 samples once).

Which problems: a prompt source with splits (generated arithmetic) gives its ``held_out`` split, disjoint from
every training problem by construction, and its ``transfer`` split; each is evaluated greedy (with ``greedy``) and
sampled, logged as ``eval/<split>/greedy/...`` and ``eval/<split>/sampled/...``
(:func:`lit_entropy.evaluation.evaluate_splits`). Any other source gives problems of its own stream under an
iteration key training never uses, logged as ``eval/accuracy``, ``eval/mean@k`` and ``eval/pass@k`` (unbiased
estimator) via :func:`lit_entropy.evaluation.evaluate`: fresh draws, not disjoint from training (for the Countdown
lab's space, 30 of the collapse regime's 64 evaluation prompts also occur in its 120 training iterations).
Each evaluation's duration is logged as ``time/evaluate``; the iteration's ``time/update`` leaves it out.

``num_problems`` may name the splits instead (``{held_out: 256, retention: 64}``): those only, each at its own size,
so a study's tuning runs read the ``tuning`` split alone and its evaluation runs never do. With ``per_problem`` each
evaluation also writes every problem's samples and correct ones per split and mode to
``<run>/eval_problems/iteration-<k>.json`` (the study's records keep the last one: problem-level uncertainty).

An evaluation can outlast the session that runs it (the verdicts study's last one draws 20,800 completions, hours on
a CPU). With ``resume`` (the default) each finished chunk of ``prompts_per_chunk`` problems is kept in
``<run>/eval_chunks/iteration-<k>-<fingerprint>/`` until the evaluation is done, then the folder is deleted. A run
killed during the evaluation and resumed from its last checkpoint trains the unfinished iteration again and, when its
weights come out identical (an exact resume: same machine, thread count and commit), reads the finished chunks back
and samples only the others; the result is the uninterrupted run's. The fingerprint is a digest of the policy's
weights, the sampler's settings and the evaluation's own; chunks under any other fingerprint are deleted, never
mixed in. One process only: a run on several ranks evaluates afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import lightning.pytorch as pl
import torch

from lit_entropy.evaluation import HELD_OUT_ITERATION, ChunkStore, evaluate, evaluate_splits
from lit_entropy.policy.models import PolicyBundle

log = logging.getLogger(__name__)

CHUNKS = "eval_chunks"
"""The folder of a run (``trainer.default_root_dir``) that keeps an unfinished evaluation's chunks."""


class EvaluationSource(Protocol):
    """What the evaluation reads of the run's rollout source (the DataModule): its prompts, its sampler and how it
    encodes a prompt. :func:`lit_entropy.train.build` hands it over (:meth:`PeriodicEvalCallback.evaluate_from`), so
    the callback never reaches for ``trainer.datamodule``."""

    prompts: Any
    sampler: Any

    def encode_prompt(self, tokenizer: Any, text: str) -> list[int]: ...


class PeriodicEvalCallback(pl.Callback):
    knobs: tuple[str, ...] = ()

    def __init__(
        self,
        every_n_iterations: int = 10,
        num_problems: int | Mapping[str, int] = 64,
        n: int = 8,
        ks: Sequence[int] = (1, 4, 8),
        temperature: float | None = None,
        max_new_tokens: int | None = None,
        seed: int = 0,
        at_start: bool = False,
        greedy: bool = True,
        final_n: int | None = None,
        final_ks: Sequence[int] | None = None,
        per_problem: bool = False,
        resume: bool = True,
        prompts_per_chunk: int = 64,
    ) -> None:
        if isinstance(num_problems, Mapping):
            num_problems = {str(k): int(v) for k, v in num_problems.items()}
            if any(v < 0 for v in num_problems.values()) or not any(num_problems.values()):
                raise ValueError(f"callbacks.eval.num_problems={num_problems}: counts must be >= 0, one at least > 0")
        elif int(num_problems) < 1:
            raise ValueError("callbacks.eval: every_n_iterations, num_problems, n and final_n must be >= 1")
        if int(prompts_per_chunk) < 1:
            raise ValueError(f"callbacks.eval.prompts_per_chunk={prompts_per_chunk} must be >= 1")
        if every_n_iterations < 1 or n < 1 or (final_n is not None and final_n < 1):
            raise ValueError("callbacks.eval: every_n_iterations, num_problems, n and final_n must be >= 1")
        for name, kk, nn in (("ks", ks, n), ("final_ks", final_ks or (), final_n or n)):
            bad = [k for k in kk if not 1 <= int(k) <= nn]
            if bad:
                raise ValueError(f"callbacks.eval.{name}={list(kk)}: every k must be in [1, {nn}]")
        self.every = every_n_iterations
        self.num_problems = num_problems
        self.n = n
        self.ks = tuple(int(k) for k in ks)
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.seed = seed
        self.at_start = bool(at_start)
        self.greedy = bool(greedy)
        self.final_n = int(final_n) if final_n is not None else n
        self.final_ks = tuple(int(k) for k in final_ks) if final_ks else self.ks
        self.per_problem = bool(per_problem)
        self.resume = bool(resume)
        self.prompts_per_chunk = int(prompts_per_chunk)
        self.source: EvaluationSource | None = None

    def evaluate_from(self, source: EvaluationSource) -> None:
        """The rollout source whose prompts, sampler and prompt encoding the evaluations use (set at build)."""
        self.source = source

    def headline_tags(self) -> list[str]:
        """The pass@k tags this callback logs, for the HParams table (lit_entropy/callbacks/dashboard.py): each
        split's greedy pass@1 (with ``greedy``) and sampled pass@k, or ``eval/pass@k`` for a source without splits,
        for every k of ``ks`` and ``final_ks``."""
        ks = sorted(set(self.ks) | set(self.final_ks))
        prompts = getattr(self.source, "prompts", None)
        if prompts is None or not hasattr(prompts, "eval_splits"):
            return [f"eval/pass@{k}" for k in ks]
        tags = []
        named = isinstance(self.num_problems, Mapping)  # the named splits with problems, else every split there is
        splits = [s for s, k in self.num_problems.items() if k > 0] if named else prompts.eval_splits(1, seed=self.seed)
        for split in splits:
            tags += [f"eval/{split}/greedy/pass@1"] if self.greedy else []
            tags += [f"eval/{split}/sampled/pass@{k}" for k in ks]
        return tags

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """With ``at_start``: the policy before any update (not again when a run resumes)."""
        if not self.at_start or trainer.current_epoch > 0 or trainer.global_step > 0:
            return
        metrics = self._evaluate(trainer, pl_module, iteration=0)
        for logger in trainer.loggers:  # at step 0 = iteration 0, before the first iteration's (step 1)
            logger.log_metrics(metrics, step=0)

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """After iteration k = ``current_epoch + 1``: logged with the iteration's values, at step k."""
        it = trainer.current_epoch
        # The last iteration: the run's end, or one where a callback stopped it (callbacks/stop=diverged).
        last = (trainer.max_epochs is not None and it + 1 >= trainer.max_epochs) or trainer.should_stop
        if (it + 1) % self.every and not last:
            return
        n, ks = (self.final_n, self.final_ks) if last else (self.n, self.ks)
        pl_module.log_dict(self._evaluate(trainer, pl_module, n, ks, iteration=it + 1), on_step=False, on_epoch=True,
                           batch_size=1)

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule, n: int | None = None,
                  ks: Sequence[int] | None = None, iteration: int = 0) -> dict[str, float]:
        n, ks = n or self.n, ks or self.ks
        started = time.perf_counter()
        source = self.source
        if source is None:
            raise RuntimeError("PeriodicEvalCallback has no rollout source: lit_entropy.train.build hands it one "
                               "(evaluate_from)")
        bundle = PolicyBundle(model=pl_module.model, tokenizer=pl_module.tokenizer, path=pl_module.policy_path)
        changes = {k: v for k, v in (("temperature", self.temperature), ("max_new_tokens", self.max_new_tokens))
                   if v is not None}  # the rest (top_p, stop strings, the reward runner) as in training
        sampler = source.sampler.with_sampling(**changes)

        def encode(text: str) -> list[int]:
            return source.encode_prompt(pl_module.tokenizer, text)

        store = self._chunk_store(trainer, pl_module, sampler, n, ks, iteration)
        chunked = {"prompts_per_chunk": self.prompts_per_chunk, "encode": encode, "store": store}
        if hasattr(source.prompts, "eval_splits"):
            result = evaluate_splits(bundle, source.prompts, sampler, self.num_problems, n=n, ks=ks,
                                     seed=self.seed, greedy=self.greedy, **chunked)
        else:
            if isinstance(self.num_problems, Mapping):
                raise ValueError(f"callbacks.eval.num_problems={self.num_problems} names splits, but this task has "
                                 "none: give a number")
            prompts = source.prompts.sample(self.num_problems, HELD_OUT_ITERATION)
            result = evaluate(bundle, prompts, sampler, n=n, ks=ks, seed=self.seed, **chunked)
        if store is not None:  # done: nothing of it is read again
            shutil.rmtree(store.folder, ignore_errors=True)
            if not any(store.folder.parent.iterdir()):
                store.folder.parent.rmdir()
        metrics = {k: float(v) for k, v in result.items() if k.startswith("eval/") and isinstance(v, float | int)}
        if self.per_problem and trainer.is_global_zero:
            write_problems(Path(trainer.default_root_dir) / "eval_problems" / f"iteration-{iteration:04d}.json",
                           iteration, result)
        return {**metrics, "time/evaluate": time.perf_counter() - started}

    def _chunk_store(self, trainer: pl.Trainer, pl_module: pl.LightningModule, sampler: Any, n: int,
                     ks: Sequence[int], iteration: int) -> ChunkStore | None:
        """With ``resume`` on one process: the store of this evaluation's chunks, its folder named by the iteration
        and the fingerprint; every other folder under ``eval_chunks`` (an evaluation of other weights or settings,
        or an earlier one left unfinished) is deleted first."""
        if not self.resume or trainer.world_size != 1:
            return None
        settings = {"sampling": repr(sampler.sampling), "engine": type(sampler.engine).__name__,
                    "threshold": sampler.reward.correct_threshold, "n": n, "ks": list(ks), "seed": self.seed,
                    "num_problems": self.num_problems, "greedy": self.greedy, "chunk": self.prompts_per_chunk}
        try:
            weights = weights_digest(pl_module.model)
        except (RuntimeError, TypeError, ValueError) as err:  # e.g. sharded (DTensor) weights: no resume, no harm
            log.warning("the evaluation after iteration %d keeps no chunks (its weights have no digest: %s)",
                        iteration, err)
            return None
        digest = hashlib.sha256(weights.encode())
        digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
        fingerprint = digest.hexdigest()[:16]
        root = Path(trainer.default_root_dir) / CHUNKS
        folder = root / f"iteration-{iteration:04d}-{fingerprint}"
        if root.is_dir():
            for stale in root.iterdir():
                if stale != folder:
                    log.warning("deleting %s: the chunks of another evaluation (other weights or settings)", stale)
                    shutil.rmtree(stale, ignore_errors=True)
        if folder.is_dir():
            log.info("evaluation after iteration %d: resuming from the chunks in %s", iteration, folder)
        return ChunkStore(folder, fingerprint)


def weights_digest(model: torch.nn.Module) -> str:
    """A SHA-256 of every parameter and buffer (name, dtype, shape, bytes): equal only for identical weights."""
    digest = hashlib.sha256()
    for name, tensor in sorted({**dict(model.named_parameters()), **dict(model.named_buffers())}.items()):
        tensor = tensor.detach()
        if hasattr(tensor, "full_tensor"):  # a sharded (DTensor) weight, as FSDP2 holds it: the whole of it
            tensor = tensor.full_tensor()
        flat = tensor.cpu().contiguous().reshape(-1)
        digest.update(f"{name}|{flat.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(flat.view(torch.uint8).numpy())  # no copy: hashlib reads the buffer
    return digest.hexdigest()


def problem_counts(result: dict[str, Any]) -> dict[str, dict[str, dict[str, list[Any]]]]:
    """``split -> mode -> {"problem", "num_samples", "num_correct"}`` lists in problem order, from
    :func:`~lit_entropy.evaluation.evaluate_splits`'s result (or ``evaluate``'s, as the split ``all``)."""
    splits = result.get("splits") or {"all": {"sampled": result}}
    return {split: {mode: {"problem": [p["prompt"] for p in r["per_problem"]],
                           "num_samples": [int(p["num_samples"]) for p in r["per_problem"]],
                           "num_correct": [int(p["num_correct"]) for p in r["per_problem"]]}
                    for mode, r in runs.items()}
            for split, runs in splits.items()}


def write_problems(path: Path, iteration: int, result: dict[str, Any]) -> None:
    """One evaluation's per-problem counts as JSON, written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"iteration": iteration, "splits": problem_counts(result)}, separators=(",", ":")))
    tmp.replace(path)
