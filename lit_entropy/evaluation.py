"""Evaluation: n answers per problem, scored in isolation, reported as accuracy, mean@k, pass@k.

`evaluate` is what ``scripts/evaluate.py`` and the periodic in-training evaluation run: any policy bundle,
prompt list and :class:`~lit_entropy.rollout.sampler.Sampler` (HF ``generate`` or vLLM). Metric names:
``eval/accuracy``, ``eval/mean@k``, ``eval/pass@k`` (the unbiased estimator), ``eval/length`` (mean completion
tokens) and, when the task can tell them, ``eval/format`` and ``eval/first_number``.

`evaluate_splits` is the evaluation of a task with named splits (generated arithmetic: ``held_out``, disjoint
from training by construction, and ``transfer``): per split a greedy pass (one argmax completion per problem)
and a sampled one at the run's temperature, logged as ``eval/<split>/greedy/<metric>`` and
``eval/<split>/sampled/<metric>``. Greedy and sampled scores are kept apart because sharpening alone (a
lower entropy) raises sampled pass@1 without the greedy answer changing; ``format`` (the completion is the
answer alone) and ``first_number`` (a lenient reading: the first number is right) tell "learned to stop"
from "learned to add".

An evaluation of many problems can outlast the process that runs it (a 20,000-completion evaluation takes hours on
a CPU). Given a :class:`ChunkStore`, each finished chunk is written to disk and an evaluation started again reads
the finished chunks back and samples only the rest: chunk ``j``'s sampling seed depends on (``seed``, ``j``) alone,
so the result is the uninterrupted evaluation's (its times add the chunks' original times).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from lit_entropy.metrics.passk import Accuracy, MeanAtK, PassAtK
from lit_entropy.policy.models import PolicyBundle
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.tasks.prompts import Prompt

log = logging.getLogger(__name__)

__all__ = ["HELD_OUT_ITERATION", "ChunkStore", "evaluate", "evaluate_splits", "eval_prompts"]

HELD_OUT_ITERATION = 10**6
"""The prompt-stream key of evaluation problems from a generated stream without splits (training uses iterations
0 … max_epochs − 1). A key training never uses is not a disjoint set: for Countdown a training batch could hold
the same problem by chance (a large space, but nothing excludes it). Sources with ``eval_splits`` (generated
arithmetic) give problems that are disjoint by construction instead."""


def eval_prompts(source: Any, limit: int | None, default: int = 128) -> list[Prompt]:
    """Evaluation problems of a prompt source without splits: a finite dataset's first ``limit`` (all by
    default), or ``limit`` (default ``default``) problems of a generated stream under an iteration key that
    training never uses (:data:`HELD_OUT_ITERATION`; not checked against training's problems)."""
    if hasattr(source, "all_prompts"):
        return source.all_prompts()[:limit]
    return source.sample(limit or default, iteration=HELD_OUT_ITERATION)


@dataclass(frozen=True)
class ChunkStore:
    """Where an evaluation keeps its finished chunks, one JSON file each (``<prefix>-<j>.json`` in ``folder``).

    A chunk is read back only when its file was written under the same ``fingerprint`` (what the caller says fixes
    the results: the policy, the sampler's settings, the seed) and for the same problems, ``n`` and sampling seed;
    any other file is an error that names it, never a silent mix of two evaluations."""

    folder: Path
    """The folder of the chunk files (``scripts/evaluate.py``: ``<eval.out>.chunks``)."""
    fingerprint: str
    """A digest of everything besides the problems that decides a chunk's results."""
    prefix: str = "all"
    """The evaluation's part (``<split>-<mode>`` in a split evaluation)."""

    def scoped(self, prefix: str) -> ChunkStore:
        return replace(self, prefix=prefix)

    def path(self, j: int) -> Path:
        return Path(self.folder) / f"{self.prefix}-{j:04d}.json"

    def load(self, j: int, key: str) -> dict[str, Any] | None:
        """Chunk ``j``'s results, or None when it is not finished."""
        path = self.path(j)
        if not path.is_file():
            return None
        try:
            record = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path} is not a finished chunk ({err}); delete it to evaluate the chunk again") from err
        if record.get("fingerprint") != self.fingerprint or record.get("key") != key:
            raise ValueError(f"{path} holds a chunk of another evaluation (another policy, sampler setting, seed or "
                             f"problems); delete {self.folder} or choose another output to start this one afresh")
        return record["chunk"]

    def save(self, j: int, key: str, chunk: dict[str, Any]) -> None:
        """Write chunk ``j`` under a temporary name, then rename: a killed write leaves no half chunk."""
        path = self.path(j)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"fingerprint": self.fingerprint, "key": key, "chunk": chunk}))
        os.replace(tmp, path)


