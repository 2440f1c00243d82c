"""What a protocol phase would run, without running it: ``scripts/study.py --dry-run`` (each cell with its
Hydra overrides, the count of runs, the time estimate) and ``--check`` (every cell composed and built)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from studies.method_study import StudyPlan, run_dir
from studies.pair_schedule import here, schedule
from studies.protocol import Point, Protocol, current_tuning_points, evaluation_points, pick, picked_points


def phase_points(protocol: Protocol, phase: str, out: Path,
                 while_tuning: bool = False) -> tuple[list[Point] | None, list[int]]:
    """The points and seeds of a phase; for ``evaluate`` before tuning has picked every method (no ``picks.json``,
    or one written while tuning runs were unfinished), ``None`` points. ``while_tuning``: the points of the methods
    with a pick so far (from the tuning runs under ``out/tune``), ``None`` before the baseline has one."""
    if phase == "tune":
        return current_tuning_points(protocol, out / "tune"), protocol.tuning_seeds
    if while_tuning:
        picks = pick(protocol, out / "tune")
        ready = protocol.baseline in picks["methods"]
        return (picked_points(picks, protocol, ready_only=True) if ready else None), protocol.all_evaluation_seeds()
    f = out / "picks.json"
    picks = json.loads(f.read_text()) if f.is_file() else {"methods": {}}
    if any(m not in picks["methods"] for m in protocol.methods):
        return None, protocol.all_evaluation_seeds()
    return evaluation_points(picks, protocol), protocol.all_evaluation_seeds()


def dry_run(protocol: Protocol, phase: str, out: Path, train_script: Path, extra: list[str] = (),
            while_tuning: bool = False) -> str:
    """What a phase would run, without running it: each cell with its Hydra overrides, the seeds, the count of
    runs and the protocol's estimate of their time on one core (``while_tuning``: of the methods with a pick)."""
    from studies.method_study import train_command

    points, seeds = phase_points(protocol, phase, out, while_tuning)
    lines = [f"protocol {protocol.name}, phase {phase}: seeds {seeds}"]
    if points is None:
        lines.append(f"(no picks of every method in {out / 'picks.json'} yet: evaluate runs each method's pick of its "
                     "grid once tuning has finished)")
        for m in protocol.methods.values():
            lines.append(f"  {m.name}: algo={m.algo} callbacks/entropy={m.controller}, one of {len(m.points())} points")
        for c in protocol.control_points():
            lines.append(f"  {c.method}: control at {c.setting}")
        runs = sum(len(protocol.seeds_of(m)) for m in protocol.methods) + len(protocol.controls) * len(
            protocol.seeds_of(protocol.baseline))
        runs_left = runs
    else:
        plan = protocol.plan(points, seeds, extra, phase=phase)
        controls = protocol.control_points() if phase == "evaluate" else []
        for p in points:
            cmd = train_command(plan, *p.cell, seeds[0], out / phase, train_script)
            shown = [a for a in cmd[2:] if not a.startswith(("seed=", "hydra.run.dir="))]
            method = f"{p.method} (control)" if p in controls else p.method
            lines.append(f"  {method:<16} {p.setting:<48} {' '.join(shown)}")
        runs = len(plan.runs())
        folders = [run_dir(out / phase, *run) for run in plan.runs()]
        finished = sum((f / "done.json").is_file() for f in folders)
        going = sum(not (f / "done.json").is_file() and (f / "checkpoints" / "last.ckpt").is_file() for f in folders)
        left = runs - finished
        if finished or going:
            lines.append(f"  in {out / phase}: {finished} finished, {going} under way (each resumes from its last "
                         f"checkpoint), {runs - finished - going} not started")
        if phase == "evaluate" and protocol.interval.pairing == "seed_machine_commit":
            pairing = here(train_script)
            todo = schedule(plan, out / phase, points[0].cell, pairing)
            again = sum("@" in folder.name for *_, folder in todo)
            left = len(todo)
            lines.append(f"  on {pairing}: {len(todo)} runs to do, {again} of them a seed run again here to pair "
                         "(studies/pair_schedule.py)")
        if while_tuning and phase == "evaluate":
            waiting = [m for m in protocol.methods if all(p.method != m for p in points)]
            if waiting:
                lines.append(f"  (while tuning: waiting for the tuning of {', '.join(waiting)})")
        if phase == "tune":
            later = [m.name for m in protocol.methods.values()
                     if m.tuned and all(p.method != m.name for p in points)]
            if later:
                lines.append(f"  (then, at {protocol.baseline}'s pick of {', '.join(protocol.calibrate)}: "
                             f"{', '.join(later)}; tune.calibrate_first)")
            once = [m.name for m in protocol.methods.values() if not m.tuned]
            if once:
                lines.append(f"  (one setting, not tuned: {', '.join(once)})")
        runs_left = left
    hours = protocol.seconds(runs_left, phase) / 3600
    split = f"{runs // len(seeds)} cells x {len(seeds)} seeds" if runs % len(seeds) == 0 and (
        phase == "tune" or all(len(protocol.seeds_of(m)) == len(seeds) for m in protocol.methods)) else \
        f"each cell on its seeds of {seeds}"
    left_note = f", {runs_left} not finished" if runs_left != runs else ""
    lines.append(f"{runs} runs ({split}){left_note}, about {hours:.1f} h on one core "
                 f"(cost: {protocol.cost}); with --lanes 2 on 2 cores about {hours / 1.8:.1f} h for the lab's model, "
                 f"{hours / 1.4:.1f}-{hours / 1.1:.1f} h for SmolLM2 on a 2-core AVX2 machine (two lanes do 1.1-1.4x "
                 "one lane's work there, docs/results.md)")
    return "\n".join(lines)


