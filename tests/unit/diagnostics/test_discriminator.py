import math

import pytest
import torch

from lit_entropy.diagnostics.discriminator import naive_token_scores, token_scores


def _inputs(batch=3, length=11, vocab=257, dtype=torch.float32, seed=0, scale=3.0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, length, vocab, generator=gen) * scale).to(dtype)
    targets = torch.randint(0, vocab, (batch, length), generator=gen)
    return logits, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
@pytest.mark.parametrize("chunk_size", [1, 5, 33, 1024])
def test_chunked_matches_naive(dtype, temperature, chunk_size):
    logits, targets = _inputs(dtype=dtype)  # 33 rows: 5 does not divide them
    S, N = token_scores(logits, targets, temperature, chunk_size=chunk_size)
    ref_S, ref_N = naive_token_scores(logits, targets, temperature)
    assert S.dtype == N.dtype == torch.float32
    assert S.shape == N.shape == targets.shape
    torch.testing.assert_close(S, ref_S, atol=1e-6, rtol=0)
    torch.testing.assert_close(N, ref_N, atol=1e-6, rtol=0)


def test_shifted_view_input():
    logits, ids = _inputs(batch=2, length=9, vocab=64)
    view, targets = logits[:, :-1], ids[:, 1:]  # not flat-viewable: the row gather path
    S, N = token_scores(view, targets, chunk_size=4)
    ref_S, ref_N = naive_token_scores(view.contiguous(), targets)
    torch.testing.assert_close(S, ref_S, atol=1e-6, rtol=0)
    torch.testing.assert_close(N, ref_N, atol=1e-6, rtol=0)


def test_known_values():
    # row 0: uniform over 4 -> H = log 4, p_t = 1/4 -> S = N = 0
    # row 1: one-hot (the target) -> H = 0, p_t = 1 -> S = N = 0
    # row 2: p = (1/4, 3/4), target 0
    logits = torch.full((1, 3, 4), -math.inf)
    logits[0, 0] = 0.0
    logits[0, 1, 2] = 0.0
    logits[0, 2, 0], logits[0, 2, 1] = 0.0, math.log(3.0)
    targets = torch.tensor([[1, 2, 0]])
    S, N = token_scores(logits, targets, chunk_size=2)
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    s2 = 0.25 * (h + math.log(0.25))
    n2 = 0.25**2 * (h + math.log(0.25)) + 0.75**2 * (h + math.log(0.75))
    expected_S = torch.tensor([[0.0, 0.0, s2]])
    expected_N = torch.tensor([[0.0, 0.0, n2]])
    assert torch.isfinite(S).all() and torch.isfinite(N).all()  # -inf logits: 0·log 0 terms are 0
    torch.testing.assert_close(S, expected_S, atol=1e-6, rtol=0)
    torch.testing.assert_close(N, expected_N, atol=1e-6, rtol=0)
    torch.testing.assert_close(naive_token_scores(logits, targets)[1], expected_N, atol=1e-6, rtol=0)


def test_temperature_scales_logits():
    logits, targets = _inputs(batch=1, length=4, vocab=50)
    torch.testing.assert_close(token_scores(logits, targets, 2.0), token_scores(logits / 2.0, targets))


def test_baseline_is_exact_expectation_of_score():
    # N_t = Σ_y p_y·S_t(y): enumerate every possible target.
    vocab = 7
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(1, 1, vocab, generator=gen) * 2
    all_logits = logits.expand(1, vocab, vocab)
    S_all, N_all = token_scores(all_logits, torch.arange(vocab).unsqueeze(0))
    p = torch.softmax(logits[0, 0], -1)
    torch.testing.assert_close((p * S_all[0]).sum(), N_all[0, 0], atol=1e-7, rtol=0)


def test_monte_carlo_on_policy_mean_of_score_is_baseline():
    vocab, draws = 6, 40_000
    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(3, vocab, generator=gen) * 1.5
    p = torch.softmax(logits, -1)
    for row in range(3):
        targets = torch.multinomial(p[row], draws, replacement=True, generator=gen).unsqueeze(0)
        S, N = token_scores(logits[row].expand(1, draws, vocab), targets, chunk_size=4096)
        se = S.std() / math.sqrt(draws)
        assert abs(S.mean().item() - N[0, 0].item()) < 4 * se.item() + 1e-7
        torch.testing.assert_close(N[0], N[0, 0].expand(draws))


def test_first_order_entropy_change():
    # A step z <- z + eps·(e_t − p) on the logits changes H by −eps·(S − N) + O(eps²).
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(1, 5, 9, generator=gen)
    targets = torch.randint(0, 9, (1, 5), generator=gen)
    S, N = token_scores(logits, targets)
    eps = 1e-3
    p = torch.softmax(logits.double(), -1)
    step = torch.nn.functional.one_hot(targets, 9).double() - p

    def entropy(z):
        lp = torch.log_softmax(z, -1)
        return -(lp.exp() * lp).sum(-1)

    dH = entropy(logits.double() + eps * step) - entropy(logits.double())
    pred = -eps * (S - N).double()
    torch.testing.assert_close(dH, pred, rtol=1e-2, atol=1e-9)


def test_no_grad_and_garbage_rows_stay_local():
    logits, targets = _inputs(batch=2, length=4, vocab=20)
    logits = logits.clone()
    logits[1, 3] = float("nan")  # a garbage padding row
    leaf = logits.clone().requires_grad_()
    S, N = token_scores(leaf, targets, chunk_size=3)
    assert not S.requires_grad and not N.requires_grad
    clean = torch.ones(2, 4, dtype=torch.bool)
    clean[1, 3] = False
    ref_S, ref_N = naive_token_scores(torch.where(clean[..., None], logits, 0.0), targets)
    torch.testing.assert_close(S[clean], ref_S[clean], atol=1e-6, rtol=0)
    torch.testing.assert_close(N[clean], ref_N[clean], atol=1e-6, rtol=0)


def test_bad_shapes():
    logits, targets = _inputs(batch=1, length=3, vocab=5)
    with pytest.raises(ValueError):
        token_scores(logits, targets[:, :2])
    with pytest.raises(ValueError):
        token_scores(logits, targets, chunk_size=0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_fused_pass_equals_the_separate_ones(temperature):
    """The pre-update pass's fused statistics: log p and H bitwise those of the entropy pass, S and N those of the
    naive reference, dead (-inf) logits included."""
    from lit_entropy.diagnostics.discriminator import token_logprobs_entropy_and_scores
    from lit_entropy.diagnostics.entropy import token_logprobs_and_entropy

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 7, 50, generator=g) * 4
    logits[0, :, 10:] = float("-inf")  # a truncated distribution: only 10 live tokens
    targets = torch.randint(0, 10, (3, 7), generator=g)
    logp, ent, s, n = token_logprobs_entropy_and_scores(logits[:, :-1], targets[:, 1:], temperature, chunk_size=4)
    ref_logp, ref_ent = token_logprobs_and_entropy(logits[1:, :-1], targets[1:, 1:], temperature, chunk_size=4)
    assert torch.equal(logp[1:], ref_logp) and torch.equal(ent[1:], ref_ent)
    ref_s, ref_n = naive_token_scores(logits[:, :-1], targets[:, 1:], temperature)
    assert torch.allclose(s, ref_s, atol=1e-6) and torch.allclose(n, ref_n, atol=1e-6)
    assert torch.isfinite(ent).all() and torch.isfinite(n).all()
    assert ent.dtype == logp.dtype == s.dtype == n.dtype == torch.float32
