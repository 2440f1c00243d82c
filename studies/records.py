"""A study's finished runs as one small portable file, and back.

A protocol study is hours of CPU; its run folders (TensorBoard event files, checkpoints, Hydra files) are
tens of MB and live under the git-ignored ``logs/``. :func:`export_records` keeps what the study's table,
verdicts and figure read from each finished run — the scalars they use, with the wall-clock times of
``rollout/entropy`` (seconds per iteration), the run's method config (the dose's clamps) and its overrides —
in one gzipped JSON of about 8 kB a run. :func:`import_records` writes each run back as a run folder that
the study reads like the original (a TensorBoard event file, ``.hydra/config.yaml``, ``overrides.yaml`` and
``done.json``), so a study can be re-summarised, re-judged or resumed on another machine or checkout::

    python scripts/study.py --protocol conf/protocol/collapse.yaml --phase evaluate --export-records F.json.gz
    python scripts/study.py --protocol conf/protocol/collapse.yaml --phase evaluate --import-records F.json.gz

Nothing machine-specific is kept: no command line, no absolute path, no checkpoint.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from lit_entropy.analysis.runs import scalar_events, times_of
from studies import bf16_via_fp32

FORMAT = "lit-entropy-study-records/1"

KEPT_TAGS = ("rollout/", "eval/", "control/", "train/masked_frac_", "train/clipfrac", "train/stare_reweighted_frac",
             "rollout_corr/", "diag/", "time/", "stop/", "iteration")
"""Tag prefixes a record keeps: everything the study table, the dose, the verdicts, the report's notes (a run
stopped as diverged: ``stop/diverged``) and the figure read."""

WALL_TAG = "rollout/entropy"
"""The tag whose wall-clock times are kept (the table's seconds per iteration)."""


def _method_config(folder: Path) -> dict[str, Any]:
    """The parts of the run's composed config the dose reads: ``algo`` and ``callbacks.entropy``."""
    from studies.dose import run_config

    cfg = run_config(folder)
    return {"algo": cfg.get("algo") or {}, "callbacks": {"entropy": (cfg.get("callbacks") or {}).get("entropy")}}


CHOICES = ("evaluate/nearest.json",)
"""Files a study writes once, by code, from the runs of that moment, and reads back ever after (the methods nearest
the baseline, which get its extra seeds): kept in the records as they are, since runs added later would not give
the same choice."""

RESUME_ONLY = ("ckpt_path=",)
"""Overrides that only resumed an interrupted run (a checkpoint's path on the machine): not kept in the records."""


def export_run(folder: str | Path) -> dict[str, Any]:
    """One finished run as a record: kept scalars (``tag -> [[step, value], ...]``), the wall times of
    :data:`WALL_TAG`, the method config, the task overrides and the run's exit status and seconds."""
    import yaml

    folder = Path(folder)
    events = scalar_events(folder)
    scalars = {tag: [[s, round(v, 7)] for s, v, _ in pts] for tag, pts in events.items() if tag.startswith(KEPT_TAGS)}
    ov = folder / ".hydra" / "overrides.yaml"
    done = json.loads((folder / "done.json").read_text()) if (folder / "done.json").is_file() else {}
    record = {"scalars": scalars, "wall_times": [round(t, 3) for t in times_of(events, WALL_TAG)],
              "config": _method_config(folder),
              "overrides": [o for o in ((yaml.safe_load(ov.read_text()) or []) if ov.is_file() else [])
                            if not str(o).startswith(RESUME_ONLY)],
              "done": {k: done[k] for k in ("returncode", "seconds") if k in done}}
    if done.get("attempts"):  # only then: the records of earlier runs keep their bytes
        record["done"]["attempts"] = [{k: a.get(k) for k in ("machine", "commit")} for a in done["attempts"]]
    problems = last_problem_counts(folder)
    if problems is not None:
        record["problems"] = problems
    if bf16_via_fp32.ran_with_it(folder):  # only then: the records of the runs before it keep their bytes
        record["done"]["bf16_via_fp32"] = True
    return record


PROBLEMS = "eval_problems"
"""The folder of a run's per-problem evaluation counts (``callbacks.eval.per_problem``)."""


def last_problem_counts(folder: Path) -> dict[str, Any] | None:
    """The last evaluation's per-problem counts (``split -> mode -> num_samples, num_correct``) with a digest of
    each split's problem texts in place of the texts, or None where the run wrote none."""
    import hashlib

    files = sorted((folder / PROBLEMS).glob("iteration-*.json"))
    if not files:
        return None
    data = json.loads(files[-1].read_text())
    splits = {}
    for split, modes in data["splits"].items():
        splits[split] = {}
        for mode, entry in modes.items():
            digest = entry.get("problems_sha")
            if digest is None:
                digest = hashlib.sha256("\n".join(entry["problem"]).encode()).hexdigest()[:16]
            splits[split][mode] = {"problems_sha": digest, "num_samples": entry["num_samples"],
                                   "num_correct": entry["num_correct"]}
    return {"iteration": data["iteration"], "splits": splits}


def export_records(out: str | Path, dest: str | Path) -> int:
    """Every finished run (a ``done.json``) below ``out`` into ``dest`` (gzipped JSON, keyed by the run's
    path relative to ``out``); returns the number of runs."""
    out = Path(out)
    runs = {str(d.parent.relative_to(out)): export_run(d.parent) for d in sorted(out.rglob("done.json"))}
    data: dict[str, Any] = {"format": FORMAT, "runs": runs}
    choices = {rel: json.loads((out / rel).read_text()) for rel in CHOICES if (out / rel).is_file()}
    if choices:  # only then: records of studies without one keep their bytes
        data["choices"] = choices
    Path(dest).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(dest, "wt", encoding="utf-8") as fh:
        json.dump(data, fh, separators=(",", ":"))
    return len(runs)


def import_run(record: dict[str, Any], folder: str | Path) -> None:
    """Write ``record`` back as a run folder the study reads like the original."""
    import yaml

    from lit_entropy.analysis.tfevents import write_scalars

    folder = Path(folder)
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(record["config"], sort_keys=False))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(record["overrides"]))
    walls = record.get("wall_times") or []
    write_scalars(folder / "tensorboard", {
        tag: [(step, value, walls[i] if tag == WALL_TAG and i < len(walls) else None)
              for i, (step, value) in enumerate(points)]
        for tag, points in record["scalars"].items()})
    (folder / "done.json").write_text(json.dumps({**record["done"], "imported": True}, indent=1))
    if "problems" in record:
        problems = record["problems"]
        (folder / PROBLEMS).mkdir(exist_ok=True)
        (folder / PROBLEMS / f"iteration-{problems['iteration']:04d}.json").write_text(json.dumps(problems))


def import_records(src: str | Path, out: str | Path) -> tuple[int, int]:
    """Write every run in ``src`` under ``out`` that ``out`` does not already hold finished, and each of its
    :data:`CHOICES` that ``out`` does not hold yet (a choice made there stays); returns (written, skipped) runs.
    A half-written folder of the same run is replaced."""
    import shutil

    with gzip.open(src, "rt", encoding="utf-8") as fh:
        data = json.load(fh)
    if data.get("format") != FORMAT:
        raise ValueError(f"{src}: not a study records file (format {data.get('format')!r}, expected {FORMAT!r})")
    written = skipped = 0
    for rel, record in data["runs"].items():
        folder = Path(out) / rel
        if (folder / "done.json").exists():
            skipped += 1
            continue
        if folder.exists():
            shutil.rmtree(folder)
        import_run(record, folder)
        written += 1
    for rel, choice in data.get("choices", {}).items():
        dest = Path(out) / rel
        if rel in CHOICES and not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(json.dumps(choice, indent=1))
    return written, skipped