def composed(plan: StudyPlan, cells: list[tuple[str, str]], seed: int, conf_dir: Path | None = None):
    """Each cell's run config as ``scripts/train.py`` would compose it from the plan's command line, with no Hydra
    run (no run folder): yields ``(cell, cfg)``; an unknown key raises as at start-up."""
    from hydra import compose, initialize_config_dir

    from studies.method_study import train_command

    conf_dir = conf_dir or Path(__file__).resolve().parents[1] / "conf"
    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        for cell in cells:
            cmd = train_command(plan, *cell, seed, Path("/tmp/protocol-check"), Path("train.py"))
            overrides = [*(a for a in cmd[2:] if not a.startswith("hydra.")),
                         "paths.output_dir=/tmp/lit-entropy-protocol-check"]
            yield cell, compose(config_name="train", overrides=overrides)


def check_points(protocol: Protocol, points: list[Point], extra: list[str] = (), conf_dir: Path | None = None) -> int:
    """Compose every point's config with its overrides (an unknown key fails by name) and build its objective and
    callbacks (a bad value fails as at start-up). Returns the number of points checked."""
    from hydra.utils import instantiate

    from lit_entropy.train import instantiate_callbacks

    plan = protocol.plan(points, protocol.tuning_seeds, extra)
    configs = composed(plan, [p.cell for p in points], protocol.tuning_seeds[0], conf_dir)
    with contextlib.closing(configs):  # a point that fails to build leaves Hydra's context closed behind it
        for p in points:
            try:
                _, cfg = next(configs)
                instantiate(cfg.algo)
                instantiate_callbacks(cfg.callbacks)
            except Exception as err:
                raise ValueError(f"protocol {protocol.name}, point {p.name}: {err}") from err
    return len(points)


def precisions(plan: StudyPlan, conf_dir: Path | None = None) -> set[tuple[str, str | None]]:
    """``(trainer precision, engine dtype)`` of each cell of ``plan`` (its first seed's command line, composed;
    nothing built), e.g. ``{("bf16-mixed", "bfloat16")}``."""
    found = set()
    for _, cfg in composed(plan, plan.grid(), plan.seeds[0], conf_dir):
        engine = cfg.get("rollout", {}).get("engine", {}) or {}
        found.add((str(cfg.trainer.precision), None if engine.get("dtype") is None else str(engine.get("dtype"))))
    return found


def slow_precision_reason(cells: set[tuple[str, str | None]], on_cpu: bool, support: dict[str, bool],
                          shim: bool) -> str | None:
    """Why a study of ``cells`` (:func:`precisions`) would crawl on this CPU, or ``None``: the start-up warning of
    :func:`lit_entropy.policy.precision.slow_half_precision_note` for a cell, unless the bf16-via-fp32 shim is
    installed (``shim``) and the cell is bf16 (the shim does nothing for fp16). On such a CPU an iteration of the
    real-LM study takes over 20 minutes instead of about 2; launched so, a study loses hours before anyone reads
    its log."""
    from lit_entropy.policy.precision import engine_dtype_for, slow_half_precision_note

    for trainer_precision, engine_dtype in sorted(cells, key=str):
        note = slow_half_precision_note(trainer_precision, engine_dtype, on_cpu, support)
        fp16 = "float16" in (engine_dtype_for(trainer_precision), engine_dtype)
        if note and (fp16 or not shim):
            return (f"{note}. A study's bf16 cells run there through the bf16-via-fp32 shim: add its .pth to this "
                    f"environment (docs/real_lm_study.md says how) and set LIT_ENTROPY_BF16_VIA_FP32=1 with a "
                    f"VLLM_CACHE_ROOT of its own, or pass --allow-slow-bf16")
    return None
