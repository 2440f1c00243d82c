"""The wheel a user installs: it carries the configs and the three console entry points, and a smoke run
works from a folder outside the repository, writing its logs and warm-start cache there.

The wheel is built without network access (``pip wheel --no-deps --no-build-isolation``) and installed
with ``--no-deps`` into a fresh venv whose ``.pth`` file points at this interpreter's site-packages (a
plain path line: the checkout's editable-install hook there is not run), so the dependencies come from
the project's environment and ``lit_entropy`` only from the wheel.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

from tests.helpers import ROOT, read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# A warm start of 50 steps instead of 800: the build runs (from the installed package) in seconds.
SMOKE = ["debug=smoke", "trainer.max_epochs=1", "model.warmstart.steps=50"]


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 1800) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """(the venv's bin folder, an environment with no trace of the checkout)."""
    root = tmp_path_factory.mktemp("install")
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PROJECT_ROOT", "LIT_ENTROPY_CACHE", "LIT_ENTROPY_TREE", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(root / "wheel"), str(ROOT)], cwd=root, env=env)
    (wheel,) = (root / "wheel").glob("lit_entropy-*.whl")
    venv.create(root / "venv", with_pip=False)
    bin_dir = root / "venv" / "bin"
    python = bin_dir / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=root, env=env).stdout.strip()
    (Path(site) / "project-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed", str(wheel)],
        cwd=root, env=env)
    return bin_dir, env


def test_the_wheel_carries_the_configs_and_the_entry_points(installed, tmp_path):
    bin_dir, env = installed
    where = run([str(bin_dir / "python"), "-c",
                 "import lit_entropy, lit_entropy.callbacks; from lit_entropy.cli import config_dir; "
                 "print(lit_entropy.__file__); print(lit_entropy.callbacks.__file__); print(config_dir())"],
                cwd=tmp_path, env=env).stdout.split()
    venv_dir = str(bin_dir.parent)
    assert all(line.startswith(venv_dir) for line in where), where  # the wheel's copy, not the checkout's
    assert (Path(where[2]) / "train.yaml").is_file() and (Path(where[2]) / "evaluate.yaml").is_file()
    for name in ("lit-entropy-train", "lit-entropy-eval", "lit-entropy-compare", "lit-entropy-export"):
        assert (bin_dir / name).is_file(), name


def test_a_smoke_run_from_another_folder(installed, tmp_path):
    bin_dir, env = installed
    work = tmp_path / "work"
    work.mkdir()
    proc = run([str(bin_dir / "lit-entropy-train"), *SMOKE], cwd=work, env=env)
    assert "iteration 1/1" in proc.stdout + proc.stderr
    (run_dir,) = (work / "logs" / "smoke" / "runs").iterdir()  # under the current folder
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert list((work / ".cache" / "lit_entropy" / "warmstart").iterdir())  # built from the installed package
    assert len(read_scalars(run_dir)["rollout/entropy"]) == 1
    run([str(bin_dir / "lit-entropy-compare"), str(run_dir), "--out", "fig"], cwd=work, env=env)
    assert (work / "fig" / "compare.png").is_file()
    proc = run([str(bin_dir / "lit-entropy-eval"), "model.warmstart.steps=50", "eval.limit=4", "eval.n=2",
                "eval.k=[1,2]", "eval.out=eval.json"], cwd=work, env=env)
    assert (work / "eval.json").is_file()
