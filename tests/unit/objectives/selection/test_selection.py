import math
from pathlib import Path

import pytest
import torch

from lit_entropy.objectives.policy_loss import ratio
from lit_entropy.objectives.registry import SELECTION_RULES
from lit_entropy.objectives.selection.clip_b import clip_b
from lit_entropy.objectives.selection.clip_cov import clip_cov
from lit_entropy.objectives.selection.clip_v import clip_v
from lit_entropy.objectives.selection.forking import forking_tokens
from lit_entropy.objectives.selection.kl_cov import kl_cov, kl_cov_loss
from lit_entropy.objectives.selection.tokens import covariance_terms

T, F = True, False
NAN, INF = float("nan"), float("inf")


def _b(rows):
    return torch.tensor(rows, dtype=torch.bool)


def _t(rows):
    return torch.tensor(rows, dtype=torch.float32)


# A 2 x 3 minibatch, last column padding holding garbage. Response tokens (N = 4):
#   A    = [2, 2 | -2, -2]       mean 0
#   logp = [-1, -3 | -1, -4]     mean -2.25 -> centred [1.25, -0.75 | 1.25, -1.75]
#   c    = [2.5, -1.5 | -2.5, 3.5]
MASK = _b([[T, T, F], [T, T, F]])
ADV = _t([[2.0, 2.0, 1e6], [-2.0, -2.0, NAN]])
LOGP = _t([[-1.0, -3.0, 1e6], [-1.0, -4.0, -INF]])
C = _t([[2.5, -1.5, 0.0], [-2.5, 3.5, 0.0]])


def test_rule_names():
    assert set(SELECTION_RULES) == {"clip_cov", "kl_cov", "clip_b", "clip_v", "forking"}


def test_every_file_of_the_folder_registers_the_rule_named_after_it():
    """A new rule is its file: each file but the shared tokens.py registers one rule under the file's name."""
    folder = Path(SELECTION_RULES["forking"].fn.__code__.co_filename).parent
    files = {p.stem for p in folder.glob("*.py")} - {"__init__", "tokens"}
    assert {name: rule.fn.__module__.rpartition(".")[2] for name, rule in SELECTION_RULES.items()} == {
        n: n for n in files}


def test_covariance_terms_hand_values_and_per_sequence_advantages():
    torch.testing.assert_close(covariance_terms(LOGP, ADV, MASK), C)
    torch.testing.assert_close(covariance_terms(LOGP, torch.tensor([2.0, -2.0]), MASK), C)


# --------------------------------------------------------------------------------------------- Clip-Cov


def test_clip_cov_candidates_and_counts():
    # candidates (1 < c < 5): (0, 0) c = 2.5 and (1, 1) c = 3.5
    both = _b([[T, F, F], [F, T, F]])
    # rho = 0.5: floor(2) = 2 -> both; rho = 1: 4 wanted, only 2 candidates -> both
    for rho in (0.5, 1.0):
        m, frac = clip_cov(LOGP, ADV, MASK, None, rho=rho, generator=torch.Generator().manual_seed(0))
        assert torch.equal(m, both)
        assert frac.item() == 0.5
    # bounds are strict: c = 3.5 is not < 3.5; c = 2.5 is not > 2.5
    m, _ = clip_cov(LOGP, ADV, MASK, None, rho=1.0, bound_high=3.5)
    assert torch.equal(m, _b([[T, F, F], [F, F, F]]))
    m, _ = clip_cov(LOGP, ADV, MASK, None, rho=1.0, bound_low=2.5)
    assert torch.equal(m, _b([[F, F, F], [F, T, F]]))
    # already clipped tokens are not candidates (garbage True at padding is harmless)
    m, frac = clip_cov(LOGP, ADV, MASK, _b([[T, F, T], [F, F, T]]), rho=1.0)
    assert torch.equal(m, _b([[F, F, F], [F, T, F]]))
    assert frac.item() == 0.25
    # no candidate -> none
    m, frac = clip_cov(LOGP, ADV, MASK, None, rho=1.0, bound_low=4.0)
    assert not m.any() and frac.item() == 0.0


