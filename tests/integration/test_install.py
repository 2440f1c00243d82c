"""The package as a user installs it: a wheel built from the checkout, installed outside the repository.

The wheel must carry every module under ``lit_entropy/`` and every config under ``conf/`` (setup.py discovers the
packages; nothing is listed by hand), so this compares the wheel's files with the checkout's, imports every module
of the package from the installed copy (a module that is missing or fails to import is named), and runs the
installed console entry points from an empty folder: a ``debug=smoke`` training run, the comparison figure, an
evaluation and an export of the run's checkpoint. The sdist is held to the same list, and a wheel built from the
unpacked sdist too. The wheel carries nothing else either: it is built from a copy of the checkout in whose
``build/lib`` an earlier build left a module since moved away (setuptools reuses that folder; ``setup.py`` empties
it first).

The wheel is built without network access (``pip wheel --no-deps --no-build-isolation``) and installed with
``--no-deps`` into a fresh venv whose ``.pth`` file points at this interpreter's site-packages (a plain path line:
the checkout's editable-install hook there is not run), so the dependencies come from the project's environment
and ``lit_entropy`` only from the wheel. The checkout is never on the path: the commands run from a temporary
folder, with ``PYTHONPATH`` removed. This runs in ``make test`` (hence in CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

from tests.helpers import CONF, ROOT, read_scalars

pytestmark = pytest.mark.integration

# debug=smoke shrunk once more, to one iteration from the warm start the wheel ships: the installed package loads
# it, trains, logs and checkpoints in well under a minute.
SMOKE = ["debug=smoke", "trainer.max_epochs=1"]

PACKAGE = ROOT / "lit_entropy"


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def checkout_modules() -> list[str]:
    """Every module of the checkout's package, by dotted name (``__init__`` files as their package)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


LAB_START = PACKAGE / "policy" / "lab_start"


def checkout_files() -> set[str]:
    """The paths a distribution must carry, as they sit inside the installed package: the modules, the configs and
    the lab policy's shipped warm start."""
    code = {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")}
    configs = {"lit_entropy/conf/" + p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}
    weights = {p.relative_to(ROOT).as_posix() for p in LAB_START.iterdir()}
    return code | configs | weights


def wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if n.startswith("lit_entropy/") and (
            n.endswith((".py", ".yaml")) or n.startswith("lit_entropy/policy/lab_start/"))}


def missing_message(expected: set[str], found: set[str], what: str) -> str:
    missing = sorted(expected - found)
    return f"{what} misses {len(missing)} file(s) of the checkout: {missing[:20]}"


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PROJECT_ROOT", "LIT_ENTROPY_CACHE", "LIT_ENTROPY_TREE", "VIRTUAL_ENV")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def build_wheel(source: Path, out: Path, env: dict[str, str]) -> Path:
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out), str(source)], cwd=out.parent, env=env)
    (wheel,) = out.glob("lit_entropy-*.whl")
    return wheel


STALE = "lit_entropy/moved_away.py"
"""A module an earlier build of the same checkout left in ``build/lib`` (since moved or deleted): no wheel ships it."""


def copy_checkout(dest: Path) -> Path:
    """The checkout's files as a clone has them (git's list of tracked and unignored files; without git, every file
    but the usual build, cache and environment folders), copied to ``dest``."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, text=True)
    except FileNotFoundError:  # no git on this machine
        listed = None
    if listed is None or listed.returncode != 0:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".cache", "build", "*.egg-info", "logs", "__pycache__", ".*_cache"))
        return dest
    for name in filter(None, listed.stdout.split("\0")):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    """The wheel and the sdist built from a copy of the checkout in which an earlier build left a stale module."""
    root = tmp_path_factory.mktemp("dist")
    env = clean_env()
    source = copy_checkout(root / "source")
    (source / "build" / "lib" / STALE).parent.mkdir(parents=True)
    (source / "build" / "lib" / STALE).write_text("raise ImportError('a module of an earlier build')\n")
    wheel = build_wheel(source, root / "wheel", env)
    # The sdist through setuptools' PEP 517 hook, in a subprocess so its chdir stays there.
    sdist_dir = root / "sdist"
    name = run([sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
                "print(b.build_sdist(sys.argv[1]))", str(sdist_dir)], cwd=source, env=env).stdout.split()[-1]
    return {"root": root, "wheel": wheel, "sdist": sdist_dir / name}


@pytest.fixture(scope="module")
def installed(built) -> tuple[Path, dict[str, str]]:
    """(the venv's bin folder, an environment with no trace of the checkout)."""
    root, env = built["root"], clean_env()
    venv.create(root / "venv", with_pip=False)
    bin_dir = root / "venv" / "bin"
    python = bin_dir / "python"
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=root, env=env).stdout.strip()
    (Path(site) / "project-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--ignore-installed",
         str(built["wheel"])], cwd=root, env=env)
    return bin_dir, env


