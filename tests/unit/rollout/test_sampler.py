"""lit_entropy/rollout/sampler.py: the sampler owns the overlap's producer (it samples ahead with the sampler's own
engine), shares it with its views, never changes the weights under a generation in flight, and marks a producer
foreground for an engine that cannot run beside the update. Sampling and scoring end to end:
tests/integration/rollout/; the schedule: test_overlap.py beside this file."""

from __future__ import annotations

from lit_entropy.rewards.config import RewardConfig
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.rollout.overlap import Producer
from lit_entropy.rollout.sampler import Sampler


class Engine(RolloutEngine):
    overlaps_update = False

    def __init__(self) -> None:
        self.synced = 0

    def sync_weights(self, model) -> None:
        self.synced += 1

    def generate(self, prompts, n, sampling, seed, first_index=0):
        return [[Generation([3, 2], [-0.1, -0.1], False) for _ in range(n)] for _ in prompts]


def sampler(max_staleness: int) -> Sampler:
    return Sampler(Engine(), SamplingConfig(max_new_tokens=4, max_staleness=max_staleness), RewardConfig(mode="inline"))


def test_the_sampler_creates_its_producer_only_when_sampling_ahead():
    assert sampler(0).producer is None
    ahead = sampler(2)
    assert isinstance(ahead.producer, Producer) and ahead.producer.k == 2 and not ahead.producer.warm
    view = ahead.with_sampling(temperature=0.7)  # an evaluation's view shares the engine and its producer
    assert view.producer is ahead.producer and view.sampling.temperature == 0.7


def test_an_engine_that_cannot_overlap_makes_the_producer_foreground():
    s = sampler(1)
    s.start(policy=type("P", (), {"tokenizer": None, "model": None, "path": ""})(), reward_fn=lambda *a, **k: 0.0)
    try:
        assert s.producer.background is False  # Engine.overlaps_update is False: same schedule, trainer's thread
    finally:
        s.close_rewards()


def test_sync_waits_for_the_producer_then_loads_the_weights():
    s = sampler(1)
    waited = []
    s.producer.wait_idle = lambda: waited.append(True)
    s.sync(model=None, iteration=0)
    assert waited == [True] and s.engine.synced == 1
