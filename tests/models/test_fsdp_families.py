"""FSDP2 on two CPU ranks (gloo) gives what one rank gives, per family.

Each family's tiny model is saved with the Countdown character tokenizer (its ids fit every test vocabulary)
and loaded by ``model=hf``; ``tests/integration/rank_driver.py`` fits one real RL iteration (HF-engine
rollouts, the real Trainer) once on one process and once under ``torchrun --nproc_per_node=2`` with
``trainer=fsdp``, which shards each family's decoder layers. A random policy earns no reward, so the
update is an entropy bonus (whose gradient needs none) and moves every parameter. Prompts come in chunks
of 4 so that both ranks' blocks of 4 prompts sample what one rank samples (``rollout.engine.prompts_per_chunk``).
Two launches fit every family: about 6 minutes on 2 busy cores, so ``slow``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_entropy.policy.tokenizer import CharTokenizer
from tests.helpers import ROOT
from tests.integration.test_distributed import DRIVER, _env, load
from tests.models.families import save_tiny

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FSDP_FAMILIES = ["llama", "gemma3_text", "gpt2", "qwen3_moe"]
"""Full attention; sliding windows with tied embeddings; Conv1D with dropout in its config; fused experts."""
RUN = ["trainer.max_epochs=1", "logger=csv", "model=hf", "rollout=hf", "rollout.engine.prompts_per_chunk=4",
       "batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "callbacks/entropy=none", "algo=entropy_bonus", "algo.entropy_coef=0.5", "optim.eps=1e-6",
       "batch.num_minibatches=3", "batch.micro_batch_size=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fsdp_families")
    configs = []
    for family in FSDP_FAMILIES:
        path = save_tiny(family, root / "models" / family)
        CharTokenizer.for_countdown().to_hf().save_pretrained(str(path))
        configs.append(f"{family}:model.name_or_path={path}")
    launch = {"single": [sys.executable, str(DRIVER), str(root / "single"), *RUN],
              "fsdp": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                       str(DRIVER), str(root / "fsdp"), *RUN, "trainer=fsdp", "trainer.devices=2"]}
    for cmd in launch.values():
        proc = subprocess.run(cmd + configs, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return {"single": root / "single", "fsdp": root / "fsdp", "models": root / "models"}


def largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize("family", FSDP_FAMILIES)
def test_two_fsdp_ranks_give_one_ranks_iteration(runs, family):
    from safetensors.torch import load_file

    one = load(runs["single"], family, 0)
    start = load_file(str(runs["models"] / family / "model.safetensors"))
    shared = [k for k in start if k in one["params"]]  # Qwen3-MoE's file keeps one tensor per expert
    moved = largest_difference({k: one["params"][k] for k in shared}, {k: start[k] for k in shared})
    assert moved > 1e-5  # the invariance below is not vacuous
    for rank in (0, 1):
        two = load(runs["fsdp"], family, rank)
        assert two["world_size"] == 2
        assert two["completions"] == one["completions"] and two["entropy"] == one["entropy"]
        assert torch.allclose(two["old_logp"], one["old_logp"], atol=1e-6)
        difference = largest_difference(two["params"], one["params"])
        print(f"{family} rank {rank}: largest parameter difference {difference:.2g} (update {moved:.2g})")
        assert difference <= 1e-6, (family, rank, difference)
