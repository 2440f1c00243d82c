"""Nothing lost on a crash, exact resume (issue 12): kill a real run, resume it, compare with one never killed.

For every controller: K iterations uninterrupted (the baseline); the same config in a subprocess that is
SIGKILLed once the checkpoint of iteration J exists; a resume from its ``last.ckpt`` into the same run
folder. The resumed run must equal the baseline — every TensorBoard scalar (each step once, as TensorBoard
reads the folder), the final parameters, optimizer, scheduler, controller, diagnostics and RNG states.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT

pytestmark = pytest.mark.integration

K, J = 4, 2  # iterations in all; the kill comes once the checkpoint after J iterations exists
LAB = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "batch.micro_batch_size=16", f"trainer.max_epochs={K}", "callbacks.checkpoint.keep_iterations=true",
       "~callbacks.progress", "+trainer.enable_progress_bar=false"]
ENGINE = {"entrocraft_hard": "vllm"}  # the lab default on the real engine; the rest on HF generate (faster start)
DEFAULT_SUITE = ()  # all `slow`: in the default tier a SIGKILL and its resume are the overlapped run's below (a kill
# while a batch is being sampled ahead), the plain boundary resume is the Ctrl-C test's, and every controller's state
# is test_controller_resume.py's
CONTROLLERS = ["none", "entrocraft_hard", "adapo", "entrocraft", "repo_d", "repo_r", "adaptive_bonus", "entropic"]


def _overrides(name: str, *extra: str) -> list[str]:
    rollout = ENGINE.get(name, "hf")
    return [*LAB, f"callbacks/entropy={name}", f"rollout={rollout}",
            *(["rollout.engine.show_progress=false"] if rollout == "vllm" else []), *extra]


def _cmd(run: Path, name: str, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "scripts" / "train.py"), *_overrides(name),
            f"paths.log_dir={run.parent}", f"hydra.run.dir={run}", *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1"}


def train(run: Path, name: str, *extra: str, ok: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(_cmd(run, name, *extra), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    if ok:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _sigint_default() -> None:
    """In the child before exec: SIGINT handled by default, even if this process ignores it (exec would
    keep an ignore, and the child's Python would then never raise KeyboardInterrupt)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_and_signal(run: Path, name: str, sig: int, after: int = J, extra: tuple[str, ...] = ()) -> int:
    """Start a run, send ``sig`` as soon as the checkpoint after ``after`` iterations exists; its exit code."""
    run.mkdir(parents=True, exist_ok=True)
    with open(run.parent / f"{run.name}.out", "w") as out:
        proc = subprocess.Popen(_cmd(run, name, *extra), cwd=ROOT, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=_sigint_default)
        marker = run / "checkpoints" / f"iteration-{after:04d}.ckpt"
        deadline = time.monotonic() + 400
        while not marker.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"no {marker.name} while the run was alive (exit {proc.returncode}):\n"
                            + (run.parent / f"{run.name}.out").read_text()[-4000:])
            time.sleep(0.01)
        proc.send_signal(sig)
        code = proc.wait(timeout=300)
    assert not (run / "checkpoints" / f"iteration-{K:04d}.ckpt").exists(), (
        f"the run went on to its end after the signal (exit {code}):\n"
        + (run.parent / f"{run.name}.out").read_text()[-4000:])
    return code


