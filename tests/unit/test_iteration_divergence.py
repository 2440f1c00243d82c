"""Divergence without NaN stops the run with its cause named: uniform collapse, sampler/trainer mismatch."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from lit_entropy.data.rollout_datamodule import build_batch
from lit_entropy.iteration import prepare_update
from lit_entropy.module import PolicyModule
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.policy.models import TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.rollout.base import Generation


def make(zero: bool, logp_offset: float = 0.0, **module_kw):
    tok = CharTokenizer.for_countdown()
    model = build_tiny_qwen2(tok.vocab_size, TinyArch(hidden_size=32, num_layers=1, intermediate_size=32), tok)
    if zero:  # every logit 0: the uniform policy a far too large learning rate collapses to
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    module = PolicyModule(SimpleNamespace(model=model, tokenizer=tok, path="unused"), **module_kw)
    prompt = tok.encode("3,5,2=16:", add_bos=True)
    gens = [[Generation(token_ids=[5, 6, 7], logprobs=[0.0] * 3, truncated=True) for _ in range(2)]]
    batch = build_batch([prompt], gens, [1.0, 0.0], 2, pad_id=tok.pad_id)
    with torch.no_grad():
        logp, _ = module.token_stats(batch.input_ids, batch.attention_mask, with_entropy=False)
    batch.sampler_logp = torch.where(batch.response_mask, logp + logp_offset, 0.0)
    return module, batch, tok


def test_uniform_collapse_is_stopped_and_named():
    module, batch, tok = make(zero=True)
    with pytest.raises(RuntimeError, match=r"collapsed to uniform.*optim.lr"):
        prepare_update(module, batch)
    assert batch.metrics["rollout/entropy"] == pytest.approx(math.log(tok.vocab_size), abs=1e-5)
    module, batch, _ = make(zero=True, uniform_entropy_tol=None)
    prepare_update(module, batch)  # the check can be turned off


def test_a_sampler_that_does_not_follow_the_trainer_is_stopped():
    module, batch, _ = make(zero=False, logp_offset=-5.0)
    with pytest.raises(RuntimeError, match="sampler and trainer disagree"):
        prepare_update(module, batch)
    module, batch, _ = make(zero=False)
    prepare_update(module, batch)  # a healthy policy passes both checks
    assert batch.metrics["diag/logp_mismatch_mean"] < 1e-5


def test_a_stale_sampler_that_diverges_is_named_as_the_lag():
    """With ``rollout.max_staleness`` >= 1 (rows carry a weight version) the message names the lag and the fix."""
    module, batch, _ = make(zero=False, logp_offset=-5.0)
    batch.version = torch.zeros(batch.batch_size, dtype=torch.long)
    with pytest.raises(RuntimeError, match=r"older policy \(rollout.max_staleness.*an off-policy correction \(correction=mis\)"):
        prepare_update(module, batch)
    corrected = CorrectionConfig(name="mis", level="token", mode="mask", threshold=5.0, threshold_low=0.5)
    module, batch, _ = make(zero=False, logp_offset=-5.0, correction=corrected)
    batch.version = torch.zeros(batch.batch_size, dtype=torch.long)
    with pytest.raises(RuntimeError, match=r"older policy.*lower rollout.max_staleness"):
        prepare_update(module, batch)
