"""scripts/bench.py end to end, entropy benchmark only (no vLLM needed; a few seconds)."""

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
