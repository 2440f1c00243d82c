import math

import pytest
import torch

from lit_entropy.objectives.kl import KL_KINDS, kl_estimate, kl_penalty
from lit_entropy.objectives.policy_loss import aggregate


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Tiny tensors: intra-op threads only add contention on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# log_ratio = ref − logp
HAND = [
    # (logp, ref_logp, k1, k2, k3)
    (-1.0, -1.0, 0.0, 0.0, 0.0),
    (-1.0, -2.0, 1.0, 0.5, math.exp(-1.0) + 1.0 - 1.0),
    (-2.0, -1.0, -1.0, 0.5, math.exp(1.0) - 1.0 - 1.0),
    (-0.5, -0.7, 0.2, 0.02, math.exp(-0.2) + 0.2 - 1.0),
    (-30.0, -0.1, -29.9, 0.5 * 29.9**2, math.exp(20.0) - 20.0 - 1.0),  # k3 clamps log_ratio at +20
    (-0.1, -40.0, 39.9, 0.5 * 39.9**2, math.exp(-20.0) + 20.0 - 1.0),  # and at −20
]


@pytest.mark.parametrize("kind", KL_KINDS)
def test_hand_values(kind):
    logp = torch.tensor([[row[0] for row in HAND]])
    ref = torch.tensor([[row[1] for row in HAND]])
    col = 2 + KL_KINDS.index(kind)
    expected = torch.tensor([[row[col] for row in HAND]])
    out = kl_estimate(logp, ref, kind)
    assert out.dtype == torch.float32 and out.shape == logp.shape
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_bf16_inputs_computed_in_fp32():
    logp = torch.tensor([[-1.0, -2.0]], dtype=torch.bfloat16)
    ref = torch.tensor([[-1.5, -1.0]], dtype=torch.bfloat16)
    for kind in KL_KINDS:
        assert kl_estimate(logp, ref, kind).dtype == torch.float32


@pytest.mark.parametrize("kind", KL_KINDS)
def test_zero_when_equal(kind):
    logp = -torch.rand(4, 7) * 5
    out = kl_estimate(logp, logp.clone(), kind)
    assert torch.equal(out, torch.zeros_like(out))


def test_k2_k3_non_negative():
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(64, 64, generator=gen) * 10
    ref = torch.randn(64, 64, generator=gen) * 10
    for kind in ("k2", "k3"):
        out = kl_estimate(logp, ref, kind)
        assert torch.isfinite(out).all() and (out >= 0).all()
    assert (kl_estimate(logp, ref, "k1") < 0).any()  # k1 is not


def test_gradients():
    logp = torch.tensor([[-1.0, -0.3, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.2, -0.9, -1.0]])
    log_ratio = ref - logp.detach()
    expected = {
        "k1": torch.ones_like(log_ratio),  # d(logp − ref)/dlogp
        "k2": -log_ratio,  # d(½(ref − logp)²)/dlogp
        "k3": 1.0 - log_ratio.exp(),  # d(e^x − x − 1)/dlogp with dx/dlogp = −1
    }
    for kind in KL_KINDS:
        (grad,) = torch.autograd.grad(kl_estimate(logp, ref, kind).sum(), logp)
        torch.testing.assert_close(grad, expected[kind])
    # outside the clamp range k3 saturates: finite value, no gradient
    far = torch.tensor([[-50.0]], requires_grad=True)
    out = kl_estimate(far, torch.tensor([[0.0]]), "k3")
    (grad,) = torch.autograd.grad(out.sum(), far)
    assert torch.isfinite(out).all() and grad.item() == 0.0


def test_unknown_kind():
    with pytest.raises(ValueError, match="k3"):
        kl_estimate(torch.zeros(1, 1), torch.zeros(1, 1), "k4")


def test_monte_carlo_matches_exact_kl():
    """Tokens sampled from p: the sample means of k1 and k3 approach KL(p‖q) (both unbiased)."""
    gen = torch.Generator().manual_seed(2020)
    logits_p = torch.tensor([1.0, 0.2, -0.5, 0.0, -1.5, 0.7])
    logits_q = torch.tensor([0.3, 0.5, -0.2, -0.8, -0.4, 1.2])
    log_p = torch.log_softmax(logits_p, -1)
    log_q = torch.log_softmax(logits_q, -1)
    exact = (log_p.exp() * (log_p - log_q)).sum().item()
    samples = torch.multinomial(log_p.exp(), 400_000, replacement=True, generator=gen).view(400, 1000)
    logp, ref = log_p[samples], log_q[samples]
    for kind in ("k1", "k3"):
        estimate = kl_estimate(logp, ref, kind).double().mean().item()
        assert estimate == pytest.approx(exact, rel=0.02), kind
    # k2 is biased but close for close policies (second order)
    assert kl_estimate(logp, ref, "k2").double().mean().item() == pytest.approx(exact, rel=0.25)


def test_mask_blocks_garbage_and_penalty():
    logp = torch.tensor([[-1.0, float("nan"), -0.5], [-2.0, -0.1, float("-inf")]], requires_grad=True)
    ref = torch.tensor([[-1.5, float("inf"), -0.7], [float("nan"), -0.3, -0.2]])
    mask = torch.tensor([[True, False, True], [False, True, False]])
    for kind in KL_KINDS:
        out = kl_estimate(logp, ref, kind, mask=mask)
        assert torch.isfinite(out).all() and (out[~mask] == 0).all()
        penalty = kl_penalty(logp, ref, mask, 0.5, kind, "seq-mean-token-mean")
        expected = 0.5 * aggregate(kl_estimate(logp, ref, kind), mask, "seq-mean-token-mean")
        torch.testing.assert_close(penalty, expected)
        (grad,) = torch.autograd.grad(penalty, logp)
        assert torch.isfinite(grad).all() and (grad[~mask] == 0).all()
