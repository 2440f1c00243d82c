"""One-step-off overlap (``rollout.max_staleness``, issue 29): the schedule, the bound, the checkpointed batches.

The real :func:`lit_entropy.iteration.run` (its :func:`~lit_entropy.iteration.sample_ahead`) runs the real
``RolloutDataModule`` and ``Sampler`` against a fake engine whose completions spell the
weight version it sampled with, and a fake trainer whose weights are "version i" at iteration i: every row
must be at most ``k`` versions old, batch ``i`` sampled by version ``max(0, i - k)``, generated in the
producer's thread, and a checkpointed state (``torch.load(weights_only=True)``) must resume into the same batches.
"""

from __future__ import annotations

import io
import threading
import time
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerStatus

from lit_entropy.algo import AlgoConfig
from lit_entropy.data.rollout_datamodule import RolloutDataModule
from lit_entropy.iteration import run
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.rewards.config import RewardConfig
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.rollout.batch import BatchConfig
from lit_entropy.rollout.overlap import Producer
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.tasks.prompts import CountdownPrompts

EOS, PAD, BASE = 2, 0, 3


class Tok:
    pad_id, eos_id = PAD, EOS

    def encode(self, text: str, add_bos: bool = True) -> list[int]:
        return [1] + [BASE + ord(c) % 40 for c in text[:6]]

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


class VersionEngine(RolloutEngine):
    """Completions of ``BASE + version`` tokens: the rows say which weights sampled them."""

    overlaps_update = True

    def __init__(self, delay: float = 0.0) -> None:
        self.version: int | None = None
        self.threads: set[int] = set()
        self.delay = delay
        self.generating = False

    def sync_weights(self, model) -> None:
        assert not self.generating, "weights changed under a generation in flight"
        self.version = model.version

    def generate(self, prompts, n, sampling, seed, first_index=0):
        self.generating = True
        self.threads.add(threading.get_ident())
        time.sleep(self.delay)
        self.generating = False
        tok = BASE + self.version
        return [[Generation([tok, tok, EOS], [-0.5, -0.5, -0.1], False) for _ in range(n)] for _ in prompts]


def sampler_is_trainer(batch) -> None:
    """The pre-update pass of a policy that is the sampler (zero entropy): the iteration's later steps run on it."""
    batch.old_logp, batch.entropy = batch.sampler_logp.clone(), torch.zeros_like(batch.sampler_logp)


def make(k: int, policy: str = "wait", delay: float = 0.0, background: bool = True):
    engine = VersionEngine(delay)
    engine.overlaps_update = background
    sampling = SamplingConfig(max_new_tokens=4, max_staleness=k, staleness_policy=policy)
    sampler = Sampler(engine, sampling, RewardConfig(mode="inline"))
    dm = RolloutDataModule(CountdownPrompts(), sampler, BatchConfig(prompts_per_iter=3, group_size=2, micro_batch_size=6))
    module = SimpleNamespace(model=SimpleNamespace(version=0), tokenizer=Tok(), policy_path="fake", algo=AlgoConfig(),
                             correction=CorrectionConfig(), batch_cfg=BatchConfig(), uniform_entropy_tol=None,
                             max_logp_mismatch_mean=None, pre_update_pass=sampler_is_trainer)
    trainer = SimpleNamespace(lightning_module=module, current_epoch=0, callbacks=[], max_epochs=8,
                              state=SimpleNamespace(status=TrainerStatus.RUNNING))
    module.iteration_loader = lambda source: run(source, trainer, module, trainer.current_epoch)
    dm.trainer = trainer
    return dm, trainer, engine


def iterate(dm, trainer, i: int):
    trainer.current_epoch = i
    trainer.lightning_module.model.version = i  # the weights after i updates
    batch = dm.train_dataloader().dataset.rollout
    sampled = {int(t) - BASE for t in batch.input_ids[batch.response_mask].tolist() if t != EOS}
    return batch, sampled


@pytest.mark.parametrize("k", [1, 2])
def test_rows_are_sampled_by_version_i_minus_k_and_never_older(k):
    dm, trainer, engine = make(k)
    try:
        for i in range(6):
            batch, sampled = iterate(dm, trainer, i)
            assert sampled == {max(0, i - k)}  # the content says which weights sampled it
            assert batch.version.tolist() == [max(0, i - k)] * batch.batch_size
            assert batch.metrics["rollout/staleness_max"] == min(i, k) <= k
            assert batch.metrics["rollout/staleness"] == min(i, k)
            assert set(dm.producer.ready) | set(dm.producer.inflight) <= set(range(i + 1, i + k + 1))  # (k+1)·B cap
        assert threading.get_ident() not in engine.threads  # generated in the producer's thread
    finally:
        dm.close()


