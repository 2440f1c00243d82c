"""The compiled vocabulary kernels against the eager formulas: values, gradients, truncated logits, fallback."""

from __future__ import annotations

import logging

import pytest
import torch

from lit_entropy.diagnostics import vocab_kernels
from lit_entropy.diagnostics.discriminator import (
    naive_token_scores,
    token_logprobs_entropy_and_scores,
    token_scores,
)
from lit_entropy.diagnostics.entropy import naive_logprobs_and_entropy, token_logprobs_and_entropy

CASES = [(torch.bfloat16, 1.0), (torch.float32, 0.7)]


def logits_and_targets(dtype: torch.dtype, vocab: int = 300, truncate: bool = False, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 7, vocab, generator=g) * 3).to(dtype)
    targets = torch.randint(0, vocab, (3, 7), generator=g)
    if truncate:  # the sampler's truncation: -inf outside a kept set that holds the target
        drop = torch.rand(3, 7, vocab, generator=g) < 0.5
        drop.scatter_(-1, targets[..., None], False)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits, targets


@pytest.mark.parametrize("dtype,temperature", CASES)
@pytest.mark.parametrize("truncate", [False, True])
def test_compiled_logprobs_entropy_and_gradients_match_the_formulas(dtype, temperature, truncate):
    logits, targets = logits_and_targets(dtype, truncate=truncate)
    weights = torch.randn(2, 3, 7, generator=torch.Generator().manual_seed(1))
    got_in = logits.clone().requires_grad_()
    logp, ent = token_logprobs_and_entropy(got_in, targets, temperature, chunk_size=8, kernels="compiled")
    ((weights[0] * logp).sum() + (weights[1] * ent).sum()).backward()
    # the reference sees a dropped column as a very negative finite logit: probability exactly 0, no NaN
    ref_in = logits.float().masked_fill(torch.isinf(logits), -1e4).requires_grad_()
    ref_logp, _ = naive_logprobs_and_entropy(ref_in, targets, temperature, with_entropy=False)
    probs = torch.softmax(ref_in / temperature, -1)
    ref_ent = -torch.where(probs > 0, probs * torch.log_softmax(ref_in / temperature, -1), 0.0).sum(-1)
    ((weights[0] * ref_logp).sum() + (weights[1] * ref_ent).sum()).backward()
    assert logp.dtype == ent.dtype == torch.float32 and got_in.grad.dtype == dtype
    assert torch.isfinite(logp).all() and torch.isfinite(ent).all() and torch.isfinite(got_in.grad).all()
    torch.testing.assert_close(logp, ref_logp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=2e-5, rtol=1e-5)
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # the gradient is returned in the logits' dtype
    torch.testing.assert_close(got_in.grad.float(), ref_in.grad, atol=tol, rtol=tol)
    if truncate:  # dropped columns have probability 0: no gradient at all
        dropped = torch.isinf(logits)
        assert (got_in.grad[dropped] == 0).all()


