"""scripts/bench.py --vs trl end to end, HF-generate setting, tiny sizes (about 40 s; needs the `bench` extra)."""

import json
import math
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.integration
pytest.importorskip("trl", reason="trl is not installed (the optional `bench` extra: pip install -e '.[bench]')")
pytest.importorskip("datasets", reason="datasets is not installed (the optional `bench` extra)")


def finite(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x)


def test_quick_vs_trl_hf_writes_both_sides_with_finite_numbers(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench.py"), "--vs", "trl", "--quick", "--settings", "hf",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    report = json.loads((out / "vs_trl.json").read_text())
    s = report["settings"]
    assert s["quick"] and s["settings"] == ["hf"] and report["versions"]["trl"]
    assert {(r["side"], r["setting"]) for r in report["runs"]} == {("ours", "hf"), ("trl", "hf")}
    for run in report["runs"]:
        assert len(run["iterations"]) == s["iters"]
        for it in run["iterations"]:
            assert finite(it["seconds"]) and it["seconds"] > 0
            assert finite(it["accuracy"]) and 0 <= it["accuracy"] <= 1
            assert {"generate", "score", "prepare", "update"} <= set(it["phases"])
            assert all(finite(v) and v >= 0 for v in it["phases"].values())
    cfg = report["trl_config"]["hf"]
    assert cfg["use_vllm"] is False and cfg["loss_type"] == "dapo" and cfg["shuffle_dataset"] is False
    assert cfg["per_device_train_batch_size"] * cfg["steps_per_generation"] == 8 * 4  # the quick batch, all of it

    summary = report["summary"]["hf"]
    for side in ("ours", "trl"):
        assert all(finite(v) for v in summary[side]["iteration_s"].values())
        assert all(finite(v) for v in summary[side]["phases_median_s"].values())
        assert finite(summary[side]["overhead_frac"]["median"])
    assert all(finite(v) and v > 0 for v in summary["ratio_ours_over_trl"].values())

    md = (out / "vs_trl.md").read_text()
    assert "| lit-entropy |" in md and "| TRL |" in md and "ours / TRL" in md
    assert md.strip() in proc.stdout  # the tables are printed too
