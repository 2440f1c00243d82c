import json
import os
from pathlib import Path

from studies.lock_holder import hold_finished
from studies.method_study import run_dir, run_lock


def test_a_finished_runs_lock_is_held_so_a_lane_that_listed_it_earlier_skips_it(tmp_path: Path) -> None:
    """The finished run's lock is taken and kept, so a study process's ``run_lock`` finds it held and skips the run;
    an unfinished run's lock is left alone, and one still held by its own study process is taken at a later sweep."""
    out = tmp_path / "study"
    done, todo, finishing = (run_dir(out / "evaluate", "grpo", "none", s) for s in (0, 1, 2))
    for folder in (done, todo, finishing):
        folder.mkdir(parents=True)
    (done / "done.json").write_text(json.dumps({"returncode": 0}))
    (finishing / "done.json").write_text(json.dumps({"returncode": 0}))
    own = run_lock(finishing)  # its study process has not let go yet
    held: dict[Path, int] = {}
    try:
        assert hold_finished(out, held) == [done.parent / ".seed0.lock"]
        assert hold_finished(out, held) == []  # kept, not taken twice
        assert run_lock(done) is None  # a lane finds it held
        free = run_lock(todo)
        assert free is not None
        os.close(free)
        os.close(own)
        assert hold_finished(out, held) == [finishing.parent / ".seed2.lock"]  # taken at the next sweep
    finally:
        for fd in held.values():
            os.close(fd)