@pytest.mark.parametrize("vocab", [96, 32000, 49152, 151936])
@pytest.mark.parametrize("kernels", ["compiled", "eager_kernel"])
def test_log_probs_and_entropy_are_within_1e_5_of_fp64(vocab, kernels):
    """The conformance suite's vocabulary, Llama's, SmolLM2's and Qwen's, at a flat (H near log V), a middling and a
    peaked scale of the logits, truncated too; against log_softmax and -Σ p log p in fp64. ``eager_kernel``: the
    same kernel run without compiling (what a failed compile falls back to)."""
    g = torch.Generator().manual_seed(vocab)
    for scale in (0.05, 1.0, 4.0):
        logits = torch.randn(2, 64, vocab, generator=g) * scale
        logits[1, :, : vocab // 2] = float("-inf")  # the sampler's truncation on one row
        targets = torch.randint(vocab // 2, vocab, (2, 64), generator=g)
        if kernels == "compiled":
            logp, ent = token_logprobs_and_entropy(logits, targets, 0.7, chunk_size=64, kernels="compiled")
        else:
            lse, ent = vocab_kernels.lse_entropy(logits.reshape(-1, vocab), 0.7)
            logp = vocab_kernels.target_logprobs(logits.reshape(-1, vocab), targets.reshape(-1), lse, 0.7)
        log_probs = torch.log_softmax(logits.double() / 0.7, -1)
        ref_logp = log_probs.gather(-1, targets[..., None]).squeeze(-1)
        ref_ent = -torch.where(log_probs > -torch.inf, log_probs.exp() * log_probs, 0.0).sum(-1)
        assert (logp.double().reshape(2, 64) - ref_logp).abs().max() < 1e-5, (scale, "log p")
        assert (ent.double().reshape(2, 64) - ref_ent).abs().max() < 1e-5, (scale, "entropy")


def test_the_gradient_without_entropy_is_that_of_the_log_probs_alone():
    logits, targets = logits_and_targets(torch.float32)
    a = logits.clone().requires_grad_()
    logp, ent = token_logprobs_and_entropy(a, targets, chunk_size=5, with_entropy=False, kernels="compiled")
    assert ent is None
    logp.sum().backward()
    b = logits.clone().requires_grad_()
    token_logprobs_and_entropy(b, targets, chunk_size=5, with_entropy=False, kernels="eager")[0].sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("dtype,temperature", CASES)
def test_compiled_scores_match_the_formulas_and_the_entropy_pass_bitwise(dtype, temperature):
    logits, targets = logits_and_targets(dtype, seed=3)
    logp, ent, s, n = token_logprobs_entropy_and_scores(logits, targets, temperature, chunk_size=8,
                                                        kernels="compiled")
    ref_s, ref_n = naive_token_scores(logits, targets, temperature)
    torch.testing.assert_close(s, ref_s, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(n, ref_n, atol=1e-5, rtol=1e-4)
    # the update's pass takes the same lse and log p: the first PPO ratio is exactly 1
    logp2, ent2 = token_logprobs_and_entropy(logits, targets, temperature, chunk_size=8, kernels="compiled")
    assert torch.equal(logp, logp2) and torch.equal(ent, ent2)
    s2, n2 = token_scores(logits, targets, temperature, chunk_size=8, kernels="compiled")
    assert torch.equal(s, s2) and torch.equal(n, n2)


def test_auto_compiles_wide_cpu_vocabularies_only_and_modes_are_checked():
    assert not vocab_kernels.compiles("auto", torch.zeros(2, 3, 300))
    assert vocab_kernels.compiles("auto", torch.zeros(1, 1, vocab_kernels.AUTO_MIN_VOCAB)) == (
        vocab_kernels.failure() is None)
    assert not vocab_kernels.compiles("eager", torch.zeros(1, 1, 50000))
    with pytest.raises(ValueError, match="vocab_kernels must be one of auto, compiled, eager, got 'fast'"):
        vocab_kernels.compiles("fast", torch.zeros(1, 1, 5))


def test_a_failing_compiler_falls_back_to_the_eager_formulas_with_one_warning(monkeypatch, caplog):
    def broken(fn):
        def run(*args):
            raise RuntimeError("no C++ compiler")
        return run

    monkeypatch.setattr(vocab_kernels, "_compiled", {})
    monkeypatch.setattr(vocab_kernels, "_failure", None)
    monkeypatch.setattr(torch, "compile", broken)
    logits, targets = logits_and_targets(torch.float32)
    with caplog.at_level(logging.WARNING, logger=vocab_kernels.__name__):
        logp, ent = token_logprobs_and_entropy(logits, targets, kernels="compiled")
    assert "no C++ compiler" in vocab_kernels.failure()
    assert sum("run them eagerly" in r.message for r in caplog.records) == 1
    ref_logp, ref_ent = naive_logprobs_and_entropy(logits, targets)
    torch.testing.assert_close(logp, ref_logp, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=2e-5, rtol=1e-5)
    assert not vocab_kernels.compiles("compiled", logits)  # and the rest of the process stays eager