def test_clip_cov_max_one_with_default_rho():
    # floor(2e-4 · 4) = 0 -> max(1, 0) = 1 of the two candidates
    picked = []
    for seed in range(400):
        m, frac = clip_cov(LOGP, ADV, MASK, None, generator=torch.Generator().manual_seed(seed))
        assert m.sum().item() == 1 and frac.item() == 0.25
        assert not (m & ~_b([[T, F, F], [F, T, F]])).any()
        picked.append(bool(m[0, 0]))
    # uniform over the two candidates
    assert 150 < sum(picked) < 250


def test_clip_cov_seeded_determinism_and_count():
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(8, 300, generator=gen) * 6
    adv = torch.randn(8, generator=gen) * 3
    mask = torch.rand(8, 300, generator=gen) < 0.8
    n = int(mask.sum())
    a, fa = clip_cov(logp, adv, mask, None, rho=5e-3, generator=torch.Generator().manual_seed(42))
    b, fb = clip_cov(logp, adv, mask, None, rho=5e-3, generator=torch.Generator().manual_seed(42))
    c, _ = clip_cov(logp, adv, mask, None, rho=5e-3, generator=torch.Generator().manual_seed(43))
    assert torch.equal(a, b) and fa.item() == fb.item()
    assert not torch.equal(a, c)
    assert a.sum().item() == math.floor(5e-3 * n) and not (a & ~mask).any()
    cov = covariance_terms(logp, adv, mask)
    assert ((cov[a] > 1.0) & (cov[a] < 5.0)).all()


def test_clip_cov_no_response_tokens():
    m, frac = clip_cov(LOGP, ADV, torch.zeros_like(MASK), None, rho=1.0)
    assert not m.any() and frac.item() == 0.0


# ---------------------------------------------------------------------------------------------- KL-Cov


def test_kl_cov_top_k_hand_values():
    m, frac = kl_cov(LOGP, ADV, MASK, k=0.25)  # floor(1) = 1: c = 3.5
    assert torch.equal(m, _b([[F, F, F], [F, T, F]])) and frac.item() == 0.25
    m, frac = kl_cov(LOGP, ADV, MASK, k=0.5)  # floor(2) = 2: 3.5 and 2.5
    assert torch.equal(m, _b([[T, F, F], [F, T, F]])) and frac.item() == 0.5
    m, _ = kl_cov(LOGP, ADV, MASK, k=0.75)  # 3: then -1.5 (padding c would be 0 > -1.5 if it leaked)
    assert torch.equal(m, _b([[T, T, F], [F, T, F]]))
    m, frac = kl_cov(LOGP, ADV, MASK, k=0.2)  # floor(0.8) = 0 -> at least one: the top token (3.5)
    assert torch.equal(m, _b([[F, F, F], [F, T, F]])) and frac.item() == 0.25
    m, _ = kl_cov(LOGP, ADV, MASK)  # default k = 2e-3 on 4 tokens -> at least one
    assert int(m.sum()) == 1
    m, frac = kl_cov(LOGP, ADV, MASK, k=0.0)  # k = 0 turns the rule off
    assert not m.any() and frac.item() == 0.0


def test_kl_cov_equal_advantages_ties_go_row_major():
    # c = 0 everywhere: the top floor(0.3 · 7) = 2 are the first two response tokens in row-major order
    mask = _b([[F, T, T, T, F], [T, T, T, T, F]])
    logp = -torch.arange(10.0).reshape(2, 5)
    m, _ = kl_cov(logp, torch.full((2,), 0.7), mask, k=0.3)
    assert torch.equal(m, _b([[F, T, T, F, F], [F, F, F, F, F]]))


