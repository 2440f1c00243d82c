"""environment.yml (conda) and pyproject.toml describe the same environment."""

from __future__ import annotations

import re

import tomllib
import yaml

from tests.helpers import ROOT


def _name(req: str) -> str:
    return re.split(r"[<>=!~\[ ;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _pins(reqs) -> dict[str, str]:
    return {_name(r): r.strip().replace(" ", "") for r in reqs}


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    env_reqs = [r for r in pip_section if not r.startswith("-e")]
    expected = list(project["dependencies"]) + project["optional-dependencies"]["cpu"] + \
        project["optional-dependencies"]["dev"]
    env_pins = _pins(env_reqs)
    want = _pins(expected)
    want["torch"] = "torch==2.13.0"  # the conda env pins the CPU build, as the Makefile does
    assert env_pins == want
    assert any(r.startswith("-e") for r in pip_section), "environment.yml must install the package itself"
    assert any(str(d).startswith("python") for d in env["dependencies"])
