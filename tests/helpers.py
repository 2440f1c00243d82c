"""Shared test helpers: compose the real config, read TensorBoard event files."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

ROOT = Path(__file__).resolve().parents[1]
CONF = ROOT / "conf"
GPU_ENGINES = ["hf", pytest.param("vllm", marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                                     reason="vLLM is not installed"))]
"""The rollout engines a ``gpu`` test runs with: ``hf`` everywhere, ``vllm`` where it imports."""


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides)


def small_rollout_batch(entropy: float, advantages: list[float], rewards: list[float] | None = None,
                        group_size: int = 2):
    """A RolloutBatch of len(advantages) rows of 4 tokens (1 prompt + 3 response), as a controller sees it."""
    from lit_entropy.rollout.batch import RolloutBatch

    B = len(advantages)
    batch = RolloutBatch(
        input_ids=torch.ones(B, 4, dtype=torch.long),
        attention_mask=torch.ones(B, 4, dtype=torch.bool),
        response_mask=torch.tensor([[False, True, True, True]] * B),
        rewards=torch.tensor(rewards, dtype=torch.float32) if rewards is not None else torch.zeros(B),
        group_index=torch.arange(B) // group_size,
        group_size=group_size,
        sampler_logp=torch.zeros(B, 4),
    )
    batch.advantages = torch.tensor(advantages, dtype=torch.float32)
    batch.metrics["rollout/entropy"] = entropy
    return batch


def step_gradient(module, minibatch: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    """Run ``module``'s real ``training_step`` on ``minibatch`` with the optimizer step replaced by a
    gradient capture (no Trainer): the loss and every parameter's gradient."""
    captured: list[torch.Tensor] = []
    module.optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.0)
    module.lr_schedulers = lambda: None
    module.manual_backward = lambda loss: loss.backward()
    module.log_dict = module.log = lambda *a, **k: None
    module._clip_and_step = lambda opt, sched: captured.extend(
        p.grad.clone() for p in module.parameters() if p.grad is not None) or torch.zeros(())
    return float(module.training_step(minibatch, 0)), captured


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in every TensorBoard event file under ``run_dir``: tag -> [(step, value)]."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(run_dir).rglob("events.out.tfevents.*"))
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        for tag in acc.Tags().get("scalars", []):
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


def read_text_tags(run_dir: Path) -> list[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags: list[str] = []
    for f in sorted(Path(run_dir).rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(f), size_guidance={"tensors": 0})
        acc.Reload()
        tags.extend(acc.Tags().get("tensors", []))
    return tags