def test_the_wheel_carries_every_module_and_config_and_nothing_else(built):
    expected = checkout_files()
    found = wheel_files(built["wheel"])
    assert expected <= found, missing_message(expected, found, built["wheel"].name)
    assert found == expected, f"{built['wheel'].name} carries files the checkout lacks: {sorted(found - expected)}"


def test_the_sdist_carries_every_module_and_config_and_builds_the_same_wheel(built, tmp_path):
    with tarfile.open(built["sdist"]) as tf:
        members = [m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name]
        tf.extractall(tmp_path, filter="data")
    expected = {p.replace("lit_entropy/conf/", "conf/", 1) for p in checkout_files()}
    assert expected <= set(members), missing_message(expected, set(members), built["sdist"].name)
    (unpacked,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    wheel = build_wheel(unpacked, tmp_path / "wheel", clean_env())
    assert wheel_files(wheel) == wheel_files(built["wheel"])


def test_every_module_imports_from_the_installed_wheel(installed, tmp_path):
    bin_dir, env = installed
    script = (
        "import importlib, json, sys, traceback\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        out[name] = importlib.import_module(name).__file__\n"
        "    except BaseException:\n"
        "        out[name] = 'FAILED: ' + traceback.format_exc(limit=3).strip().splitlines()[-1]\n"
        "from lit_entropy.utils.config_path import config_dir\n"
        "out['<configs>'] = str(config_dir())\n"
        "print(json.dumps(out))\n"
    )
    modules = checkout_modules()
    proc = run([str(bin_dir / "python"), "-c", script, *modules], cwd=tmp_path, env=env)
    where = json.loads(proc.stdout.strip().splitlines()[-1])
    failed = {k: v for k, v in where.items() if v.startswith("FAILED")}
    assert not failed, f"{len(failed)} module(s) do not import from the installed wheel: {failed}"
    venv_dir = str(bin_dir.parent)
    elsewhere = {k: v for k, v in where.items() if not v.startswith(venv_dir)}
    assert not elsewhere, f"imported from outside the installed wheel (the checkout?): {elsewhere}"
    configs = Path(where["<configs>"])
    installed_configs = {p.relative_to(configs).as_posix() for p in configs.rglob("*.yaml")}
    assert installed_configs == {p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml")}


def test_the_entry_points_run_from_an_empty_folder(installed, tmp_path):
    bin_dir, env = installed
    for name in ("lit-entropy-train", "lit-entropy-eval", "lit-entropy-compare", "lit-entropy-export"):
        assert (bin_dir / name).is_file(), name
    work = tmp_path / "work"
    work.mkdir()
    proc = run([str(bin_dir / "lit-entropy-train"), *SMOKE], cwd=work, env=env)
    assert "iteration 1/1" in proc.stdout + proc.stderr
    (run_dir,) = (work / "logs" / "smoke" / "runs").iterdir()  # under the current folder
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    logs = proc.stdout + proc.stderr  # started from the installed package's warm start; nothing built
    assert "Starting the lab policy from the warm start shipped at " + str(bin_dir.parent) in logs, logs[-3000:]
    assert not (work / ".cache" / "lit_entropy" / "warmstart").exists()
    assert len(read_scalars(run_dir)["rollout/entropy"]) == 1
    run([str(bin_dir / "lit-entropy-compare"), str(run_dir), "--out", "fig"], cwd=work, env=env)
    assert (work / "fig" / "compare.png").is_file()
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    run([str(bin_dir / "lit-entropy-eval"), f"ckpt_path={ckpt}", "eval.limit=4", "eval.n=2", "eval.k=[1,2]",
         "eval.out=eval.json"], cwd=work, env=env)
    assert (work / "eval.json").is_file()
    run([str(bin_dir / "lit-entropy-export"), str(ckpt), "exported"], cwd=work, env=env)
    assert (work / "exported" / "config.json").is_file()
