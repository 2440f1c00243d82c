"""The package list, discovered rather than written down: every folder under ``lit_entropy/`` (with or without
an ``__init__.py``) and the Hydra configs, which sit in ``conf/`` at the repository root and install as
``lit_entropy/conf``. Everything else about the build is in pyproject.toml."""

from setuptools import find_namespace_packages, setup

setup(packages=[*find_namespace_packages(include=["lit_entropy", "lit_entropy.*"], exclude=["*.__pycache__"]),
                "lit_entropy.conf"])
