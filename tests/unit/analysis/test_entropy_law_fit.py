"""The entropy-performance law fitted to finished runs (lit_entropy.analysis.entropy_law_fit) through
scripts/fit_entropy_law.py, on tiny fake runs whose law is known: the pooled and per-run fits, the summary, the
figure, ``--skip`` and a multirun folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.analysis.test_compare import A, B, is_png, script, two_fake_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    """The two fake runs of test_compare.py, built again for this module."""
    return two_fake_runs(tmp_path_factory.mktemp("multirun"))


def test_fit_entropy_law_script(runs, tmp_path):
    out = tmp_path / "law"
    proc = script("fit_entropy_law.py", *runs, "--out", out)
    assert is_png(out / "entropy_law.png")
    summary = json.loads((out / "entropy_law.json").read_text())
    for key in ("a", "b", "r2", "ceiling", "n"):
        assert key in summary
    assert summary["a"] == pytest.approx(A, abs=1e-5)
    assert summary["b"] == pytest.approx(B, abs=1e-5)
    assert summary["ceiling"] == pytest.approx(B - A, abs=1e-5)
    assert summary["r2"] == pytest.approx(1.0, abs=1e-6)
    assert summary["n"] == 24
    assert [r["run"] for r in summary["runs"]] == [str(r) for r in runs]
    for r in summary["runs"]:
        assert r["gap"] == pytest.approx(summary["ceiling"] - r["final_accuracy"])
        assert r["fit"]["a"] == pytest.approx(A, abs=1e-5)
    assert "ceiling" in proc.stdout


def test_fit_entropy_law_script_skip_and_multirun_folder(runs, tmp_path):
    out = tmp_path / "law"
    script("fit_entropy_law.py", runs[0].parent, "--skip", "4", "--out", out)
    assert json.loads((out / "entropy_law.json").read_text())["n"] == 16
