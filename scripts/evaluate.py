"""Evaluate a policy with sampling: accuracy, mean@k and unbiased pass@k (DESIGN §6, §7.5).

Hydra form (the training config groups ``model=``, ``data=``, ``rollout=`` plus ``ckpt_path=`` and
``eval.*``, composed from ``conf/evaluate.yaml``)::

    python scripts/evaluate.py ckpt_path=logs/<task>/runs/<time>/checkpoints/last.ckpt eval.n=16 'eval.k=[1,4,16]'
    python scripts/evaluate.py data=jsonl data.prompts.path=my.jsonl eval.limit=50 eval.out=res.json
    python scripts/evaluate.py model=hf model.name_or_path=<dir> data=math500 rollout=vllm eval.limit=100

Option form (unchanged):
    python scripts/evaluate.py                                        # warm-started lab policy, Countdown
    python scripts/evaluate.py --ckpt logs/<task>/runs/<time>/checkpoints/last.ckpt -n 16 --k 1,4,16
    python scripts/evaluate.py --model-dir Qwen/Qwen2.5-Math-1.5B --data math500 --engine vllm --limit 100
    python scripts/evaluate.py --data jsonl --jsonl my.jsonl --question-field q --answer-field a --out res.json

The policy: ``--model-dir`` (any Hugging Face causal LM), else the lab policy. ``--ckpt`` loads a
Lightning checkpoint's weights (keys ``model.<hf key>``) into that model; without ``--model-dir`` the
model is rebuilt from the run's ``.hydra/config.yaml`` next to the checkpoint (or the lab defaults).
Countdown problems come from a held-out iteration of the prompt stream (never seen in training).
Math sets are read from ``../shared/data`` beside the repository (``--data-dir`` / ``$LIT_ENTROPY_DATA``).
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from lit_entropy.data.math_sources import DEFAULT_TEMPLATE, MATH_DATASETS, JSONLPrompts, MathDataset  # noqa: E402
from lit_entropy.data.prompts import CountdownPrompts  # noqa: E402
from lit_entropy.evaluation import evaluate  # noqa: E402
from lit_entropy.models import HFPolicy, PolicyBundle, TinyLabPolicy, WarmStart  # noqa: E402

log = logging.getLogger("evaluate")

HELD_OUT_ITERATION = 10**6
"""Countdown problems for evaluation come from this iteration key of the prompt stream."""
MATH_CHOICES = ["gsm8k", "gsm8k_train", "math500", "aime2024", "aime2025", "amc2023"]
assert set(MATH_CHOICES) == set(MATH_DATASETS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("policy")
    g.add_argument("--ckpt", type=Path, help="Lightning checkpoint (a run's checkpoints/last.ckpt)")
    g.add_argument("--model-dir", help="Hugging Face model directory or hub id (default: the lab policy)")
    g.add_argument("--cache-dir", type=Path, default=None,
                   help="warm-start cache of the lab policy (default $LIT_ENTROPY_CACHE or <repo>/.cache/lit_entropy)")
    g.add_argument("--warmstart-steps", type=int, default=None,
                   help="lab policy without --ckpt: warm-start steps (default: the lab's 800)")
    g = p.add_argument_group("data")
    g.add_argument("--data", default="countdown", choices=["countdown", *MATH_CHOICES, "jsonl"])
    g.add_argument("--data-dir", default=None, help="folder with the math JSONL files (default ../shared/data)")
    g.add_argument("--jsonl", type=Path, help="--data jsonl: the file")
    g.add_argument("--question-field", default="question")
    g.add_argument("--answer-field", default="answer")
    g.add_argument("--answer-transform", default="none", choices=["none", "gsm8k"],
                   help="gsm8k: the gold answer is what follows '####'")
    g.add_argument("--template", default=None,
                   help=f"prompt template with {{question}} (math default: {DEFAULT_TEMPLATE!r})")
    g.add_argument("--limit", type=int, default=None,
                   help="evaluate the first N problems (countdown: N problems, default 128)")
    g = p.add_argument_group("sampling")
    g.add_argument("-n", "--num-samples", dest="n", type=int, default=16, help="samples per problem")
    g.add_argument("--k", default=None, help="comma-separated k for pass@k / mean@k (default 1,4,16 up to n)")
    g.add_argument("--engine", default="hf", choices=["hf", "vllm"])
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--max-new-tokens", type=int, default=None, help="default: 16 for countdown, 512 for math")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--device", default="auto", help="auto, cpu or cuda (the HF engine's device)")
    g.add_argument("--dtype", default="float32", help="vLLM engine dtype")
    g = p.add_argument_group("scoring and output")
    g.add_argument("--reward-workers", type=int, default=2)
    g.add_argument("--reward-timeout", type=float, default=10.0, help="seconds per reward call")
    g.add_argument("--out", type=Path, help="write the results (metrics and per-problem counts) as JSON")
    g.add_argument("--quiet", action="store_true")
    args = p.parse_args(argv)
    if args.data == "jsonl" and args.jsonl is None:
        p.error("--data jsonl needs --jsonl PATH")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if args.k is None:
        args.ks = [k for k in (1, 4, 16) if k <= args.n]
    else:
        try:
            args.ks = sorted({int(x) for x in args.k.split(",") if x.strip()})
        except ValueError:
            p.error(f"--k must be comma-separated integers, got {args.k!r}")
    if not args.ks or args.ks[0] < 1 or args.ks[-1] > args.n:
        p.error(f"every k must be in [1, n={args.n}], got {args.ks}")
    if args.max_new_tokens is None:
        args.max_new_tokens = 16 if args.data == "countdown" else 512
    return args


# ------------------------------------------------------------------------------------------ policy


def find_run_config(ckpt: Path) -> Path | None:
    """The run's ``.hydra/config.yaml``: beside ``checkpoints/`` (or beside the checkpoint itself)."""
    for folder in (ckpt.resolve().parent.parent, ckpt.resolve().parent):
        candidate = folder / ".hydra" / "config.yaml"
        if candidate.is_file():
            return candidate
    return None


