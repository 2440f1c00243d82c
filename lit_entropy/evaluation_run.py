"""``scripts/evaluate.py``: compose ``conf/evaluate.yaml``, build the policy and the sampler, evaluate.

The policy is the ``model`` group's, or — with ``ckpt_path=`` and no ``model=<option>`` choice — the model of
the run that wrote the checkpoint (its ``.hydra/config.yaml``), with the checkpoint's weights loaded. The
prompts are the ``data`` group's prompt source (a generated stream such as Countdown gives held-out
problems, a dataset its first ``eval.limit``); sampling and scoring are the ``rollout`` and ``reward``
groups', through the same :class:`~lit_entropy.rollout.sampler.Sampler` as training.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lit_entropy.evaluation import ChunkStore, eval_prompts, evaluate, evaluate_splits
from lit_entropy.policy.from_run import build_policy
from lit_entropy.train import build_sampler
from lit_entropy.utils.config_path import config_dir

log = logging.getLogger(__name__)

CONF = config_dir()  # the checkout's conf/, or lit_entropy/conf in an installed wheel


def compose_evaluate(overrides: list[str]) -> DictConfig:
    """``conf/evaluate.yaml`` composed with ``overrides``."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="evaluate", overrides=list(overrides))


def format_table(result: dict, header: str) -> str:
    rows = [("eval/accuracy", result["eval/accuracy"])]
    for k in result["ks"]:
        rows += [(f"eval/mean@{k}", result[f"eval/mean@{k}"]), (f"eval/pass@{k}", result[f"eval/pass@{k}"])]
    rows += [(key, value) for key, value in result.items()
             if key in ("eval/length", "eval/format", "eval/first_number")]
    width = max(len(name) for name, _ in rows)
    lines = [header, f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    lines += [f"{name:<{width}}  {value:.4f}" for name, value in rows]
    lines.append(f"problems={result['num_problems']} samples={result['num_samples']} "
                 f"truncated={result['truncated_frac']:.3f} reward_failures={result['reward_failures']} "
                 f"generate={result['time/generate']:.1f}s score={result['time/score']:.1f}s")
    return "\n".join(lines)


def split_limit(limit: Any) -> int | dict[str, int] | None:
    """``eval.limit`` checked: null, a count >= 1, or a mapping ``{split: count}`` (counts >= 0; 0 leaves a split out)
    that evaluates those splits of a task with splits (``data=arithmetic``), each at its own count."""
    if limit is None:
        return None
    if OmegaConf.is_dict(limit) or isinstance(limit, dict):
        counts = {str(k): v for k, v in (OmegaConf.to_container(limit) if OmegaConf.is_dict(limit) else limit).items()}
        bad = {k: v for k, v in counts.items() if not isinstance(v, int) or isinstance(v, bool) or v < 0}
        if bad or not any(counts.values()):
            raise ValueError(f"eval.limit={counts}: each split's count must be an integer >= 0, one of them > 0")
        return counts
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"eval.limit={limit} must be >= 1 (or null, or a mapping of splits to counts)")
    return limit


