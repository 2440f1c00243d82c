"""lit_entropy/iteration.py: ``run`` owns the iteration. Against a recording rollout source and policy: the steps in
their order, the callbacks' hooks called by ``run`` itself, a controller's draw request served before the next
callback reads the batch, and the loader of step 8. The overlapped path is tests/unit/rollout/test_overlap.py;
the corrections, the divergence checks and ``pre_update_pass=skip`` are test_iteration_*.py beside this file."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.data.rollout_datamodule import build_batch
from lit_entropy.iteration import DrawRequest, UpdateData, run
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.rollout.base import Generation
from lit_entropy.rollout.batch import BatchConfig

G, PAD, EOS = 2, 0, 2


def rollout(first_token: int, prompts: int = 2):
    """``prompts`` groups of G completions whose tokens start with ``first_token`` (the rows say who made them)."""
    gens = [[Generation([first_token + i, first_token + i, EOS], [-0.5, -0.5, -0.1], False) for i in range(G)]
            for _ in range(prompts)]
    return build_batch([[1, 5]] * prompts, gens, [1.0, 0.0] * prompts, G, pad_id=PAD)


class Source:
    """A rollout source that records what the iteration asks of it."""

    def __init__(self, calls: list[str]) -> None:
        self.calls, self.batch, self.seed, self.producer = calls, BatchConfig(prompts_per_iter=2, group_size=G), 0, None
        self.sampler = SimpleNamespace(sync=lambda model, iteration: calls.append(f"sync {iteration}"))

    def start(self, policy) -> None:
        self.calls.append("start")

    def sample_batch(self, tok, iteration, metrics):
        self.calls.append(f"sample {iteration}")
        return rollout(first_token=10)

    def sample_extra(self, tok, iteration, temperature, n, label, metrics):
        self.calls.append(f"extra {label} T={temperature} n={n}")
        return rollout(first_token=30, prompts=n)


class Policy:
    """A policy that is the sampler (old log-probs = the sampler's, zero entropy), recording its passes."""

    def __init__(self, calls: list[str]) -> None:
        self.calls, self.model, self.policy_path = calls, SimpleNamespace(), ""
        self.tokenizer = SimpleNamespace(pad_id=PAD)
        self.algo, self.correction = AlgoConfig(), CorrectionConfig()
        self.batch_cfg = BatchConfig(prompts_per_iter=2, group_size=G)
        self.uniform_entropy_tol = self.max_logp_mismatch_mean = None

    def pre_update_pass(self, batch) -> None:
        self.calls.append(f"pass {batch.batch_size} rows")
        batch.old_logp, batch.entropy = batch.sampler_logp.clone(), torch.zeros_like(batch.sampler_logp)


class Hook:
    """A callback recording its rollout hooks; ``request`` is what its ``on_rollout_batch`` returns."""

    def __init__(self, name: str, calls: list[str], request=None) -> None:
        self.name, self.calls, self.request = name, calls, request

    def on_rollout_start(self, trainer, module) -> None:
        self.calls.append(f"{self.name}.on_rollout_start")

    def on_rollout_batch(self, trainer, module, batch):
        self.calls.append(f"{self.name}.on_rollout_batch first token {int(batch.input_ids[0, 2])}")
        return self.request


def iteration(callbacks, calls):
    policy = Policy(calls)
    trainer = SimpleNamespace(callbacks=callbacks, lightning_module=policy)
    return run(Source(calls), trainer, policy, iteration=3)


def test_run_calls_every_step_itself_in_order():
    calls: list[str] = []
    loader = iteration([Hook("a", calls), Hook("b", calls)], calls)
    assert calls == ["a.on_rollout_start", "b.on_rollout_start", "start", "sync 3", "sample 3", "pass 4 rows",
                     "a.on_rollout_batch first token 10", "b.on_rollout_batch first token 10"]
    data = loader.dataset
    assert isinstance(data, UpdateData) and data.rollout.batch_size == 4
    assert sum(len(mb["input_ids"]) for mb in data.minibatches) == 4  # every kept row in one minibatch of step 8
    assert {"time/sync", "time/generate", "rollout/entropy", "control/kept_frac"} <= set(data.rollout.metrics)


def test_a_draw_request_is_served_before_the_next_callback_reads_the_batch():
    calls: list[str] = []
    prepared = []

    def prepare(batch, rows):
        prepared.append(rows.batch_size)
        rows.advantages = torch.ones(rows.batch_size)
        rows.token_advantages = torch.where(rows.response_mask, 1.0, 0.0)

    request = DrawRequest(1.2, 1, "aepo", choose=lambda extra: torch.tensor([1]), prepare=prepare)
    loader = iteration([Hook("controller", calls, request), Hook("diagnostics", calls)], calls)
    assert calls[-4:] == ["controller.on_rollout_batch first token 10", "extra aepo T=1.2 n=1", "pass 1 rows",
                          "diagnostics.on_rollout_batch first token 31"]  # the drawn row (31) replaced row 0
    batch = loader.dataset.rollout
    assert prepared == [1] and batch.advantages[0] == 1.0 and "time/aepo" in batch.metrics
