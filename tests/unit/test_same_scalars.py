"""scripts/same_scalars.py: two runs' scalars compared bit for bit, wall-clock tags left out."""

from __future__ import annotations

import contextlib
import importlib.util
import io
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("same_scalars", ROOT / "scripts" / "same_scalars.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def _run(folder: Path, values: dict[str, list[float]]) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    w = SummaryWriter(str(folder))
    for tag, xs in values.items():
        for step, x in enumerate(xs):
            w.add_scalar(tag, x, step)
    w.close()
    return folder


def _main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = script.main([str(a) for a in argv])
    return rc, out.getvalue()


def test_identical_runs_pass_and_wall_clock_tags_are_left_out(tmp_path):
    a = _run(tmp_path / "a", {"rollout/entropy": [0.5, 0.25], "time/update": [1.0, 2.0]})
    b = _run(tmp_path / "b", {"rollout/entropy": [0.5, 0.25], "time/update": [3.0, 4.0]})
    assert _main(a, b) == (0, "the same: 1 tags, 2 points, bit for bit\n")


def test_a_last_bit_a_missing_point_and_a_missing_tag_each_fail_by_name(tmp_path):
    a = _run(tmp_path / "a", {"rollout/entropy": [0.5, 0.25], "train/loss": [1.0], "law/r2": [0.9]})
    b = _run(tmp_path / "b", {"rollout/entropy": [0.5, 0.25 + 2**-22], "train/loss": [1.0, 2.0]})
    rc, text = _main(a, b)
    lines = text.splitlines()
    assert rc == 1 and len(lines) == 3
    assert lines[0] == "law/r2: only in the first run"
    assert lines[1].startswith("rollout/entropy: 2 against 2 points; point 1: (1, 0.25) against (1, 0.25")
    assert lines[2] == "train/loss: 1 against 2 points; point 1: nothing against (1, 2.0)"