def tb_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    """Scalars of a run folder as TensorBoard shows them: all event files of the folder read in order,
    events orphaned by a restart (``purge_step``) dropped."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


_BASELINES: dict[tuple, Path] = {}


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, harness):
    """One uninterrupted K-iteration run per controller, shared by the tests of this module: in-process
    (tests/harness.py) with an engine of its own (``fresh_engine``: a shared engine that served other fits
    before gave scalars that differ from a fresh process's in the full suite), the killed and resumed runs
    it is compared with are real processes."""

    def get(name: str, extra: tuple[str, ...] = ()) -> Path:
        if (name, extra) not in _BASELINES:
            run = harness.fit(_overrides(name, *extra), tmp_path_factory.mktemp(f"base_{name}"), smoke=False,
                              fresh_engine=True)
            _BASELINES[name, extra] = run.run_dir
        return _BASELINES[name, extra]

    return get


def _flat(obj, prefix: str = "") -> dict[str, object]:
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            out.update(_flat(v, f"{prefix}/{k}"))
        return out
    if isinstance(obj, list | tuple):
        out = {}
        for i, v in enumerate(obj):
            out.update(_flat(v, f"{prefix}[{i}]"))
        return out
    return {prefix: obj}


def max_state_diff(a: Path, b: Path) -> tuple[float, list[str]]:
    """Largest |difference| over every tensor and number of two checkpoints, and the keys that differ."""
    ca = torch.load(a, map_location="cpu", weights_only=True)
    cb = torch.load(b, map_location="cpu", weights_only=True)
    skip = ("hparams", "hyper_parameters", "IterationCheckpoint", "pytorch-lightning_version")
    fa = {k: v for k, v in _flat(ca).items() if not any(s in k for s in skip)}
    fb = {k: v for k, v in _flat(cb).items() if not any(s in k for s in skip)}
    assert fa.keys() == fb.keys(), set(fa) ^ set(fb)
    worst, differ = 0.0, []
    for k, va in fa.items():
        vb = fb[k]
        if isinstance(va, torch.Tensor):
            same = va.shape == vb.shape and torch.equal(va, vb)
            if not same and va.is_floating_point() and va.shape == vb.shape:
                worst = max(worst, float((va.double() - vb.double()).abs().max()))
        else:
            same = va == vb or (va != va and vb != vb)  # NaN == NaN
            if not same and isinstance(va, float) and isinstance(vb, float):
                worst = max(worst, abs(va - vb))
        if not same:
            differ.append(k)
    return worst, differ


def assert_same_as_baseline(run: Path, base: Path) -> dict[str, float]:
    """The resumed folder shows exactly the baseline's scalars (each step once) and ends in its state."""
    got, want = tb_scalars(run), tb_scalars(base)
    tags = sorted(t for t in want if not t.startswith("time/"))  # wall-clock seconds differ by nature
    assert set(tags) <= set(got), set(tags) - set(got)
    worst = {}
    for tag in tags:
        steps, want_steps = [s for s, _ in got[tag]], [s for s, _ in want[tag]]
        # each step once (Lightning's own `epoch` too: the iterations' values go to their own steps, without it)
        assert len(steps) == len(set(steps)), f"{tag}: duplicate steps {steps}"
        assert steps == want_steps, f"{tag}: steps {steps} vs {want_steps}"
        worst[tag] = max(abs(a - b) for (_, a), (_, b) in zip(got[tag], want[tag], strict=True))
    for tag in ("rollout/entropy", "rollout/accuracy", "train/loss"):
        assert len(want[tag]) >= K, tag
    state_diff, differ = max_state_diff(run / "checkpoints" / "last.ckpt", base / "checkpoints" / "last.ckpt")
    assert not differ, f"final checkpoints differ in {differ[:20]} (max |Δ| {state_diff:.3g})"
    bad = {t: d for t, d in worst.items() if d != 0.0}
    assert not bad, f"scalars differ from the uninterrupted run: {bad}"
    return worst


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=() if n in DEFAULT_SUITE else pytest.mark.slow) for n in CONTROLLERS])
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, baseline, name):
    from lit_entropy.utils.checkpointing import check_resumable

    base = baseline(name)
    run = tmp_path / "run"
    code = start_and_signal(run, name, signal.SIGKILL)
    assert code == -signal.SIGKILL
    last = run / "checkpoints" / "last.ckpt"
    meta = check_resumable(last)  # complete, readable, an iteration boundary
    assert meta["kind"] == "iteration" and meta["iteration"] >= J
    train(run, name, f"ckpt_path={last}")
    worst = assert_same_as_baseline(run, base)
    print(f"\n[{name}] killed after {meta['iteration']} of {K} iterations; {len(worst)} scalar tags, "
          f"max |Δ| {max(worst.values())}; final checkpoint identical")


OVERLAP = ("rollout.max_staleness=1",)