def load_run_config(ckpt: Path | None) -> Any:
    if ckpt is None:
        return None
    path = find_run_config(ckpt)
    if path is None:
        log.info("no .hydra/config.yaml next to %s: using the lab policy defaults", ckpt)
        return None
    from omegaconf import OmegaConf

    log.info("model spec from %s", path)
    return OmegaConf.load(path)


def load_checkpoint_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load ``model.<key>`` entries of a Lightning checkpoint's state dict into ``model``."""
    try:
        blob = torch.load(ckpt, map_location="cpu", weights_only=True)
    except Exception as err:  # callback states with custom objects: a trusted file of our own runs
        log.warning("weights-only load of %s failed (%s); loading it fully", ckpt, str(err).splitlines()[0])
        blob = torch.load(ckpt, map_location="cpu", weights_only=False)
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{ckpt}: no state_dict in the checkpoint")
    weights = {k[len("model."):]: v for k, v in state.items() if k.startswith("model.")}
    if not weights:
        raise ValueError(f"{ckpt}: no 'model.*' keys in the state dict (found e.g. {list(state)[:3]})")
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                         " (pass the run's --model-dir, or keep .hydra/config.yaml beside checkpoints/)")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()


def build_policy(args: argparse.Namespace, run_cfg: Any, scratch: Path) -> tuple[PolicyBundle, str]:
    """The bundle and a one-line description of where its weights come from."""
    cache_dir = args.cache_dir or Path(os.environ.get("LIT_ENTROPY_CACHE", ROOT / ".cache" / "lit_entropy"))
    if args.model_dir:
        spec: Any = HFPolicy(name_or_path=args.model_dir)
        what = f"HF model {args.model_dir}"
    elif run_cfg is not None and "model" in run_cfg:
        from hydra.utils import instantiate

        spec = instantiate(run_cfg.model)
        what = f"{type(spec).__name__} from the run config"
    else:
        spec = TinyLabPolicy(cache_dir=str(cache_dir))
        what = "warm-started lab policy"
    if isinstance(spec, TinyLabPolicy):
        if args.ckpt is not None:
            # The checkpoint brings the weights: build the architecture only, outside the user's cache.
            spec.warmstart = WarmStart(steps=0, batch_size=spec.warmstart.batch_size, lr=spec.warmstart.lr,
                                       seed=spec.warmstart.seed)
            spec.cache_dir = str(scratch)
        else:
            spec.cache_dir = str(cache_dir)
            if args.warmstart_steps is not None:
                spec.warmstart.steps = args.warmstart_steps
            what += f" ({spec.warmstart.steps} warm-start steps)"
    bundle = spec.build()
    if args.ckpt is not None:
        load_checkpoint_weights(bundle.model, args.ckpt)
        what += f" + weights of {args.ckpt}"
    bundle.model.eval()
    return bundle, what


