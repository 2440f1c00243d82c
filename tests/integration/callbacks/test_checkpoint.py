"""Boundary checkpoints written in the background hold the boundary's state, byte for byte what a
synchronous write holds, although the next iteration has already changed the weights in place."""

from __future__ import annotations

import time

import torch

from lit_entropy.train import build
from tests.helpers import compose_train

LAB = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=12", "reward.mode=inline",
       "batch.micro_batch_size=16", "trainer.max_epochs=3", "rollout=hf", "callbacks/entropy=adapo",
       "callbacks.checkpoint.keep_iterations=true", "~callbacks.progress", "+trainer.enable_progress_bar=false"]


def fit(out, async_write: bool) -> None:
    cfg = compose_train(LAB + [f"callbacks.checkpoint.async_write={async_write}", f"paths.output_dir={out}"])
    trainer, module, datamodule = build(cfg)
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        datamodule.close()


def flat(obj, prefix=""):
    """Every leaf of a nested checkpoint: key path -> value."""
    if isinstance(obj, dict):
        return {k: v for key, val in obj.items() for k, v in flat(val, f"{prefix}/{key}").items()}
    if isinstance(obj, (list, tuple)):
        return {k: v for i, val in enumerate(obj) for k, v in flat(val, f"{prefix}/{i}").items()}
    return {prefix: obj}


def test_background_write_holds_the_boundary_state(tmp_path, monkeypatch):
    import lit_entropy.callbacks.checkpoint as ckpt

    write = ckpt.atomic_write

    def slow_write(*args, **kwargs):  # the next iteration's update runs before the bytes are written
        time.sleep(0.3)
        return write(*args, **kwargs)

    monkeypatch.setattr(ckpt, "atomic_write", slow_write)
    fit(tmp_path / "async", True)
    monkeypatch.undo()
    fit(tmp_path / "sync", False)
    loaded = {}
    for mode in ("async", "sync"):
        for it in (1, 2, 3):
            path = tmp_path / mode / "checkpoints" / f"iteration-{it:04d}.ckpt"
            loaded[mode, it] = flat(torch.load(path, map_location="cpu", weights_only=True))
    for it in (1, 2, 3):
        a, b = loaded["async", it], loaded["sync", it]
        assert a.keys() == b.keys()
        for key in a:
            if "IterationCheckpoint" in key or key.startswith("/hyper_parameters"):  # its own paths, settings
                continue
            if isinstance(a[key], torch.Tensor):
                assert torch.equal(a[key], b[key]), (it, key)
            elif not isinstance(a[key], float) or a[key] == a[key]:
                assert a[key] == b[key], (it, key, a[key], b[key])
    weights = [k for k in loaded["async", 1] if k.startswith("/state_dict/")]
    assert any(not torch.equal(loaded["async", 1][k], loaded["async", 2][k]) for k in weights)
