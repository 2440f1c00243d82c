"""scripts/gpu_check.sh on this machine (no CUDA: every CUDA step skipped, with the reason), a step that fails
failing the check, and `make gpu-wheels`' pins (read with `make -n`: nothing is downloaded)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
CUDA_STEPS = ["warm-start", "lab-fp32", "lab-bf16", "lab-fp16", "lab-lora", "lab-fsdp", "conformance", "gpu-tests"]
STEPS = ["package", "wheels", "versions", *CUDA_STEPS]
PINNED = ["hydra-core", "omegaconf", "antlr4-python3-runtime", "math-verify", "latex2sympy2_extended"]


def probe_wheel(folder: Path, source: str) -> Path:
    """A one-module pure-Python wheel, ``gpu_check_probe`` (its source ``source``), with a valid RECORD."""
    files = {
        "gpu_check_probe.py": source,
        "gpu_check_probe-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.1\n",
        "gpu_check_probe-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                               "Tag: py3-none-any\n",
        "gpu_check_probe-0.1.dist-info/top_level.txt": "gpu_check_probe\n",
    }
    record = []
    for name, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    files["gpu_check_probe-0.1.dist-info/RECORD"] = "\n".join([*record, "gpu_check_probe-0.1.dist-info/RECORD,,"]) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "gpu_check_probe-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return wheel


def run_check(tmp_path: Path, wheels: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict[str, tuple]]:
    """The script as the GPU machine runs it, on this machine's interpreter with any GPU hidden; its exit and
    its summary's table: step -> (result, seconds, note)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    environ.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable,
                   GPU_WHEELS=str(wheels), GPU_CHECK_SITE=str(tmp_path / "site"), CUDA_VISIBLE_DEVICES="", **env)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600)
    summary = tmp_path / "out" / "gpu_check.md"
    assert summary.is_file(), proc.stdout + proc.stderr
    rows = {}
    for line in summary.read_text().splitlines():
        m = re.match(r"^\| ([a-z0-9-]+) \| (passed|failed|skipped) \| (\d+) \| (.*) \|$", line)
        if m:
            rows[m[1]] = (m[2], int(m[3]), m[4])
    return proc, rows


def test_on_a_machine_without_cuda_every_cuda_step_is_skipped_and_the_check_passes(tmp_path):
    probe_wheel(tmp_path / "wheels", "ANSWER = 42\n")
    proc, rows = run_check(tmp_path, tmp_path / "wheels")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(rows) == STEPS
    for step in CUDA_STEPS:
        assert rows[step] == ("skipped", 0, "no CUDA device"), step
    assert rows["package"][0] == "passed"
    # the probe's package is missing here, so it is installed into the private folder and imported from it
    result, _, note = rows["wheels"]
    assert result == "passed" and "installed 1 of 1 wheels" in note and "gpu_check_probe-0.1" in note, note
    assert (tmp_path / "site" / "gpu_check_probe.py").is_file()
    assert rows["versions"][0] == "passed"
    summary = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "Steps: 3 passed, 0 failed, 8 skipped." in summary
    assert "## Versions and device" in summary and "- torch " in summary and "- hydra-core " in summary
    assert "- device: no CUDA device" in summary
    assert {p.name for p in (tmp_path / "out" / "logs").iterdir()} >= {"wheels.log", "versions.log"}


def test_a_step_that_fails_fails_the_check(tmp_path):
    probe_wheel(tmp_path / "wheels", "raise ImportError('broken on purpose')\n")
    proc, rows = run_check(tmp_path, tmp_path / "wheels", GPU_CHECK_ONLY="wheels")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    result, _, note = rows["wheels"]
    assert result == "failed" and "import gpu_check_probe" in note and "broken on purpose" in note, note
    assert all(rows[s] == ("skipped", 0, "not in GPU_CHECK_ONLY (wheels)") for s in STEPS if s != "wheels")


def test_a_missing_wheel_folder_is_a_skip_with_the_reason(tmp_path):
    proc, rows = run_check(tmp_path, tmp_path / "absent", GPU_CHECK_ONLY="wheels")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert rows["wheels"][0] == "skipped" and "make gpu-wheels" in rows["wheels"][2]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_gpu_wheels_fetches_this_environments_versions_of_the_missing_packages():
    proc = subprocess.run(["make", "-n", "gpu-wheels"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    command = next(line for line in proc.stdout.splitlines() if " pip wheel " in line)
    assert "--no-deps" in command and "--wheel-dir gpu-wheels" in command
    for name in PINNED:  # the versions the tests here run with
        assert f" {name}=={importlib.metadata.version(name)}" in command, (name, command)
    assert len(re.findall(r"==", command)) == len(PINNED)
    assert "-none-any" in proc.stdout  # the pure-Python check
    assert "gpu-wheels/" in (ROOT / ".gitignore").read_text().splitlines()
