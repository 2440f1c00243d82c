"""Every entry point answers ``--help`` with its usage and exit status 0, in-process: the console scripts of
``pyproject.toml`` ([project.scripts]) and every ``scripts/*.py``; the Hydra ones (train, evaluate) also print
their composed config with ``--cfg job``."""

from __future__ import annotations

import importlib
import os
import runpy
import sys

import pytest
import tomllib
import yaml
from hydra.core.global_hydra import GlobalHydra

from tests.helpers import ROOT

CONSOLE = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
SCRIPTS = sorted((ROOT / "scripts").glob("*.py"))


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """An empty current folder, and the environment, ``sys.path`` and Hydra's state as they were after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    saved = dict(os.environ)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)
    GlobalHydra.instance().clear()


def console_main(name: str):
    module, _, func = CONSOLE[name].partition(":")
    return getattr(importlib.import_module(module), func)


def exit_code(run) -> int:
    """The exit status ``run()`` gives the shell: SystemExit's code, else 0 (a returned int for ``sys.exit``)."""
    try:
        out = run()
    except SystemExit as stop:
        return 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
    return out if isinstance(out, int) else 0


@pytest.mark.parametrize("name", sorted(CONSOLE))
def test_console_script_help(name, isolated, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    assert exit_code(console_main(name)) == 0
    out = capsys.readouterr().out
    assert "usage" in out.lower() or "powered by hydra" in out.lower(), out[:500]
    assert not any(isolated.iterdir())  # nothing written


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_help(path, isolated, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    assert exit_code(lambda: runpy.run_path(str(path), run_name="__main__")) == 0
    out = capsys.readouterr().out
    assert "usage" in out.lower() or "powered by hydra" in out.lower(), out[:500]
    assert not any(isolated.iterdir())


@pytest.mark.parametrize(("run", "key"), [("lit-entropy-train", "trainer"), ("lit-entropy-eval", "eval"),
                                          ("scripts/train.py", "trainer"), ("scripts/evaluate.py", "eval")])
def test_hydra_entry_points_print_the_config(run, key, isolated, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [run, "--cfg", "job", "seed=7"])
    if run in CONSOLE:
        code = exit_code(console_main(run))
    else:
        code = exit_code(lambda: runpy.run_path(str(ROOT / run), run_name="__main__"))
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert code == 0 and cfg["seed"] == 7 and key in cfg and "hydra" not in cfg
    assert not any(isolated.iterdir())


def test_a_script_and_its_console_command_are_one_program():
    for script, command in (("train", "lit-entropy-train"), ("evaluate", "lit-entropy-eval"),
                            ("compare", "lit-entropy-compare"), ("export", "lit-entropy-export")):
        module = CONSOLE[command].partition(":")[0]
        assert f"from {module} import main" in (ROOT / "scripts" / f"{script}.py").read_text()

