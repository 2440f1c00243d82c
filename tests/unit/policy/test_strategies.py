"""FSDP2's mixed precision follows ``trainer.precision``; fp16's loss scaler skips the same steps on every rank.

The sharding tests run two CPU ranks (gloo) of a tiny Llama in spawned processes; each writes what it saw.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from lit_entropy.policy.strategies import mixed_precision_policy


@pytest.mark.parametrize("precision,compute", [("bf16-mixed", torch.bfloat16), ("16-mixed", torch.float16),
                                               ("32-true", None), ("bf16-true", None), (None, None)])
def test_the_mixed_precision_policy_follows_the_precision(precision, compute):
    policy = mixed_precision_policy(precision)
    if compute is None:
        assert policy is None
    else:
        assert policy.param_dtype == compute and policy.reduce_dtype == torch.float32


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


PRECISIONS = {"bf16-mixed": "torch.bfloat16", "16-mixed": "torch.float16", "32-true": "torch.float32"}


def _rank(rank: int, port: int, out: str) -> None:
    """One rank: for each precision, a freshly sharded tiny Llama takes one step whose loss overflows on rank 1."""
    import torch.distributed as tdist
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import LlamaConfig, LlamaForCausalLM

    from lit_entropy.policy.strategies import fully_shard_policy
    from lit_entropy.utils.dist import full_tensor

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        for precision in PRECISIONS:
            torch.manual_seed(0)
            model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
            fully_shard_policy(model, mesh, precision=precision)
            before = full_tensor(model.lm_head.weight).clone()
            ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(rank))
            logits = model(input_ids=ids).logits
            seen = {"logits": str(logits.dtype)}
            scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            loss = logits.float().logsumexp(-1).mean() * (float("inf") if rank == 1 else 1.0)  # rank 1 overflows
            scaler.scale(loss).backward()
            grad = model.lm_head.weight.grad
            seen.update(grad_type=type(grad).__name__, grad=str(grad.dtype), param=str(model.lm_head.weight.dtype))
            scaler.step(opt)
            scaler.update()
            seen["stepped"] = not torch.equal(full_tensor(model.lm_head.weight), before)
            seen["scale"] = float(scaler.get_scale())
            with open(os.path.join(out, f"{precision}-rank{rank}.json"), "w") as f:
                json.dump(seen, f)
    finally:
        tdist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    """What each of two spawned ranks saw under each precision (one spawn for all three: a spawn costs two fresh
    interpreters)."""
    out = tmp_path_factory.mktemp("ranks")
    mp.spawn(_rank, args=(_free_port(), str(out)), nprocs=2, join=True)
    return out


@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_fsdp2_computes_in_the_precision_and_every_rank_skips_an_overflowing_step(two_ranks, precision):
    for rank in (0, 1):
        seen = json.loads((two_ranks / f"{precision}-rank{rank}.json").read_text())
        assert seen["logits"] == PRECISIONS[precision]  # the forward runs in the policy's dtype
        # the optimizer steps fp32 shards; gradients are reduced and kept in fp32
        assert seen["grad_type"] == "DTensor" and seen["grad"] == seen["param"] == "torch.float32"
        # rank 0's own gradients are finite, but rank 1's overflowed: the scaler skips the step on both ranks
        assert seen["stepped"] is False and seen["scale"] == 2.0**9