def run(cfg: DictConfig, model_overridden: bool = False) -> dict:
    """Evaluate the composed config's policy; print the table(s), write ``eval.out``; return the result."""
    ev = cfg.eval
    ks = sorted({int(k) for k in (ev.k if OmegaConf.is_list(ev.k) else [ev.k])})
    if not ks or ks[0] < 1 or ks[-1] > ev.n:
        raise ValueError(f"eval.k={ks}: every k must be in [1, eval.n={ev.n}]")
    limit = split_limit(ev.limit)
    t0 = time.perf_counter()
    sampler = build_sampler(cfg)
    dm = instantiate(cfg.data, _partial_=True)(sampler=sampler)  # the prompt source and its formatting
    splits = hasattr(dm.prompts, "eval_splits")
    if isinstance(limit, dict) and not splits:
        raise ValueError(f"eval.limit={limit} names splits, but data's {type(dm.prompts).__name__} has none: give a "
                         "number")
    prompts = [] if splits else eval_prompts(dm.prompts, limit)
    with tempfile.TemporaryDirectory(prefix="lit-entropy-eval-") as scratch:
        bundle, policy_desc = build_policy(cfg, model_overridden, Path(scratch), prompts=dm.prompts)
        if "HFEngine" in str(cfg.rollout.engine.get("_target_", "")):
            device = "cuda" if ev.device == "auto" and torch.cuda.is_available() else ev.device
            bundle.model.to("cpu" if device == "auto" else device)
        sampler.start(bundle, dm.prompts.reward_fn, dm.prompts.reward_kwargs)

        def encode(text: str) -> list[int]:
            return dm.encode_prompt(bundle.tokenizer, text)

        store = chunk_store(cfg)
        try:
            if splits:
                result = evaluate_splits(bundle, dm.prompts, sampler, limit or 128, n=int(ev.n), ks=ks,
                                         seed=int(cfg.seed), greedy=bool(ev.greedy),
                                         prompts_per_chunk=int(ev.prompts_per_chunk), encode=encode, store=store)
            else:
                result = evaluate(bundle, prompts, sampler, n=int(ev.n), ks=ks, seed=int(cfg.seed),
                                  prompts_per_chunk=int(ev.prompts_per_chunk), encode=encode, store=store)
        finally:
            sampler.close()
    engine = str(cfg.rollout.engine._target_).rsplit(".", 1)[-1]
    count = {name: len(runs["sampled"]["per_problem"]) for name, runs in result["splits"].items()} if splits \
        else len(prompts)
    data_desc = f"{type(dm.prompts).__name__} ({count} problems)"
    result["config"] = {"policy": policy_desc, "data": data_desc, "engine": engine, "n": int(ev.n), "ks": ks,
                        "sampling": OmegaConf.to_container(cfg.rollout, resolve=True), "seed": int(cfg.seed),
                        "ckpt": cfg.ckpt_path}
    result["time/total"] = time.perf_counter() - t0
    s = sampler.sampling
    header = f"policy: {policy_desc}\ndata: {data_desc}\nengine={engine} n={ev.n} T={s.temperature} top_p={s.top_p}"
    if splits:
        print(header)
        for name, runs in result["splits"].items():
            for mode, part in runs.items():
                print(format_table(part, f"\n[{name}, {mode}]" + (" (T=0, one completion per problem)"
                                                                  if mode == "greedy" else "")))
    else:
        print(format_table(result, header))
    if ev.out:
        out = Path(ev.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        print(f"wrote {out}")
        if store is not None:  # the result holds every chunk now
            shutil.rmtree(store.folder, ignore_errors=True)
    return result


def chunk_store(cfg: DictConfig) -> ChunkStore | None:
    """``eval.resume`` with ``eval.out``: the finished chunks kept in ``<eval.out>.chunks/`` until the result is
    written, so that the same command, run again after a kill, samples only the chunks not yet finished. The
    fingerprint is everything that decides a chunk's results besides its problems: the model, rollout, reward and
    data groups, the seed, the evaluation's settings and the checkpoint file (its path, size and time)."""
    ev = cfg.eval
    if not ev.get("resume", True) or not ev.out:
        return None
    parts = {name: OmegaConf.to_container(cfg[name], resolve=True) for name in ("model", "rollout", "reward", "data")}
    parts["eval"] = {k: v for k, v in OmegaConf.to_container(ev, resolve=True).items() if k not in ("out", "resume")}
    parts["seed"], parts["ckpt_path"] = int(cfg.seed), cfg.ckpt_path
    if cfg.ckpt_path and Path(cfg.ckpt_path).is_file():
        stat = Path(cfg.ckpt_path).stat()
        parts["ckpt_file"] = [stat.st_size, stat.st_mtime_ns]
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return ChunkStore(Path(str(ev.out) + ".chunks"), digest)


USAGE = """usage: lit-entropy-eval [--help] [--cfg {job,hydra,all}] [key=value | group=option ...]
       (scripts/evaluate.py takes the same arguments)

Evaluate a policy with sampling: accuracy, mean@k and unbiased pass@k. The arguments are Hydra overrides of
conf/evaluate.yaml: the training groups that describe a policy, how it samples and how it is scored, plus
ckpt_path= and eval.*. --cfg prints the composed config unresolved (job: without hydra's node) and evaluates nothing.

  lit-entropy-eval                                                  # the warm-started lab policy
  lit-entropy-eval ckpt_path=<run>/checkpoints/last.ckpt eval.n=16 'eval.k=[1,4,16]'
  lit-entropy-eval model=hf model.name_or_path=<dir> data=math500 rollout=vllm eval.limit=100
"""

CFG_FLAGS = ("job", "hydra", "all")


def usage() -> str:
    """:data:`USAGE`, the options of each group and ``conf/evaluate.yaml``'s own keys with their defaults."""
    groups = [g for g in OmegaConf.load(CONF / "evaluate.yaml").get("defaults", []) if isinstance(g, DictConfig)]
    lines = [USAGE, "groups (group=option):"]
    for name in sorted(key for g in groups for key in g):
        options = sorted(p.stem for p in (CONF / name).glob("*.yaml"))
        lines.append(f"  {name}: {', '.join(options)}")
    own = OmegaConf.load(CONF / "evaluate.yaml")
    own.pop("defaults", None)
    lines += ["", "keys (key=value), with their defaults:", OmegaConf.to_yaml(own).rstrip()]
    return "\n".join(lines)


def print_config(which: str, overrides: list[str]) -> None:
    """Hydra's ``--cfg {job,hydra,all}``: the composed config (or hydra's node) as YAML, unresolved."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=list(overrides),
                      return_hydra_config=which != "job")
    print(OmegaConf.to_yaml(cfg.hydra if which == "hydra" else cfg), end="")


def main(argv: list[str]) -> dict:
    """``scripts/evaluate.py key=value ...``: Hydra overrides of ``conf/evaluate.yaml``; ``--help`` prints the usage
    and exits 0, ``--cfg {job,hydra,all}`` prints the composed config and evaluates nothing."""
    argv = list(argv)
    if {"-h", "--help"} & set(argv):
        print(usage())
        raise SystemExit(0)
    for flag in ("--cfg", "-c"):
        if flag in argv:
            i = argv.index(flag)
            which = argv[i + 1] if i + 1 < len(argv) else None
            if which not in CFG_FLAGS:
                raise SystemExit(f"{flag} takes one of {list(CFG_FLAGS)}, got {which!r}")
            print_config(which, argv[:i] + argv[i + 2:])
            return {}
    bad = [a for a in argv if a.startswith("-") or "=" not in a]
    if bad:
        raise SystemExit(f"scripts/evaluate.py takes Hydra overrides (key=value, group=option); got {bad}. "
                         "E.g. ckpt_path=<run>/checkpoints/last.ckpt eval.n=16 'eval.k=[1,4,16]' data=math500 (--help: usage)")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    model_overridden = any(a.split("=")[0].lstrip("+~") == "model" for a in argv)  # a model=<option> choice
    return run(compose_evaluate(argv), model_overridden)