def test_foreground_engines_keep_the_schedule():
    """HF generate (the process-global RNG) generates in the trainer's thread: same rows, no overlap."""
    dm, trainer, engine = make(1, background=False)
    for i in range(4):
        _, sampled = iterate(dm, trainer, i)
        assert sampled == {max(0, i - 1)}
    assert engine.threads == {threading.get_ident()}
    dm.close()


def test_weights_never_change_under_a_generation_in_flight():
    dm, trainer, engine = make(1, delay=0.2)  # the sync comes while the next batch is still generating
    for i in range(3):
        _, sampled = iterate(dm, trainer, i)
        assert sampled == {max(0, i - 1)}
    dm.sampler.sync(trainer.lightning_module.model)  # another caller (the periodic evaluation) waits too
    dm.close()


def roundtrip(state: dict) -> dict:
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # as Lightning loads checkpoints


def test_checkpointed_state_resumes_into_the_same_batches():
    ref, ref_trainer, _ = make(1)
    want = [iterate(ref, ref_trainer, i)[0] for i in range(5)]
    ref.close()
    dm, trainer, _ = make(1)
    for i in range(3):
        iterate(dm, trainer, i)
    dm.producer.drain(dm.finish_batch)  # what train_dataloader does before the boundary's checkpoint
    state = roundtrip(dm.state_dict())
    dm.close()
    assert list(state["overlap"]["ready"]) == ["3"]  # the batch sampled during iteration 2's update
    resumed, trainer, _ = make(1)  # a fresh process: a new engine, nothing in flight
    resumed.load_state_dict(state)
    for i in (3, 4):
        got, _ = iterate(resumed, trainer, i)
        assert torch.equal(got.input_ids, want[i].input_ids) and got.version.tolist() == want[i].version.tolist()
        assert got.prompts == want[i].prompts
    resumed.close()


def test_the_end_of_training_checkpoint_holds_the_batch_in_flight():
    """The last iteration launched the next batch; the checkpoint written at the end of training (status running)
    waits for it, so a longer resume trains on it and the saved global RNG state includes the engine's draws;
    an exception's checkpoint (status interrupted) leaves it out."""
    for status, want in ((TrainerStatus.RUNNING, ["3"]), (TrainerStatus.INTERRUPTED, [])):
        dm, trainer, _ = make(1, delay=0.2)
        for i in range(3):
            iterate(dm, trainer, i)
        assert 3 in dm.producer.inflight
        trainer.state.status = status
        try:
            assert list(roundtrip(dm.state_dict())["overlap"]["ready"]) == want
        finally:
            dm.close()


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_a_batch_over_the_bound_is_never_trained_on(policy):
    """A checkpoint written with a larger bound: its batch for iteration 3 was sampled by version 0."""
    big, trainer, _ = make(3)
    for i in range(1):
        iterate(big, trainer, i)
    big.producer.drain(big.finish_batch)
    state = roundtrip(big.state_dict())
    big.close()
    assert "3" in state["overlap"]["ready"] and state["overlap"]["ready"]["3"]["version"] == 0
    dm, trainer, _ = make(1, policy)
    dm.load_state_dict(state)
    batch, sampled = iterate(dm, trainer, 3)
    trained = batch.version[batch.keep]
    assert trained.numel() == 0 or int((3 - trained).max()) <= 1
    if policy == "wait":  # sampled again from the current weights
        assert sampled == {3} and batch.keep.all() and batch.metrics["rollout/stale_dropped_rows"] == 0
    else:  # dropped: no row is trained on
        assert not batch.keep.any() and batch.metrics["rollout/stale_dropped_rows"] == batch.batch_size
    dm.close()


def test_staleness_zero_keeps_the_synchronous_path():
    engine = VersionEngine()
    dm = RolloutDataModule(CountdownPrompts(), Sampler(engine, SamplingConfig(), RewardConfig(mode="inline")))
    assert dm.producer is None and dm.state_dict() == {}  # nothing new in the checkpoint


def test_bad_values_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="rollout.max_staleness"):
        SamplingConfig(max_staleness=-1)
    with pytest.raises(ValueError, match="rollout.staleness_policy"):
        SamplingConfig(max_staleness=1, staleness_policy="later")
    with pytest.raises(ValueError, match="sync_every"):
        SamplingConfig(max_staleness=1, sync_every=2)
    with pytest.raises(ValueError, match="rollout.engine_cores"):
        SamplingConfig(max_staleness=1, engine_cores=[])
    with pytest.raises(ValueError, match="rollout.max_staleness"):
        Producer(True)
