"""Benchmarks: ``python scripts/bench.py [--quick] [--only generate,entropy]``.

``python scripts/bench.py --vs trl [--quick] [--settings hf,vllm] [--pairs N] [--iters N]`` instead runs
the side-by-side benchmark against TRL's ``GRPOTrainer`` (``benchmarks.vs_trl``; needs the
``bench`` extra; ``--vs trl --help`` lists its options).

* ``generate``: the lab policy sampling Countdown completions with vLLM and with HF ``generate``, at a
  few batch sizes (and vLLM's ``sync_weights``).
* ``entropy``: chunked ``token_logprobs_and_entropy`` vs the naive full ``log_softmax`` on random
  logits, forward only and forward + backward, time and peak extra resident memory (each measurement
  in a fresh interpreter, so peaks do not mix).

Every time is the median over ``--repeats`` runs after one warm-up. Writes ``OUT/bench.json`` (machine,
settings, raw measurements) and ``OUT/bench.md`` (the tables, also printed); ``--vs trl`` writes
``OUT/vs_trl.json`` and ``OUT/vs_trl.md``. The code: ``benchmarks/``.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the checkout this script sits in, before any installed copy
    sys.path.insert(0, str(ROOT))

from benchmarks import components, vs_trl  # noqa: E402


def main_vs_trl(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.py --vs trl", description=vs_trl.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="bench_results/", help="output directory")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    parser.add_argument("--iters", type=int, default=None, help="iterations per run (5; quick: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="leading iterations excluded from the statistics")
    parser.add_argument("--pairs", type=int, default=None, help="ours/TRL run pairs per setting (3; quick: 1)")
    parser.add_argument("--settings", default="hf,vllm", help="comma list of hf, vllm, vllm_overlap")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override for both sides "
                        "(repeatable), e.g. --override callbacks/diagnostics=none")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run")
    parser.add_argument("--from-json", help="re-summarise the raw runs of an earlier vs_trl.json (e.g. with "
                        "another --warmup) instead of running")
    args = parser.parse_args(argv)
    settings = [x.strip() for x in args.settings.split(",") if x.strip()]
    if not args.from_json and (not settings or set(settings) - set(vs_trl.SETTINGS)):
        parser.error(f"--settings takes a comma list of {', '.join(vs_trl.SETTINGS)}, got {args.settings!r}")
    try:
        if args.from_json:
            vs_trl.resummarize(json.loads(Path(args.from_json).read_text()), args.warmup, Path(args.out))
        else:
            vs_trl.run(Path(args.out), settings, quick=args.quick, iters=args.iters, warmup=args.warmup,
                       pairs=args.pairs, extra_overrides=tuple(args.override), timeout=args.timeout)
    except ValueError as err:  # the options do not fit together
        parser.error(str(err))
    except ModuleNotFoundError as err:  # trl, when the `bench` extra is not installed
        sys.exit(str(err))


def main() -> None:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--vs", choices=("trl",))
    known, rest = pre.parse_known_args()
    if known.vs == "trl":  # every other option belongs to the TRL comparison
        return main_vs_trl(rest)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vs", choices=("trl",), help="compare against another trainer instead "
                        "(`--vs trl --help` lists its options)")
    parser.add_argument("--out", default="bench_results/", help="output directory")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test, not a measurement)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per measurement (5; quick: 2)")
    parser.add_argument("--cache-dir", default=".cache/lit_entropy", help="warm-started policy cache")
    parser.add_argument("--only", default=",".join(components.BENCHMARKS),
                        help=f"comma list of {', '.join(components.BENCHMARKS)}")
    args = parser.parse_args()
    only = [b.strip() for b in args.only.split(",") if b.strip()]
    if not only or set(only) - set(components.BENCHMARKS):
        parser.error(f"--only takes a comma list of {', '.join(components.BENCHMARKS)}, got {args.only!r}")
    if args.repeats is not None and args.repeats < 1:
        parser.error("--repeats must be >= 1")
    components.run(Path(args.out), quick=args.quick, repeats=args.repeats, only=tuple(only),
                   cache_dir=args.cache_dir)


if __name__ == "__main__":
    main()