@pytest.mark.parametrize("name", ["entrocraft_hard", pytest.param("none", marks=pytest.mark.slow)])
def test_sigkill_mid_overlap_then_resume_equals_uninterrupted(tmp_path, baseline, name):
    """``rollout.max_staleness=1`` (issue 29), vLLM (entrocraft_hard) and HF: the checkpoint of iteration J holds
    the batch sampled during update J - 1, the kill comes while batch J + 1 is launched or generating; the
    resume trains on exactly the uninterrupted run's rows (the final checkpoint, with its batch sampled
    ahead, included)."""
    from lit_entropy.utils.checkpointing import check_resumable

    base = baseline(name, OVERLAP)
    lag = [v for _, v in tb_scalars(base)["rollout/staleness_max"]]
    assert lag == [0.0] + [1.0] * (K - 1)  # one-step-off from iteration 1 on, never older
    run = tmp_path / "run"
    assert start_and_signal(run, name, signal.SIGKILL, extra=OVERLAP) == -signal.SIGKILL
    last = run / "checkpoints" / "last.ckpt"
    meta = check_resumable(last)
    assert meta["kind"] == "iteration" and meta["iteration"] >= J
    ready = torch.load(last, map_location="cpu", weights_only=True)["RolloutDataModule"]["overlap"]["ready"]
    assert set(ready) == {str(meta["iteration"])}  # the batch sampled during the last update, drained into it
    train(run, name, *OVERLAP, f"ckpt_path={last}")
    assert_same_as_baseline(run, base)


def test_ctrl_c_leaves_a_checkpoint_that_resumes_exactly(tmp_path, baseline):
    name = "entrocraft_hard"
    base = baseline(name)
    run = tmp_path / "run"
    code = start_and_signal(run, name, signal.SIGINT, after=1)
    assert code == 1  # Lightning's graceful shutdown on KeyboardInterrupt
    ckpts = run / "checkpoints"
    exc = torch.load(ckpts / "exception.ckpt", map_location="cpu", weights_only=True)
    assert exc["lit_entropy"]["kind"] == "exception" and "KeyboardInterrupt" in exc["lit_entropy"]["reason"]
    assert not list(ckpts.glob(".*.tmp"))
    train(run, name, f"ckpt_path={ckpts / 'last.ckpt'}")
    assert_same_as_baseline(run, base)


def test_floating_point_error_leaves_checkpoints(tmp_path, harness):
    """A learning rate that blows the weights up: the run dies with FloatingPointError and leaves both the
    last boundary (resumable) and the state at the error (refused as ``ckpt_path``, naming last.ckpt).
    In-process: the exception is what ends the run (scripts/train.py exits non-zero with it)."""
    from lit_entropy.utils.checkpointing import check_resumable

    with pytest.raises(FloatingPointError):
        harness.fit(_overrides("none", "optim.lr=1e20", "optim.max_grad_norm=0", "module.uniform_entropy_tol=null",
                               "module.max_logp_mismatch_mean=null"), tmp_path, smoke=False)
    ckpts = tmp_path / "run" / "checkpoints"
    assert check_resumable(ckpts / "last.ckpt")["kind"] == "iteration"  # boundary 0: before the first rollout
    exc = torch.load(ckpts / "exception.ckpt", map_location="cpu", weights_only=True)
    assert "FloatingPointError" in exc["lit_entropy"]["reason"]
    with pytest.raises(ValueError, match="last.ckpt"):
        check_resumable(ckpts / "exception.ckpt")


def test_truncated_checkpoint_is_refused_at_start_up_naming_it(tmp_path, baseline, monkeypatch):
    """``lit_entropy.train.run`` (what scripts/train.py calls) refuses it before ``build``: before the warm
    start and the engine start; the message names the file and says why, without the unpickler's trace."""
    import traceback

    from lit_entropy import train as train_mod
    from tests.helpers import compose_train

    good = baseline("none") / "checkpoints" / "last.ckpt"
    bad = tmp_path / "truncated.ckpt"
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    cfg = compose_train([*_overrides("none"), f"ckpt_path={bad}", f"paths.output_dir={tmp_path / 'run'}"])
    monkeypatch.setattr(train_mod, "build", lambda *a, **k: pytest.fail("built before the checkpoint check"))
    with pytest.raises(Exception) as err:  # noqa: B017 - what it raises is checked below, by its text
        train_mod.run(cfg)
    printed = "".join(traceback.format_exception(err.value))  # what the process would print on stderr
    assert str(bad) in printed and "truncated" in printed, printed[-3000:]
    assert "Unpickling" not in printed and "PytorchStreamReader" not in printed