def test_kl_cov_loss_values():
    old = _t([[-1.0, -2.0], [-3.0, -1.0]])
    logp = old + _t([[math.log(2.0), 0.0], [-math.log(2.0), 0.5]])
    adv = _t([[1.0, 1.0], [-2.0, -2.0]])
    selected = _b([[T, F], [T, T]])
    loss = kl_cov_loss(logp, old, adv, selected, beta=0.5)
    expected = _t(
        [
            [-2.0 + 0.5 * math.log(2.0), -1.0],
            [2.0 * 0.5 + 0.5 * math.log(2.0), 2.0 * math.exp(0.5) + 0.25],
        ]
    )
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected)


def test_kl_cov_loss_reduces_to_surrogate_when_policy_unchanged():
    gen = torch.Generator().manual_seed(1)
    base = -torch.rand(3, 7, generator=gen) * 4
    adv = torch.randn(3, generator=gen)
    selected = torch.rand(3, 7, generator=gen) < 0.5
    a = base.clone().requires_grad_()
    loss = kl_cov_loss(a, base, adv, selected, beta=1.0)
    (g,) = torch.autograd.grad(loss.sum(), a)
    b = base.clone().requires_grad_()
    ref = -adv[:, None] * ratio(b, base)
    (g_ref,) = torch.autograd.grad(ref.sum(), b)
    assert torch.equal(loss, ref)
    assert torch.equal(g, g_ref)


# ---------------------------------------------------------------------------------------------- Clip_B

# Response S (N = 10): nine zeros and -10 at (1, 4): mean -1, z = 1 or -9, sigma = sqrt((9 + 81) / 10) = 3.
S_B = _t([[0.0, 0.0, 0.0, 0.0, 0.0, -1e9], [0.0, 0.0, 0.0, 0.0, -10.0, NAN]])
MASK_B = _b([[T, T, T, T, T, F], [T, T, T, T, T, F]])


def test_clip_b_hand_values():
    neg = torch.tensor([-1.0, -1.0])
    keep, frac = clip_b(S_B, neg, MASK_B)  # -9 < -2.5 · 3
    expected = MASK_B.clone()
    expected[1, 4] = False
    assert torch.equal(keep, expected) and frac.item() == pytest.approx(0.1)
    # positive advantage: always kept
    keep, frac = clip_b(S_B, torch.tensor([-1.0, 1.0]), MASK_B)
    assert torch.equal(keep, MASK_B) and frac.item() == 0.0
    # strict: -9 is not < -3 · 3
    keep, _ = clip_b(S_B, neg, MASK_B, mu=3.0)
    assert torch.equal(keep, MASK_B)
    keep, _ = clip_b(S_B, neg, MASK_B, mu=2.99)
    assert torch.equal(keep, expected)


def test_clip_b_degenerate():
    # one response token, or all S equal: sigma = 0, nothing removed
    one = _b([[F, T, F]])
    keep, frac = clip_b(_t([[NAN, -3.0, 1e9]]), _t([[-1.0, -1.0, -1.0]]), one)
    assert torch.equal(keep, one) and frac.item() == 0.0
    keep, _ = clip_b(torch.full((2, 6), -0.4), torch.tensor([-1.0, -1.0]), MASK_B)
    assert torch.equal(keep, MASK_B)
    keep, frac = clip_b(S_B, torch.tensor([-1.0, -1.0]), torch.zeros_like(MASK_B))
    assert not keep.any() and frac.item() == 0.0


# ---------------------------------------------------------------------------------------------- Clip_V

# Response D = N - S (N = 20): eighteen zeros, 10 at (0, 3), 12 at (1, 7).
# mean 1.1, E[D²] = 244 / 20 = 12.2, sigma = sqrt(12.2 - 1.21) = 3.315...
MASK_V = torch.ones(2, 11, dtype=torch.bool)
MASK_V[:, 10] = False
D_V = torch.zeros(2, 11)
D_V[0, 3], D_V[1, 7] = 10.0, 12.0
D_V[:, 10] = 1e9  # padding garbage (would qualify and win the top-K if it leaked)
S_V = torch.full((2, 11), -0.3)
N_V = S_V + D_V
SIGMA_V = math.sqrt(12.2 - 1.1**2)


