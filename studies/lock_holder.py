"""Hold the run lock of every finished run below a study folder, for as long as this process lives.

A study process lists the runs it has to do when it starts. Before ``_run_one`` re-checked ``done.json`` under the
run's lock, a lane that reached a run another lane had finished since found its lock free and no checkpoint to
resume from, and cleared it. A study pinned at a commit from before that check (the verdicts study's evaluation
worktree) stays safe when this runs beside its lanes: a finished run's lock is taken, so a lane skips it as
running elsewhere.

    python -m studies.lock_holder ../verdicts-out      # beside the lanes; stop it with them
"""
from __future__ import annotations

import argparse
import fcntl
import os
import time
from pathlib import Path


def hold_finished(out: Path, held: dict[Path, int]) -> list[Path]:
    """Take the lock (``.<run>.lock`` beside the run folder) of each finished run below ``out`` not in ``held``;
    record each taken lock's descriptor in ``held`` and return the locks taken now. A lock still held by the run's
    own study process (it writes ``done.json`` a moment before it lets go) is left for the next sweep."""
    taken = []
    for done in sorted(out.glob("*/runs/*/*/done.json")):
        lock = done.parent.parent / f".{done.parent.name}.lock"
        if lock in held:
            continue
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        held[lock] = fd
        taken.append(lock)
    return taken


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the study's folder (--out of scripts/study.py)")
    parser.add_argument("--every", type=float, default=2.0, help="seconds between sweeps")
    args = parser.parse_args(argv)
    held: dict[Path, int] = {}
    while True:
        for lock in hold_finished(args.out, held):
            print(time.strftime("%H:%M:%S"), "holding", lock, flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    main()
