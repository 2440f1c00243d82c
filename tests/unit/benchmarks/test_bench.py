"""scripts/bench.py (benchmarks.components) end to end, entropy benchmark only (no vLLM needed; a few seconds)."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_quick_entropy_bench_writes_json_and_markdown(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--quick", "--only", "entropy", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr

    report = json.loads((out / "bench.json").read_text())
    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch"]
    assert report["settings"]["quick"] and report["settings"]["only"] == ["entropy"]
    assert set(report["results"]) == {"entropy"}
    rows = report["results"]["entropy"]["rows"]
    assert {r["mode"] for r in rows} == {"fwd", "fwd+bwd"}
    repeats = report["settings"]["repeats"]
    for row in rows:
        for impl in ("chunked", "naive"):
            m = row[impl]
            assert len(m["seconds"]) == repeats
            assert all(math.isfinite(s) and s > 0 for s in m["seconds"] + [m["median_s"]])
            assert m["peak_extra_bytes"] is None or m["peak_extra_bytes"] >= 0
        assert math.isfinite(row["time_naive_over_chunked"]) and row["time_naive_over_chunked"] > 0

    md = (out / "bench.md").read_text()
    lines = md.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("| B×L×V |"))
    assert lines[header + 1].startswith("|---")
    assert sum(line.startswith("| 4×32×512 |") for line in lines) == len(rows)
    assert md.strip() in proc.stdout  # the table is printed too


def fake_vs_trl_report(iters: int = 3) -> dict:
    """What ``vs_trl.run`` records, for one pair in the HF setting, without running TRL."""
    from benchmarks.report import machine_info

    def run(side: str, scale: float) -> dict:
        phases = {"generate": 1.0 * scale, "score": 0.1, "prepare": 0.4, "prepare_forward": 0.3,
                  "update": 2.0 * scale, "forward_backward": 1.8 * scale}
        iterations = [{"seconds": 4.0 * scale + i, "cpu_seconds": 4.0 * scale, "phases": phases,
                       "accuracy": 0.1 * i} for i in range(iters)]
        return {"side": side, "setting": "hf", "iterations": iterations, "load_avg_1m_at_start": 0.5}

    settings = {"quick": True, "iters": iters, "warmup": 1, "pairs": 1, "settings": ["hf"],
                "overrides_common": ["callbacks/entropy=none"], "prompts": 8, "group_size": 4,
                "max_new_tokens": 8, "micro_batch_size": 8, "optimizer_steps": 2, "torch_threads": 1}
    return {"machine": machine_info(), "versions": {"trl": "x", "transformers": "y", "vllm": None, "lightning": "z"},
            "settings": settings, "runs": [run("ours", 1.0), run("trl", 2.0)], "patches": {"hf": {}}}


def test_vs_trl_summary_and_tables_from_recorded_runs(tmp_path):
    from benchmarks import vs_trl

    report = vs_trl.resummarize(fake_vs_trl_report(), warmup=1, out=tmp_path)
    summary = report["summary"]["hf"]
    assert summary["ours"]["iteration_s"] == {"min": 5.0, "median": 5.5, "max": 6.0, "n": 2}
    assert summary["ratio_ours_over_trl"]["median"] == 5.5 / 9.5
    assert summary["ours"]["overhead_frac"]["median"] == pytest.approx(1.0 - (3.1 / 5.0 + 3.1 / 6.0) / 2)
    md = (tmp_path / "vs_trl.md").read_text()
    assert "| lit-entropy | 5 | 5.5 | 6 |" in md and "| TRL | 9 | 9.5 | 10 |" in md and "ours / TRL" in md
    assert "| 0 (warm-up) |" in md
    with pytest.raises(ValueError, match="warmup"):
        vs_trl.resummarize(fake_vs_trl_report(), warmup=3, out=tmp_path)


def test_trl_config_matches_the_quick_batch_arithmetic():
    from benchmarks import vs_trl
    from benchmarks.vs_trl_sides import compose, trl_config

    cfg = compose(vs_trl.overrides_for("hf", 2, quick=True, extra=[]))
    args = trl_config(cfg, "hf", iters=2, output_dir="unused")
    assert args["use_vllm"] is False and args["loss_type"] == "dapo" and args["shuffle_dataset"] is False
    assert args["per_device_train_batch_size"] * args["steps_per_generation"] == 8 * 4  # the whole quick batch
    optimizer_steps_per_iteration = args["steps_per_generation"] // args["gradient_accumulation_steps"]
    assert args["max_steps"] == 2 * optimizer_steps_per_iteration * args["num_iterations"]


def test_the_overlapped_setting_changes_our_side_only():
    """``--settings vllm_overlap`` (issue 29): ours with ``rollout.max_staleness=1``, TRL as in ``vllm``."""
    from benchmarks import vs_trl
    from benchmarks.vs_trl_sides import compose, trl_config

    ours = vs_trl.overrides_for("vllm_overlap", 2, quick=True, extra=[])
    assert "rollout=vllm" in ours and "rollout.max_staleness=1" in ours
    assert "rollout.max_staleness=1" not in vs_trl.overrides_for("vllm", 2, quick=True, extra=[])
    cfg = compose(ours)
    assert cfg.rollout.max_staleness == 1
    assert trl_config(cfg, "vllm_overlap", 2, "unused") == trl_config(cfg, "vllm", 2, "unused")


def test_overlapped_phases_count_the_trainers_wait_not_the_background_generation():
    """Overlapped, ``time/generate`` ran during the previous update: the iteration's ``generate`` phase is the
    trainer's wait (``time/wait_rollout``), so ``other`` and the overhead budget stay the trainer's own time."""
    from benchmarks.vs_trl import side_summary, trainer_phases

    sync = {"generate": 1.5, "update": 2.0}
    assert trainer_phases(sync) == sync
    overlapped = {"generate": 2.2, "wait_rollout": 0.1, "update": 3.0, "prepare": 1.0}
    got = trainer_phases(overlapped)
    assert got["generate"] == 0.1 and got["generate_background"] == 2.2 and trainer_phases(got) == got
    runs = [{"iterations": [{"seconds": 4.2, "cpu_seconds": 8.0, "phases": overlapped, "accuracy": 0.3}]}]
    phases = side_summary(runs, warmup=0, threads=2)["phases_median_s"]
    assert phases["generate"] == 0.1 and phases["generate_background"] == 2.2
    assert math.isclose(phases["other"], 4.2 - 0.1 - 3.0 - 1.0)  # not 4.2 - 2.2 - ...: never negative here


def test_limits_follow_the_formulas_on_a_llama_config():
    from types import SimpleNamespace

    from benchmarks import limits

    cfg = SimpleNamespace(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                          num_key_value_heads=1, vocab_size=32)
    shapes = limits.linear_shapes(cfg)
    params = 2 * (8 * 8 + 8 * 4 + 8 * 4 + 8 * 8 + 3 * 8 * 16) + 8 * 32  # q, k, v, o, gate/up/down per layer; head
    assert sum(k * n * c for _, k, n, c in shapes) == params
    assert limits.kv_bytes_per_token(cfg, 2) == 2 * 2 * 1 * 4 * 2  # K and V, layers, kv heads, head_dim, bytes
    lim = limits.limits(cfg, rate=1e9, bandwidth=1e6, bytes_per=2, batch=4, context=10)
    step = (params * 2 + 4 * 10 * 32) / 1e6  # memory-bound: bytes over bandwidth
    assert lim["decode_bound"] == "memory" and abs(lim["decode_tokens_per_s"] - 4 / step) < 1e-9
    assert lim["update_tokens_per_s"] == 1e9 / (6 * params) and lim["pass_tokens_per_s"] == 1e9 / (2 * params)
    fast = limits.limits(cfg, rate=1e3, bandwidth=1e12, bytes_per=2, batch=4, context=10)
    assert fast["decode_bound"] == "compute" and abs(fast["decode_tokens_per_s"] - 4 / (2 * params * 4 / 1e3)) < 1e-9


def test_engine_settings_report_names_every_setting_and_its_ratio():
    """``--only engine``'s table: one row per setting, the ratio to the first, failures and skips by name."""
    from benchmarks import engine_settings

    names = list(engine_settings.SETTINGS)
    assert names[0].startswith("bf16 eager") and any("compiled" in n for n in names)
    assert engine_settings.SETTINGS[names[1]]["engine"]["enforce_eager"] is False
    rows = {names[0]: {"start_s": 6.0, "tokens_per_s": 300.0, "sync_s": 0.5, "runs": []},
            names[1]: {"start_s": 60.0, "tokens_per_s": 450.0, "sync_s": 0.5, "runs": []},
            names[2]: {"failed": "Traceback ... RuntimeError: boom"},
            names[4]: {"skipped": "libiomp5.so not found"}}
    for row in rows.values():
        if "tokens_per_s" in row:
            row["speedup"] = row["tokens_per_s"] / 300.0
    text = "\n".join(engine_settings.markdown({"settings": {"prompts": 8, "group": 8, "max_new_tokens": 160},
                                               "rows": rows}))
    assert "| 450 | 1.5 |" in text and "failed: " in text and "boom" in text and "libiomp5.so not found" in text
