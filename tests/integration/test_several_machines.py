"""Two "machines" on loopback give one process's run: ``torchrun --nnodes=2 --nproc-per-node=1`` per node
with ``trainer=ddp trainer.devices=1 trainer.num_nodes=2`` (docs/scaling.md, "Several machines").

Each node is its own ``torchrun`` (node ranks 0 and 1, rendezvous at 127.0.0.1), exactly as on two
hosts; Lightning's ``TorchElasticEnvironment`` takes the ranks from torchrun. The overrides and the
tolerances are the CPU rank-invariance tests' (``test_distributed.py``): the first iteration's
rollouts are identical, the update agrees to 1e-6, and so does everything after it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, read_scalars
from tests.integration.test_distributed import LAB, _env

pytestmark = [pytest.mark.integration, pytest.mark.slow]

OVERRIDES = [*LAB, "batch.micro_batch_size=8", "trainer.max_epochs=2"]
TIMEOUT = 1800  # a loaded 2-core machine runs the three processes at a fraction of a core each


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_command(run: Path, *extra: str) -> list[str]:
    return [str(ROOT / "scripts" / "train.py"), *OVERRIDES, f"paths.log_dir={run.parent}",
            f"hydra.run.dir={run}", *extra]


def check(proc: subprocess.CompletedProcess | subprocess.Popen, out: str, err: str) -> None:
    assert proc.returncode == 0, out[-3000:] + err[-5000:]


def one_process(run: Path) -> None:
    proc = subprocess.run([sys.executable, *train_command(run)], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    check(proc, proc.stdout, proc.stderr)


def two_nodes(run: Path) -> None:
    port = free_port()
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", f"--node-rank={r}",
         "--master-addr=127.0.0.1", f"--master-port={port}",
         *train_command(run, "trainer=ddp", "trainer.devices=1", "trainer.num_nodes=2")],
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    try:
        results = [node.communicate(timeout=TIMEOUT) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    for node, (out, err) in zip(nodes, results, strict=True):
        check(node, out, err)


def params(run: Path) -> dict[str, torch.Tensor]:
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)["state_dict"]
    return {k: v for k, v in state.items() if torch.is_floating_point(v)}


def test_two_nodes_on_loopback_give_one_processs_numbers(tmp_path):
    one_process(tmp_path / "one")
    two_nodes(tmp_path / "two")
    one, two = read_scalars(tmp_path / "one"), read_scalars(tmp_path / "two")
    for tag in ("rollout/entropy", "rollout/accuracy", "rollout/response_len_mean", "train/loss"):
        assert [s for s, _ in two[tag]] == [s for s, _ in one[tag]], tag  # one writer, the same steps
    assert two["rollout/entropy"][0] == one["rollout/entropy"][0]  # the same weights: exactly
    assert two["rollout/accuracy"] == one["rollout/accuracy"]  # the same completions and rewards
    for tag in ("rollout/entropy", "train/loss"):  # after an update whose sums ran in another order
        worst = max(abs(a - b) for (_, a), (_, b) in zip(one[tag], two[tag], strict=True))
        assert worst <= 1e-6, (tag, worst)
    p1, p2 = params(tmp_path / "one"), params(tmp_path / "two")
    assert p1.keys() == p2.keys()
    worst = max(float((p1[k] - p2[k]).abs().max()) for k in p1)
    assert worst <= 1e-6, worst
