"""Read finished runs back: find run folders and load their TensorBoard scalars.

Shared by the rest of :mod:`lit_entropy.analysis` (behind ``scripts/compare.py``,
``scripts/fit_entropy_law.py`` and ``scripts/study_table.py``). Nothing here writes anything.

A *run* is a folder that holds a ``.hydra`` directory (what ``scripts/train.py`` writes, in
``logs/<task>/runs/<time>`` or, for a multirun, ``logs/<task>/multiruns/<time>/<job number>``), or, for
runs not launched through Hydra, a folder that holds TensorBoard event files.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

EVENTS_GLOB = "events.out.tfevents.*"


def event_files(run_dir: str | Path) -> list[Path]:
    """Every TensorBoard event file below ``run_dir``, in name order (the name carries the creation time)."""
    return sorted(Path(run_dir).rglob(EVENTS_GLOB), key=lambda p: (p.name, str(p)))


def scalar_events(run_dir: str | Path) -> dict[str, list[tuple[int, float, float]]]:
    """Every scalar below ``run_dir`` with its wall-clock time: ``tag -> [(step, value, wall_time), ...]`` sorted by
    step, the points :func:`read_scalars` reads. One pass over the event files gives both (a study's report reads
    hundreds of runs; the files, not the arithmetic, are its cost)."""
    from lit_entropy.analysis.tfevents import stream_scalars

    folders: dict[Path, list[Path]] = {}
    for f in event_files(run_dir):
        folders.setdefault(f.parent, []).append(f)
    out: dict[str, list[tuple[int, float, float]]] = {}
    for files in folders.values():  # one folder, one stream: its later files' purges reach its earlier ones
        for tag, points in stream_scalars(files).items():
            first: dict[tuple[int, float], float] = {}  # a point written twice identically: its first copy
            for step, value, wall in points:
                first.setdefault((int(step), float(value)), wall)
            out.setdefault(tag, []).extend((step, value, wall) for (step, value), wall in first.items())
    return {tag: sorted(points, key=lambda p: p[0]) for tag, points in out.items()}


def points_of(events: dict[str, list[tuple[int, float, float]]]) -> dict[str, list[tuple[int, float]]]:
    """:func:`scalar_events` without the wall times: ``tag -> [(step, value), ...]``."""
    return {tag: [(step, value) for step, value, _ in points] for tag, points in events.items()}


def times_of(events: dict[str, list[tuple[int, float, float]]], tag: str) -> list[float]:
    """The sorted wall times of ``tag``'s points in :func:`scalar_events`' result (empty without the tag)."""
    return sorted(wall for _, _, wall in events.get(tag, []))


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar below ``run_dir`` as TensorBoard shows it: ``tag -> [(step, value), ...]`` sorted by step.

    The event files of one folder are read in order by one accumulator, which applies the purges a resumed run
    asks for (its writer's ``purge_step`` drops what the interrupted run logged after its checkpoint, which the
    resumed run logs again: :func:`lit_entropy.utils.log_steps.tensorboard_resume`), so a resumed run reads like an
    uninterrupted one. Folders are merged; the sort is stable, so two points at the same step keep the order in
    which they were written. A point written twice with the same step and value in one folder is read once: runs
    restarted from their boundary-0 checkpoint before 2026-11-27 were not purged (the restart's writer skipped the
    purge at step 0) and hold their first iterations twice, identically (exact resume) but for ``time/*``.
    """
    return points_of(scalar_events(run_dir))


def wall_times(run_dir: str | Path, tag: str) -> list[float]:
    """The wall-clock times of every ``tag`` point below ``run_dir``, sorted: one per point :func:`read_scalars`
    reads (of a point written twice with the same step and value, the first copy's)."""
    return times_of(scalar_events(run_dir), tag)


def values(points: list[tuple[int, float]]) -> list[float]:
    """The values of ``(step, value)`` points, in step order."""
    return [v for _, v in points]


