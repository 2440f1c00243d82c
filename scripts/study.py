"""Run a method study on the lab and write its table and figure.

    python scripts/study.py --algos grpo,dapo,clip_cov --controllers none,entrocraft_hard \
        [--cells ce_gppo+gppo_beta,...] [--seeds 0,1,2] [--iterations 40] [--out logs/method_study]
        [--variant NAME:OVERRIDES ...] [--lanes 2] [-- extra Hydra overrides]

Runs every algo x controller (plus the --cells) x seed with ``scripts/train.py``, seed by seed, ``--lanes``
at a time, each lane pinned to its own CPU cores (a finished run is not run again, so an interrupted study
resumes), then writes ``<out>/study.md`` (mean ± sd over seeds of the
final entropy, last-5 accuracy, held-out pass@1 and pass@8, band error and seconds per iteration) and
``<out>/study.png`` (entropy and accuracy curves; ``--report NAME`` names them NAME.md, NAME.png). ``--summarise-only`` skips running
(with ``--protocol``: the phase's report of the runs finished so far).
``--protocol P --progress`` prints where each of the protocol's runs stands and what is left (studies/progress.py).
``--export-records FILE`` keeps the finished runs in one small file and ``--import-records FILE`` writes them
back (studies/records.py), so a study's numbers outlive its ``logs/`` folder.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from studies.method_study import (  # noqa: E402
    COLUMNS,
    DEFAULT_COLUMNS,
    StudyPlan,
    lane_cores,
    parse_cells,
    run_study,
    summarise,
)
from studies.study_plot import plot  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--algos", help="comma-separated conf/algo presets (required without --protocol)")
    ap.add_argument("--controllers", default="none", help="comma-separated conf/callbacks/entropy entries")
    ap.add_argument("--cells", default="", help="further algo+controller cells beyond the grid, comma-separated, "
                                                "e.g. ce_gppo+gppo_beta")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--iterations", type=int, default=40)
    ap.add_argument("--eval-problems", type=int, default=64)
    ap.add_argument("--eval-n", type=int, default=8, help="samples per held-out problem (the largest k)")
    ap.add_argument("--eval-ks", default="1,8", help="the k of the held-out pass@k, comma-separated")
    ap.add_argument("--eval-every", type=int, default=None,
                    help="also evaluate every N iterations during training (default: after the last only)")
    ap.add_argument("--out", type=Path, default=None, help="default logs/method_study, or the protocol's out")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:OVERRIDES",
                    help="a named set of space-separated overrides, a third axis (repeatable), e.g. "
                         "'bf16:rollout.engine.dtype=bfloat16 correction=tis'")
    ap.add_argument("--columns", default=",".join(DEFAULT_COLUMNS),
                    help=f"table columns, comma-separated, from {','.join(COLUMNS)}")
    ap.add_argument("--sort", default="acc_last5", help="the column the table ranks cells by, highest first")
    ap.add_argument("--lanes", type=int, default=1,
                    help="runs at once, each pinned to its own equal share of the CPU cores (default 1)")
    ap.add_argument("--report", default="study", help="the table and figure are <out>/<report>.md and .png")
    ap.add_argument("--start-eval", type=Path, default=None,
                    help="scripts/evaluate.py's JSON of the policy every run starts from: drawn at iteration 0 "
                         "of the pass@k panels (runs with callbacks.eval.at_start=true log their own)")
    ap.add_argument("--summarise-only", action="store_true")
    ap.add_argument("--protocol", type=Path, default=None, help="a tuning protocol, e.g. conf/protocol/collapse.yaml")
    ap.add_argument("--phase", choices=("tune", "evaluate"), default=None, help="the protocol's phase to run")
    ap.add_argument("--dry-run", action="store_true", help="print the protocol phase's cells and overrides, run nothing")
    ap.add_argument("--while-tuning", action="store_true",
                    help="with --phase evaluate: run the evaluation runs of the methods whose setting is final while "
                         "the other methods' tuning runs go on (the report waits for every pick)")
    ap.add_argument("--progress", action="store_true",
                    help="with --protocol: print where every run of both phases stands (state, iterations, the final "
                         "evaluation's share done, machine and commit, lane-hours) and an estimate of what is left; "
                         "run nothing")
    ap.add_argument("--check", action="store_true", help="compose and build every cell's config before running")
    ap.add_argument("--allow-slow-bf16", action="store_true",
                    help="run bf16 cells on a CPU without bf16 units even without the bf16-via-fp32 shim (6-12x slower)")
    ap.add_argument("--import-records", type=Path, default=None, metavar="FILE",
                    help="first write the finished runs of a records file (--export-records) under the out folder, "
                         "keeping runs already there; without --phase, only that")
    ap.add_argument("--export-records", type=Path, default=None, metavar="FILE",
                    help="last write every finished run under the out folder to FILE (gzipped JSON, ~8 kB a "
                         "run: studies/records.py); without --phase, only that")
    args = ap.parse_args(argv)
    if args.progress and args.protocol is None:
        ap.error("--progress goes with --protocol")
    if args.protocol is not None:
        return run_protocol(args, overrides, ap)
    if not args.algos:
        ap.error("--algos is required (or give --protocol)")
    args.out = args.out or Path("logs/method_study")
    try:
        cells = parse_cells(args.cells)
        lane_cores(args.lanes)  # a lane count the machine cannot split names itself before anything runs
    except ValueError as err:
        ap.error(str(err))
    plan = StudyPlan(algos=args.algos.split(","), controllers=args.controllers.split(","),
                     seeds=[int(s) for s in args.seeds.split(",")], iterations=args.iterations,
                     eval_problems=args.eval_problems, eval_n=args.eval_n,
                     eval_ks=tuple(int(k) for k in args.eval_ks.split(",")), eval_every=args.eval_every,
                     overrides=overrides,
                     variants={name: rest.split() for name, _, rest in (v.partition(":") for v in args.variant)},
                     cells=cells)
    from studies.records import export_records, import_records

    if args.import_records is not None:
        print("imported {} runs ({} already there, kept)".format(*import_records(args.import_records, args.out)))
    if not args.summarise_only:
        refuse_slow_bf16(plan, args, ap)
        run_study(plan, args.out, ROOT / "scripts" / "train.py", lanes=args.lanes)
    if args.export_records is not None:
        print(f"exported {export_records(args.out, args.export_records)} runs to {args.export_records}")
    table, _ = summarise(plan, args.out, tuple(args.columns.split(",")), sort_by=args.sort)
    print(table)
    md, png = args.out / f"{args.report}.md", args.out / f"{args.report}.png"
    md.write_text(table + "\n")
    start = None
    if args.start_eval is not None:
        import json

        start = {k: float(v) for k, v in json.loads(args.start_eval.read_text()).items() if k.startswith("eval/")}
    plot(plan, args.out, png, start=start)
    print(f"wrote {md} and {png}")
    return 0


def refuse_slow_bf16(plan, args: argparse.Namespace, ap: argparse.ArgumentParser) -> None:
    """Stop before the first run where its cells would train in bf16 on a CPU that crawls at it (an iteration of
    the real-LM study: over 20 minutes instead of about 2), unless ``--allow-slow-bf16``."""
    import torch

    from lit_entropy.policy.precision import cpu_half_support
    from studies.bf16_via_fp32 import installed
    from studies.protocol_preview import precisions, slow_precision_reason

    if args.allow_slow_bf16:
        return
    reason = slow_precision_reason(precisions(plan), not torch.cuda.is_available(), cpu_half_support(), installed())
    if reason:
        ap.error(reason)


def run_protocol(args: argparse.Namespace, overrides: list[str], ap: argparse.ArgumentParser) -> int:
    """``--protocol``: dry-run, check or run one phase (see the module docstring)."""
    from studies.protocol import load_protocol
    from studies.protocol_phases import MissingPicks, run_phase
    from studies.protocol_preview import check_points, dry_run, phase_points
    from studies.records import export_records, import_records

    records_only = args.import_records is not None or args.export_records is not None
    if args.progress:
        from studies.progress import progress_report

        try:
            protocol = load_protocol(args.protocol)
        except ValueError as err:
            ap.error(str(err))
        print(progress_report(protocol, args.out or Path(protocol.out)), end="")
        return 0
    if args.phase is None and not records_only:
        ap.error("--protocol needs --phase tune or --phase evaluate (or --import-records / --export-records)")
    if args.while_tuning and args.phase != "evaluate":
        ap.error("--while-tuning goes with --phase evaluate")
    try:
        protocol = load_protocol(args.protocol)
        lane_cores(args.lanes)
    except ValueError as err:
        ap.error(str(err))
    out = args.out or Path(protocol.out)
    if args.import_records is not None:
        try:
            written, kept = import_records(args.import_records, out)
        except (OSError, ValueError) as err:
            ap.error(str(err))
        print(f"imported {written} runs from {args.import_records} into {out} ({kept} already there, kept)")
    if args.phase is None:
        if args.export_records is not None:
            print(f"exported {export_records(out, args.export_records)} runs under {out} to {args.export_records}")
        return 0
    train_script = ROOT / "scripts" / "train.py"
    if args.check:
        points, _ = phase_points(protocol, args.phase, out)
        points = protocol.all_points() if points is None or args.phase == "tune" else points
        print(f"checked {check_points(protocol, points, overrides)} cells: every override composes and builds")
    if args.dry_run:
        print(dry_run(protocol, args.phase, out, train_script, overrides, while_tuning=args.while_tuning))
        return 0
    if not args.summarise_only:
        refuse_slow_bf16(protocol.plan(protocol.all_points(), protocol.tuning_seeds, overrides), args, ap)
    out.mkdir(parents=True, exist_ok=True)
    try:
        report = run_phase(protocol, args.phase, out, train_script, lanes=args.lanes, extra=overrides,
                           run=not args.summarise_only, while_tuning=args.while_tuning)
    except MissingPicks as err:  # no picks.json, and unfinished tuning runs to pick from: a usage error
        ap.error(str(err))
    print(report)
    if args.export_records is not None:
        print(f"exported {export_records(out, args.export_records)} runs under {out} to {args.export_records}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