# ------------------------------------------------------------------------------------------ data


def build_prompts(args: argparse.Namespace, run_cfg: Any) -> tuple[list, Any, dict, str]:
    """(prompts, reward_fn, reward_kwargs, description)."""
    if args.data == "countdown":
        task, seed = None, 1234
        prompts_cfg = run_cfg.get("data", {}).get("prompts") if run_cfg is not None else None
        if prompts_cfg is not None and str(prompts_cfg.get("_target_", "")).endswith("CountdownPrompts"):
            from hydra.utils import instantiate

            task = instantiate(prompts_cfg.task) if "task" in prompts_cfg else None
            seed = int(prompts_cfg.get("seed", seed))
        source = CountdownPrompts(task=task, seed=seed)
        limit = args.limit or 128
        prompts = source.sample(limit, iteration=HELD_OUT_ITERATION)
        return prompts, source.reward_fn, source.reward_kwargs, f"countdown (held-out iteration, {limit} problems)"
    template = args.template or DEFAULT_TEMPLATE
    if args.data == "jsonl":
        transform = None if args.answer_transform == "none" else args.answer_transform
        source = JSONLPrompts(args.jsonl, question_field=args.question_field, answer_field=args.answer_field,
                              answer_transform=transform, template=template, shuffle=False)
        name = str(args.jsonl)
    else:
        source = MathDataset(args.data, data_dir=args.data_dir, template=template, shuffle=False)
        name = args.data
    prompts = source.all_prompts()[: args.limit]
    return prompts, source.reward_fn, source.reward_kwargs, f"{name} ({len(prompts)} of {len(source)} problems)"


# ------------------------------------------------------------------------------------------ main


def make_engine(args: argparse.Namespace, bundle: PolicyBundle) -> Any:
    if args.engine == "hf":
        from lit_entropy.rollout.hf_engine import HFEngine

        device = args.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        bundle.model.to(device)
        return functools.partial(HFEngine)
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    return functools.partial(VLLMEngine, dtype=args.dtype)


def format_table(result: dict, header: str) -> str:
    rows = [("eval/accuracy", result["eval/accuracy"])]
    for k in result["ks"]:
        rows += [(f"eval/mean@{k}", result[f"eval/mean@{k}"]), (f"eval/pass@{k}", result[f"eval/pass@{k}"])]
    width = max(len(name) for name, _ in rows)
    lines = [header, f"{'metric':<{width}}  value", f"{'-' * width}  ------"]
    lines += [f"{name:<{width}}  {value:.4f}" for name, value in rows]
    lines.append(f"problems={result['num_problems']} samples={result['num_samples']} "
                 f"truncated={result['truncated_frac']:.3f} reward_failures={result['reward_failures']} "
                 f"generate={result['time/generate']:.1f}s score={result['time/score']:.1f}s")
    return "\n".join(lines)


def is_hydra_form(argv: list[str]) -> bool:
    """``key=value`` / ``group=option`` arguments only (no ``--option``): the Hydra form."""
    return bool(argv) and all("=" in a and not a.startswith("-") for a in argv)


