"""What every registry of methods shares: a folder whose files register themselves when they are imported."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def import_submodules(package: str, path: Iterable[str]) -> None:
    """Import every module of the folder ``path`` of ``package``, in the order of their names: each file of a
    registry's folder registers its method on import, so a new method is its file."""
    for module in sorted(m.name for m in pkgutil.iter_modules(path)):
        importlib.import_module(f"{package}.{module}")


def add_once(registry: dict[str, T], name: str, item: T, kind: str) -> None:
    """``registry[name] = item``, refusing a second ``name`` (two files registering one method)."""
    if name in registry:
        raise ValueError(f"{kind} {name!r} is registered twice")
    registry[name] = item