def test_clip_v_threshold_and_cap():
    neg = torch.tensor([-1.0, -1.0])
    only_12 = MASK_V.clone()
    only_12[1, 7] = False
    both = only_12.clone()
    both[0, 3] = False
    # mu = 2: both qualify (10, 12 > 6.63); cap floor(0.05 · 20) = 1 keeps the larger D removed
    keep, frac = clip_v(S_V, N_V, neg, MASK_V, mu=2.0, max_frac=0.05)
    assert torch.equal(keep, only_12) and frac.item() == pytest.approx(0.05)
    keep, frac = clip_v(S_V, N_V, neg, MASK_V, mu=2.0, max_frac=0.1)
    assert torch.equal(keep, both) and frac.item() == pytest.approx(0.1)
    # 10 / sigma < mu < 12 / sigma: only D = 12 qualifies
    keep, _ = clip_v(S_V, N_V, neg, MASK_V, mu=3.1, max_frac=1.0)  # 3.1 · 3.315 = 10.28
    assert torch.equal(keep, only_12)
    assert 10.0 / SIGMA_V < 3.1 < 12.0 / SIGMA_V
    # default mu = 8.5: nothing qualifies
    keep, _ = clip_v(S_V, N_V, neg, MASK_V, max_frac=1.0)
    assert torch.equal(keep, MASK_V)
    # positive advantage rows are never removed
    keep, _ = clip_v(S_V, N_V, torch.tensor([-1.0, 1.0]), MASK_V, mu=2.0, max_frac=1.0)
    expected = MASK_V.clone()
    expected[0, 3] = False
    assert torch.equal(keep, expected)


def test_clip_v_cap_may_be_zero():
    # default max_frac = 1e-4 on N = 20: K = floor(0.002) = 0 -> nothing removed although two qualify
    keep, frac = clip_v(S_V, N_V, torch.tensor([-1.0, -1.0]), MASK_V, mu=2.0)
    assert torch.equal(keep, MASK_V) and frac.item() == 0.0


def test_clip_v_single_token_and_equal_values():
    one = _b([[F, F, T]])
    s, n = _t([[NAN, 5.0, -0.2]]), _t([[1e9, 5.0, 0.1]])  # D = 0.3 on the response token, sigma_D = 0
    keep, frac = clip_v(s, n, _t([[-1.0, -1.0, -1.0]]), one)  # K = floor(1e-4) = 0
    assert torch.equal(keep, one) and frac.item() == 0.0
    # with room in the cap, D = 0.3 > 8.5 · 0 qualifies: the threshold is on D, not on D − mean D
    keep, frac = clip_v(s, n, _t([[-1.0, -1.0, -1.0]]), one, max_frac=1.0)
    assert not keep.any() and frac.item() == 1.0
    # all D equal to 0 (on-policy-like): nothing qualifies
    keep, _ = clip_v(S_V, S_V, torch.tensor([-1.0, -1.0]), MASK_V, max_frac=1.0)
    assert torch.equal(keep, MASK_V)


# --------------------------------------------------------------------------------------------- forking


def test_forking_hand_values():
    ent = _t([[0.5, 2.0, 1.0, 0.1, 99.0], [2.0, 0.3, 1.5, NAN, INF]])
    mask = _b([[T, T, T, T, F], [T, T, T, F, F]])  # N = 7
    keep, frac = forking_tokens(ent, mask)  # ceil(1.4) = 2
    assert torch.equal(keep, _b([[F, T, F, F, F], [T, F, F, F, F]]))
    assert frac.item() == pytest.approx(2 / 7)
    keep, _ = forking_tokens(ent, mask, top_frac=0.3)  # ceil(2.1) = 3
    assert torch.equal(keep, _b([[F, T, F, F, F], [T, F, T, F, F]]))
    keep, frac = forking_tokens(ent, mask, top_frac=1.0)
    assert torch.equal(keep, mask) and frac.item() == 1.0
    keep, frac = forking_tokens(ent, mask, top_frac=0.0)
    assert not keep.any() and frac.item() == 0.0