def args_from_hydra(overrides: list[str]) -> tuple[argparse.Namespace, Any]:
    """Compose ``conf/evaluate.yaml`` with ``overrides``; return option-form args and the composed config."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="evaluate", overrides=overrides)
    ev = cfg.eval
    ks = sorted({int(k) for k in (ev.k if OmegaConf.is_list(ev.k) else [ev.k])})
    if not ks or ks[0] < 1 or ks[-1] > ev.n:
        raise ValueError(f"eval.k={ks}: every k must be in [1, eval.n={ev.n}]")
    engine = "vllm" if "VLLMEngine" in str(cfg.rollout.get("_target_", "")) else "hf"
    ckpt = Path(cfg.ckpt_path) if cfg.ckpt_path else None
    args = argparse.Namespace(
        ckpt=ckpt, model_dir=None, cache_dir=Path(cfg.paths.cache_dir), warmstart_steps=None, data="hydra",
        n=int(ev.n), ks=ks, engine=engine, temperature=float(ev.temperature), top_p=float(ev.top_p),
        max_new_tokens=int(ev.max_new_tokens), seed=int(cfg.seed), limit=ev.limit,
        reward_timeout=float(ev.reward_timeout_s), reward_workers=int(ev.reward_workers),
        out=Path(ev.out) if ev.out else None, quiet=False, device="auto", dtype=cfg.rollout.get("dtype", "float32"),
    )
    return args, cfg


def hydra_sources(args: argparse.Namespace, cfg: Any, overrides: list[str]) -> tuple[Any, Any]:
    """(run config for the policy, prompt source): the run's model unless ``model=`` was given."""
    from hydra.utils import instantiate

    run_cfg = load_run_config(args.ckpt)
    model_overridden = any(o.split("=")[0].lstrip("+~").split(".")[0] == "model" for o in overrides)
    if run_cfg is None or model_overridden:
        run_cfg = cfg
    return run_cfg, instantiate(cfg.data.prompts)


def hydra_prompts(source: Any, limit: int | None) -> tuple[list, str]:
    if isinstance(source, CountdownPrompts):
        limit = limit or 128
        return source.sample(limit, iteration=HELD_OUT_ITERATION), f"countdown (held-out iteration, {limit} problems)"
    prompts = source.all_prompts()[:limit]
    return prompts, f"{type(source).__name__} ({len(prompts)} of {len(source)} problems)"


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    if is_hydra_form(argv):
        args, cfg = args_from_hydra(argv)
        run_cfg, source = hydra_sources(args, cfg, argv)
    else:
        args, cfg, source = parse_args(argv), None, None
        run_cfg = load_run_config(args.ckpt)
    return run(args, run_cfg, source, cfg)


def run(args: argparse.Namespace, run_cfg: Any, source: Any = None, cfg: Any = None) -> dict:
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s: %(message)s")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lit-entropy-eval-") as scratch:
        bundle, policy_desc = build_policy(args, run_cfg, Path(scratch))
        if source is not None:  # Hydra form: the data group's prompt source
            prompts, data_desc = hydra_prompts(source, args.limit)
            reward_fn, reward_kwargs = source.reward_fn, source.reward_kwargs
        else:
            prompts, reward_fn, reward_kwargs, data_desc = build_prompts(args, run_cfg)
        engine = make_engine(args, bundle)
        encode = None
        if cfg is not None and cfg.data.get("chat_template"):
            system = cfg.data.get("system_prompt")
            encode = lambda text: bundle.tokenizer.encode_chat(text, system=system)  # noqa: E731
        result = evaluate(
            bundle, prompts, reward_fn, engine, n=args.n, ks=args.ks, temperature=args.temperature,
            max_new_tokens=args.max_new_tokens, seed=args.seed, reward_kwargs=reward_kwargs, top_p=args.top_p,
            reward_timeout_s=args.reward_timeout, reward_workers=args.reward_workers, encode=encode,
        )
    result["config"] = {
        "policy": policy_desc, "data": data_desc, "engine": args.engine, "n": args.n, "ks": args.ks,
        "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.max_new_tokens,
        "seed": args.seed, "ckpt": str(args.ckpt) if args.ckpt else None, "model_dir": args.model_dir,
    }
    result["time/total"] = time.perf_counter() - t0
    header = f"policy: {policy_desc}\ndata: {data_desc}\nengine={args.engine} n={args.n} T={args.temperature}"
    print(format_table(result, header))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2))
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
