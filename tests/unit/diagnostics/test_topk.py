"""The top-K pass (lit_entropy.diagnostics.topk): its log-probs and gradient against a full softmax, and its
dashboard metrics in the real pre-update pass."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.diagnostics.topk import topk_logprobs
from lit_entropy.iteration import prepare_update
from tests.unit.test_iteration_divergence import make as make_lab_module


def test_top_k_log_probs_and_their_gradient_match_a_full_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (2, 5))
    values, is_top1 = topk_logprobs(logits, targets, 3, temperature=0.7, chunk_size=3)
    ref = torch.log_softmax(logits / 0.7, -1).topk(3, -1)
    assert torch.allclose(values.double(), ref.values, atol=1e-6)
    assert torch.equal(is_top1, ref.indices[..., 0] == targets)
    w = torch.randn(2, 5, 3, dtype=torch.float64)
    (g,) = torch.autograd.grad((values * w).sum(), logits)
    (g_ref,) = torch.autograd.grad((ref.values * w).sum(), logits)
    assert torch.allclose(g, g_ref, atol=1e-6)


def test_uniform_policy_has_top1_mass_one_over_v_on_the_dashboard():
    module, batch, tok = make_lab_module(zero=True, uniform_entropy_tol=None)
    prepare_update(module, batch)
    assert batch.metrics["diag/top1_mass"] == pytest.approx(1 / tok.vocab_size, rel=1e-5)
    assert batch.metrics["diag/topk_mass"] == pytest.approx(3 / tok.vocab_size, rel=1e-5)