def find_runs(dirs: Iterable[str | Path]) -> list[Path]:
    """The run folders in or below each of ``dirs``, sorted and without duplicates.

    * a folder with a ``.hydra`` directory is a run; so is every folder below with one (a Hydra
      multirun folder, or ``logs/<task>`` with several ``runs/<time>``);
    * below a folder with no ``.hydra`` anywhere, the folders holding event files are the runs — the
      folder itself when all its event files sit in one folder (e.g. ``<run>/tensorboard``).

    A folder with neither gives nothing; a path that does not exist raises ``FileNotFoundError``.
    """
    found: set[Path] = set()
    for d in dirs:
        d = Path(d)
        if not d.exists():
            raise FileNotFoundError(f"no such run folder: {d}")
        if not d.is_dir():
            continue
        hydra = {p.parent for p in d.rglob(".hydra") if p.is_dir()}
        if (d / ".hydra").is_dir():
            hydra.add(d)
        if hydra:
            found |= hydra
            continue
        holders = {f.parent for f in event_files(d)}
        if len(holders) == 1:
            found.add(d)
        else:
            found |= holders
    return sorted(found)



def find_runs_or_say(dirs: list[Path]) -> list[Path]:
    """:func:`find_runs`, saying ``no runs found under ...`` on stderr when there are none (the scripts then exit 1)."""
    import sys

    runs = find_runs(dirs)
    if not runs:
        print(f"no runs found under {', '.join(map(str, dirs))}", file=sys.stderr)
    return runs

def hydra_overrides(run_dir: str | Path) -> list[str]:
    """The command-line overrides the run was launched with (``.hydra/overrides.yaml``), or ``[]``."""
    import yaml

    f = Path(run_dir) / ".hydra" / "overrides.yaml"
    if not f.is_file():
        return []
    data = yaml.safe_load(f.read_text()) or []
    return [str(x) for x in data] if isinstance(data, list) else []


def run_settings(run_dir: str | Path) -> dict[str, object]:
    """The settings a run is compared by: its HParams hyperparameters (group choices, the swept keys, its
    command-line keys; :func:`lit_entropy.callbacks.dashboard.run_hparams`) from ``.hydra/config.yaml`` and the
    choices in ``.hydra/hydra.yaml``, without ``task_name``; ``{}`` without them."""
    from omegaconf import OmegaConf

    hydra_dir = Path(run_dir) / ".hydra"
    if not (hydra_dir / "config.yaml").is_file():
        return {}
    from lit_entropy.callbacks.dashboard import run_hparams

    cfg = OmegaConf.load(hydra_dir / "config.yaml")
    choices = {}
    if (hydra_dir / "hydra.yaml").is_file():
        found = OmegaConf.select(OmegaConf.load(hydra_dir / "hydra.yaml"), "hydra.runtime.choices", default=None)
        choices = dict(found) if found is not None else {}
    settings = run_hparams(cfg, choices, hydra_overrides(run_dir))
    settings.pop("task_name", None)
    return settings


def differing_settings(runs: list[Path]) -> dict[Path, str]:
    """``key=value`` of up to four settings that differ between ``runs`` (group choices first; a controller's own
    settings only where the runs share the controller), per run; ``{}`` when a run has no ``.hydra/`` or none
    differ."""
    settings = {r: run_settings(r) for r in runs}
    if len(runs) < 2 or not all(settings.values()):
        return {}
    keys = list(dict.fromkeys(k for r in runs for k in settings[r]))
    differ = [k for k in keys if len({repr(settings[r].get(k)) for r in runs}) > 1]
    if "callbacks/entropy" in differ:
        differ = [k for k in differ if not k.startswith("controller.")]
    differ = sorted(differ, key=lambda k: ("/" not in k and k not in ("algo", "seed"), keys.index(k)))[:4]
    if not differ:
        return {}
    return {r: " ".join(f"{k}={settings[r].get(k, '—')}" for k in differ) for r in runs}


def run_labels(runs: list[Path]) -> dict[Path, str]:
    """A short label per run: the settings that differ between the runs (:func:`differing_settings`), else its
    Hydra overrides minus those every run shares, else the folder name.

    Labels that would still collide get the folder name appended.
    """
    labels: dict[Path, str] = differing_settings(runs)
    overrides = {r: hydra_overrides(r) for r in runs}
    shared = set.intersection(*(set(o) for o in overrides.values())) if len(runs) > 1 else set()
    for r in runs:
        if r in labels:
            continue
        own = [o for o in overrides[r] if o not in shared]
        labels[r] = " ".join(own) if own else r.name
    counts: dict[str, int] = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    for r in runs:
        if counts[labels[r]] > 1 and labels[r] != r.name:
            labels[r] = f"{labels[r]} [{r.name}]"
    counts = {}
    for label in labels.values():
        counts[label] = counts.get(label, 0) + 1
    for r in runs:
        if counts[labels[r]] > 1:
            labels[r] = f"{labels[r]} [{r.parent.name}/{r.name}]"
    return labels