def test_forking_ties_and_exact_counts():
    mask = torch.ones(3, 10, dtype=torch.bool)
    ent = torch.ones(3, 10)
    keep, frac = forking_tokens(ent, mask, top_frac=0.1)  # 0.1 · 30 = 3 exactly (not 3.0000000000000004)
    expected = torch.zeros(3, 10, dtype=torch.bool)
    expected[0, :3] = True  # ties -> earliest in row-major order
    assert torch.equal(keep, expected) and frac.item() == pytest.approx(0.1)


def test_forking_single_response_token():
    one = _b([[F, T], [F, F]])
    keep, frac = forking_tokens(_t([[9.0, 0.0], [9.0, 9.0]]), one)  # ceil(0.2) = 1
    assert torch.equal(keep, one) and frac.item() == 1.0


# ------------------------------------------------------------------------------------------ all rules


def _all_rules(logp, adv, mask, S, N, ent, gen):
    return {
        "clip_cov": clip_cov(logp, adv, mask, None, rho=0.3, bound_low=-1e9, bound_high=1e9, generator=gen),
        "kl_cov": kl_cov(logp, adv, mask, k=0.5),
        "clip_b": clip_b(S, adv, mask, mu=0.1),
        "clip_v": clip_v(S, N, adv, mask, mu=0.0, max_frac=0.5),
        "forking": forking_tokens(ent, mask, top_frac=0.5),
    }


def test_masks_never_select_padding_with_garbage():
    gen = torch.Generator().manual_seed(5)
    mask = torch.rand(4, 16, generator=gen) < 0.5
    garbage = ~mask

    def noisy(x, junk):
        return torch.where(garbage, torch.full_like(x, junk), x)

    logp = noisy(-torch.rand(4, 16, generator=gen) * 5, 1e30)
    adv = noisy(torch.randn(4, 16, generator=gen), -1e30)
    S = noisy(torch.randn(4, 16, generator=gen), NAN)
    N = noisy(torch.randn(4, 16, generator=gen), INF)
    ent = noisy(torch.rand(4, 16, generator=gen) * 3, INF)
    for name, (sel, frac) in _all_rules(logp, adv, mask, S, N, ent, torch.Generator().manual_seed(0)).items():
        assert sel.dtype == torch.bool and sel.shape == mask.shape, name
        assert not (sel & garbage).any(), name
        assert frac.dtype == torch.float32 and 0.0 <= frac.item() <= 1.0, name
        assert sel.any(), name  # the loose settings touch something, so the check above is not vacuous
    # the result does not depend on what the padding holds
    clean = _all_rules(
        torch.where(mask, logp, 0.0),
        torch.where(mask, adv, 0.0),
        mask,
        torch.where(mask, S, 0.0),
        torch.where(mask, N, 0.0),
        torch.where(mask, ent, 0.0),
        torch.Generator().manual_seed(0),
    )
    dirty = _all_rules(logp, adv, mask, S, N, ent, torch.Generator().manual_seed(0))
    for name in SELECTION_RULES:
        assert torch.equal(clean[name][0], dirty[name][0]), name


def test_shape_errors():
    with pytest.raises(ValueError):
        kl_cov(LOGP, ADV[:, :2], MASK)
    with pytest.raises(ValueError):
        forking_tokens(LOGP[:, :2], MASK)
    with pytest.raises(ValueError):
        clip_v(S_V, N_V, torch.tensor([-1.0, -1.0]), MASK_V, max_frac=2.0)