def _chunk_key(chunk: Sequence[Prompt], n: int, chunk_seed: int, keep_completions: int) -> str:
    texts = [[p.text, _jsonable(p.reference)] for p in chunk]
    blob = json.dumps([texts, n, chunk_seed, keep_completions], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def evaluate(
    policy: PolicyBundle,
    prompts: Sequence[Prompt],
    sampler: Sampler,
    n: int = 16,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    *,
    prompts_per_chunk: int = 64,
    keep_completions: int = 1,
    encode: Callable[[str], list[int]] | None = None,
    answer_stats: Callable[[str, Any], dict[str, float]] | None = None,
    store: ChunkStore | None = None,
) -> dict[str, Any]:
    """Sample ``n`` completions per prompt with a started ``sampler``, score them, and return the metrics.

    The sampler (:class:`~lit_entropy.rollout.sampler.Sampler`) is the one training samples with, or one
    built from the same ``rollout`` and ``reward`` groups: same engine, sampling settings and stop strings,
    same isolated reward runner (a reward that raises or hangs scores 0 and is counted in
    ``reward_failures``). Rewards are not shaped: a completion is correct when its reward is
    >= ``reward.correct_threshold``. The engine is synced to ``policy.model`` first. Prompts are sampled
    ``prompts_per_chunk`` at a time; chunk ``j`` uses a seed derived from (``seed``, ``j``), so results are
    reproducible for a fixed chunk size. ``encode`` turns a prompt's text into token ids (default: the text
    after BOS; a run with ``data.chat_template=true`` passes its DataModule's ``encode_prompt``).

    Returns ``eval/accuracy``, ``eval/mean@k`` and ``eval/pass@k`` for each k, ``num_problems``,
    ``num_samples``, ``reward_failures``, ``time/generate``, ``time/score``, and ``per_problem``: for
    each prompt its text, reference, ``num_samples``, ``num_correct`` and its first
    ``keep_completions`` completions. ``answer_stats(completion, reference)`` (a task's, e.g. the arithmetic
    prompt source's) adds the mean of each statistic it returns over all samples as ``eval/<name>``. With a
    ``store``, finished chunks are read back from it and every newly sampled chunk is written to it.
    """
    ks = sorted({int(k) for k in ks})
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not ks or ks[0] < 1 or ks[-1] > n:
        raise ValueError(f"every k must be in [1, n={n}], got {ks}")
    if not prompts:
        raise ValueError("no prompts to evaluate")
    tok = policy.tokenizer
    threshold = sampler.reward.correct_threshold
    counts: list[tuple[int, int]] = []
    kept: list[list[str]] = []
    truncated = tokens = 0
    stat_sums: dict[str, float] = {}
    t_gen = t_score = 0.0
    failures = 0
    sampler.sync(policy.model)
    for j, start in enumerate(range(0, len(prompts), prompts_per_chunk)):
        chunk = list(prompts[start : start + prompts_per_chunk])
        chunk_seed = random.Random(f"{seed}:eval:{j}").randrange(2**30)
        key = _chunk_key(chunk, n, chunk_seed, keep_completions)
        done = store.load(j, key) if store is not None else None
        if done is None:
            done = _sample_chunk(chunk, sampler, n, chunk_seed, threshold, keep_completions, answer_stats,
                                 [encode(p.text) if encode else tok.encode(p.text, add_bos=True) for p in chunk])
            if store is not None:
                store.save(j, key, done)
        else:
            log.info("chunk %d of %s read back from %s", j, store.prefix, store.path(j))
        t_gen += done["time_generate"]
        t_score += done["time_score"]
        truncated += done["truncated"]
        tokens += done["tokens"]
        failures += done["reward_failures"]
        for name, value in done["stat_sums"].items():
            stat_sums[name] = stat_sums.get(name, 0.0) + value
        counts += [(s, c) for s, c in done["counts"]]
        kept += done["kept"]
        log.info("evaluated %d/%d problems", len(counts), len(prompts))

    num_samples = torch.tensor([c[0] for c in counts])
    num_correct = torch.tensor([c[1] for c in counts])
    acc = Accuracy()
    acc.update(num_samples, num_correct)
    out: dict[str, Any] = {"eval/accuracy": float(acc.compute())}
    for k in ks:
        mean_k, pass_k = MeanAtK(k), PassAtK(k)
        mean_k.update(num_samples, num_correct)
        pass_k.update(num_samples, num_correct)
        out[f"eval/mean@{k}"] = float(mean_k.compute())
        out[f"eval/pass@{k}"] = float(pass_k.compute())
    total = max(1, int(num_samples.sum()))
    out["eval/length"] = tokens / total
    out.update({f"eval/{name}": value / total for name, value in stat_sums.items()})
    out.update({
        "num_problems": len(counts),
        "num_samples": int(num_samples.sum()),
        "n": n,
        "ks": ks,
        "truncated_frac": truncated / max(1, int(num_samples.sum())),
        "reward_failures": failures,
        "time/generate": t_gen,
        "time/score": t_score,
        "per_problem": [
            {"prompt": p.text, "reference": _jsonable(p.reference), "num_samples": s, "num_correct": c,
             "completions": texts}
            for p, (s, c), texts in zip(prompts, counts, kept, strict=True)
        ],
    })
    return out


def _sample_chunk(chunk: list[Prompt], sampler: Sampler, n: int, chunk_seed: int, threshold: float,
                  keep_completions: int, answer_stats: Callable[[str, Any], dict[str, float]] | None,
                  ids: list[list[int]]) -> dict[str, Any]:
    """One chunk sampled and scored: what :func:`evaluate` sums over its chunks (JSON-ready, for a store)."""
    failures_before = sampler.reward_failures
    out = sampler.sample(chunk, ids, n, chunk_seed, shaped=False)
    stat_sums: dict[str, float] = {}
    if answer_stats is not None:
        for i, text in enumerate(out.texts):
            for name, value in answer_stats(text, chunk[i // n].reference).items():
                stat_sums[name] = stat_sums.get(name, 0.0) + float(value)
    rewards = [out.rewards[i * n : (i + 1) * n] for i in range(len(chunk))]
    return {"counts": [[n, int(sum(r >= threshold for r in row))] for row in rewards],
            "kept": [list(out.texts[i * n : i * n + keep_completions]) for i in range(len(chunk))],
            "truncated": int(sum(g.truncated for per in out.generations for g in per)),
            "tokens": int(sum(len(g.token_ids) for per in out.generations for g in per)),
            "stat_sums": stat_sums, "time_generate": float(out.time_generate), "time_score": float(out.time_score),
            "reward_failures": int(sampler.reward_failures - failures_before)}


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def evaluate_splits(
    policy: PolicyBundle,
    source: Any,
    sampler: Sampler,
    num_problems: int | Mapping[str, int],
    n: int = 8,
    ks: Sequence[int] = (1,),
    seed: int = 0,
    *,
    greedy: bool = True,
    prompts_per_chunk: int = 64,
    encode: Callable[[str], list[int]] | None = None,
    store: ChunkStore | None = None,
) -> dict[str, Any]:
    """Evaluate on every split of ``source.eval_splits(num_problems, seed)``: greedy (with ``greedy``) and sampled.
    ``num_problems`` a mapping: those splits only, each with its own number of problems (0 leaves a split out).

    ``seed`` picks the problems and the sampling seeds; it is the evaluation's own, so runs of different seeds
    are evaluated on the same problems. Returns the flat metrics ``eval/<split>/greedy/<m>`` and
    ``eval/<split>/sampled/<m>`` and, under ``splits``, each split's full :func:`evaluate` results. ``store``:
    as :func:`evaluate`'s, each split and mode under its own prefix.
    """
    stats = getattr(source, "answer_stats", None)
    out: dict[str, Any] = {"splits": {}}
    for split, prompts in split_problems(source, num_problems, seed).items():
        def part(mode: str, split: str = split) -> ChunkStore | None:
            return None if store is None else store.scoped(f"{split}-{mode}")

        runs = {"sampled": evaluate(policy, prompts, sampler, n=n, ks=ks, seed=seed, encode=encode,
                                    prompts_per_chunk=prompts_per_chunk, answer_stats=stats, store=part("sampled"))}
        if greedy:
            runs["greedy"] = evaluate(policy, prompts, sampler.with_sampling(greedy=True), n=1, ks=(1,), seed=seed,
                                      encode=encode, prompts_per_chunk=prompts_per_chunk, answer_stats=stats,
                                      store=part("greedy"))
        for mode, result in runs.items():
            out.update({f"eval/{split}/{mode}/{key[5:]}": value for key, value in result.items()
                        if key.startswith("eval/") and not (mode == "greedy" and key in ("eval/accuracy", "eval/mean@1"))})
        out["splits"][split] = runs
    return out


def split_problems(source: Any, num_problems: int | Mapping[str, int], seed: int) -> dict[str, list[Any]]:
    """The evaluation problems of each split: ``source.eval_splits(num_problems, seed)`` for a count, the named
    splits at their own counts for a mapping (a split the source does not have is an error that names those it has)."""
    if not isinstance(num_problems, Mapping):
        return source.eval_splits(int(num_problems), seed=seed)
    have = list(source.eval_splits(1, seed=seed))
    unknown = sorted(set(num_problems) - set(have))
    if unknown:
        raise ValueError(f"evaluation splits {unknown} are not splits of this task, which has {have} (tuning and "
                         "retention need the task's tuning_share > 0 and retention: true)")
    return {split: source.problems(int(count), seed, split) for split, count in num_problems.items() if int(count) > 0}
