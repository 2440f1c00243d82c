"""Which evaluation runs this machine does, and in which folders, so that a method's seed k pairs with the
baseline's seed k on one machine at one commit (``interval.pairing: seed_machine_commit``; :mod:`studies.pairs`).

A study of many runs outlives one machine: a session on an AVX2 machine starts what a session on an AVX512-BF16
machine goes on with. A run resumed on another machine is no longer a pair of anything (its attempts differ), and a
method's seed k finished on one machine does not pair with the baseline's seed k finished on another. So:

- a run is resumed only on the machine and commit of its earlier attempts (its *owner*, from ``attempts.json``);
- a seed's run has its first folder ``seed{k}`` and, where that folder is owned elsewhere, one more per machine and
  commit, ``seed{k}@<digest of machine and commit>``; the report pairs whichever two share machine and commit
  (:func:`studies.protocol.collect` gathers them, :func:`studies.verdicts.judge` matches them);
- before a method's seed k runs here, the baseline's seed k runs here too, unless it already has.

:func:`schedule` orders the work in two passes over the plan (seed by seed, as every study):

1. the method seeds no other machine has started: the baseline's seed here (where missing), then the method's;
   a method seed another machine started (or finished, with or without its baseline there) is left to that
   machine, which resumes or completes the pair when it comes back;
2. then every method seed still unpaired, even one left to another machine in pass 1: both halves here. Pass 2
   repeats work only where another machine left it unfinished or unpaired; a machine that never comes back
   costs no seed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from studies.method_study import StudyPlan, checkout_commit, machine, run_dir
from studies.pairs import pairing_of


def here(train_script: Path) -> str:
    """This machine and the commit of the checkout ``train_script`` sits in, as :func:`~studies.pairs.pairing_of`
    writes a pairing (``"<machine> @ <commit>"``)."""
    return f"{machine()} @ {checkout_commit(train_script)}"


def owner(folder: Path) -> str | None:
    """The one machine and commit of every attempt of the run in ``folder`` (``done.json`` when it finished, else
    ``attempts.json``), or None: no attempt recorded, or attempts on several (a run no machine can pair)."""
    done = folder / "done.json"
    if done.is_file():
        attempts = json.loads(done.read_text()).get("attempts")
    elif (folder / "attempts.json").is_file():
        attempts = json.loads((folder / "attempts.json").read_text())
    else:
        attempts = None
    return pairing_of(attempts or [])


def pair_folder(first: Path, pairing: str) -> Path:
    """The folder of a seed's run on the machine and commit ``pairing`` where ``first`` (``seed{k}``) is owned
    elsewhere: ``seed{k}@`` and the first 8 hex digits of the pairing's SHA-256."""
    return first.with_name(f"{first.name}@{hashlib.sha256(pairing.encode()).hexdigest()[:8]}")


def folders_of(out: Path, algo: str, controller: str, seed: int) -> list[Path]:
    """Every folder of one cell's seed: ``seed{k}`` first, then its ``seed{k}@…`` folders in name order (those that
    exist)."""
    first = run_dir(out, algo, controller, seed)
    return [first, *sorted(first.parent.glob(f"{first.name}@*"))]


def runs_of(out: Path, algo: str, controller: str, seed: int) -> dict[str | None, tuple[Path, bool]]:
    """Owner -> (folder, finished) of every started run of one cell's seed (a folder with attempts recorded)."""
    got: dict[str | None, tuple[Path, bool]] = {}
    for folder in folders_of(out, algo, controller, seed):
        if folder.is_dir() and ((folder / "attempts.json").is_file() or (folder / "done.json").is_file()):
            key = owner(folder)
            done = (folder / "done.json").is_file()
            if key not in got or (done and not got[key][1]):  # a finished run before an unfinished one
                got[key] = (folder, done)
    return got


def slot(out: Path, algo: str, controller: str, seed: int, pairing: str) -> Path:
    """The folder where this machine and commit (``pairing``) runs or resumes one cell's seed: its own run's
    folder where it started one, else ``seed{k}`` while no machine has, else its ``seed{k}@…`` folder."""
    own = runs_of(out, algo, controller, seed).get(pairing)
    if own is not None:
        return own[0]
    first = run_dir(out, algo, controller, seed)
    started = (first / "attempts.json").is_file() or (first / "done.json").is_file()
    return pair_folder(first, pairing) if started else first


def paired(out: Path, cell: tuple[str, str], baseline: tuple[str, str], seed: int) -> bool:
    """Whether some machine and commit finished both the cell's and the baseline's seed."""
    base = runs_of(out, *baseline, seed)
    return any(key is not None and done and base.get(key, (None, False))[1]
               for key, (_, done) in runs_of(out, *cell, seed).items())


def schedule(plan: StudyPlan, out: Path, baseline: tuple[str, str], pairing: str) -> list[tuple[str, str, int, Path]]:
    """The runs this machine and commit (``pairing``, :func:`here`) does for ``plan``, in order, each with its
    folder (see the module docstring); finished runs are not in it."""
    todo: list[tuple[str, str, int, Path]] = []
    planned: set[tuple[str, str, int]] = set()

    def need(cell: tuple[str, str], seed: int) -> None:
        own = runs_of(out, *cell, seed).get(pairing)
        if (own is not None and own[1]) or (*cell, seed) in planned:
            return
        planned.add((*cell, seed))
        todo.append((*cell, seed, slot(out, *cell, seed, pairing)))

    later = []
    runs = plan.runs()
    for algo, controller, seed in runs:
        cell = (algo, controller)
        if cell == baseline or paired(out, cell, baseline, seed):
            continue
        started = runs_of(out, *cell, seed)
        if started and pairing not in started:  # another machine's to resume or complete
            later.append((cell, seed))
            continue
        need(baseline, seed)
        need(cell, seed)
    for algo, controller, seed in runs:  # a baseline seed no method needs (say, the baseline's extra seeds)
        if (algo, controller) == baseline and not runs_of(out, algo, controller, seed):
            need(baseline, seed)
    for cell, seed in later:
        if not paired(out, cell, baseline, seed):
            need(baseline, seed)
            need(cell, seed)
    return todo
