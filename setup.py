"""The package list, discovered rather than written down: every folder under ``lit_entropy/`` (with or without
an ``__init__.py``) and the Hydra configs, which sit in ``conf/`` at the repository root and install as
``lit_entropy/conf``. Everything else about the build is in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


class FreshBuildPy(build_py):
    """``build_py`` from an empty ``build/lib/lit_entropy``. setuptools keeps that folder between builds and only
    adds to it, so a module deleted or moved since an earlier build in the same checkout would still ship in the
    next wheel (and be importable under its old name)."""

    def run(self) -> None:
        shutil.rmtree(Path(self.build_lib) / "lit_entropy", ignore_errors=True)
        super().run()


setup(packages=[*find_namespace_packages(include=["lit_entropy", "lit_entropy.*"], exclude=["*.__pycache__"]),
                "lit_entropy.conf"],
      cmdclass={"build_py": FreshBuildPy})
