"""CISPO, SAPO and DPPO (lit_entropy/objectives/losses/trust_region.py): hand-computed values, the gradients the rules are
about, equality with a re-derivation of the peers' public rules (TRL's CISPO and SAPO, verl's DPPO) on identical
tensors, the presets and the pairs refused at start-up."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import losses
from lit_entropy.objectives.losses import trust_region as tr
from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.policy_loss import aggregate
from lit_entropy.train import check_controllers_and_algo, instantiate_callbacks
from tests.helpers import compose_train

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]
NEW_PRESETS = ("cispo", "sapo", "dppo_tv", "dppo_kl")


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).requires_grad_(True)


def grad_of(loss_tok: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    (g,) = torch.autograd.grad(loss_tok.sum(), logp)
    return g


def random_case(seed: int, rows: int = 6, width: int = 9, spread: float = 0.6):
    """Log-probs in (−6, −0.01), a current policy moved by up to ±``spread`` nats, ±advantages, ragged masks."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=g) * 6 - 0.01
    logp = (old + (torch.rand(rows, width, generator=g) * 2 - 1) * spread).clamp(max=-1e-3)
    adv = torch.randn(rows, generator=g)
    lengths = torch.randint(3, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]
    return logp.requires_grad_(True), old, adv, mask


# ---- CISPO ---------------------------------------------------------------------------------------------------


def test_cispo_hand_values_and_gradient():
    # r = e^{0.5} = 1.6487 (capped at 1.2), 1, e^{-1} = 0.3679; A = +1, −2, +1
    logp, old = leaf([[-0.5, -1.0, -2.0]]), torch.tensor([[-1.0, -1.0, -1.0]])
    adv, mask = torch.tensor([[1.0, -2.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool)
    loss, info = tr.cispo_surrogate(logp, old, adv, mask, eps_high=0.2)
    want = [-1.2 * 1 * -0.5, -1.0 * -2 * -1.0, -math.exp(-1) * 1 * -2.0]
    assert loss.detach()[0].tolist() == pytest.approx(want, rel=1e-6)
    assert grad_of(loss, logp)[0].tolist() == pytest.approx([-1.2, 2.0, -math.exp(-1)], rel=1e-6)
    assert info["clipped_high"].tolist() == [[True, False, False]] and not info["clipped_low"].any()


def test_cispo_drops_no_token_gradient_where_ppo_does():
    """Every token with A ≠ 0 keeps a gradient −min(r, 1 + ε)·A, at any ratio; PPO's clip zeroes some."""
    log_r = torch.linspace(-3, 3, 25)
    old = torch.full((2, 25), -2.0)
    logp = (old + log_r).requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 25)
    mask = torch.ones(2, 25, dtype=torch.bool)
    g = grad_of(tr.cispo_surrogate(logp, old, adv, mask, 0.28)[0], logp)
    assert (g != 0).all()
    assert torch.allclose(g, -torch.exp(log_r).clamp(max=1.28) * adv, rtol=1e-5)
    ppo_logp = logp.detach().clone().requires_grad_(True)
    ppo = grad_of(clipped_surrogate(ppo_logp, old, adv, 0.2, 0.28, mask=mask)[0], ppo_logp)
    assert (ppo == 0).sum() > 0  # the tokens PPO drops, and CISPO keeps


def trl_cispo(logp, old, adv, mask, epsilon_high):
    """TRL ``loss_type="cispo"`` re-derived: the weight min(r, epsilon_high), detached, times −A·log π; summed
    over the loss tokens and divided by their count (TRL's token normalisation)."""
    weight = torch.clamp(torch.exp(logp - old), max=epsilon_high).detach()
    per_token = -weight * adv[:, None] * logp
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("seed", range(3))
def test_cispo_equals_trl_rule_loss_and_gradient(seed):
    """Ours caps at 1 + eps_high (the paper's form), TRL at epsilon_high itself: eps_high=4 is TRL's 5.0."""
    logp, old, adv, mask = random_case(seed, spread=2.0)
    ours = aggregate(tr.cispo_surrogate(logp, old, adv, mask, eps_high=4.0)[0], mask, "token-mean")
    g_ours = torch.autograd.grad(ours, logp)[0]
    peer_logp = logp.detach().clone().requires_grad_(True)
    peer = trl_cispo(peer_logp, old, adv, mask, epsilon_high=5.0)
    g_peer = torch.autograd.grad(peer, peer_logp)[0]
    assert torch.allclose(ours, peer, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g_ours, g_peer, rtol=1e-6, atol=1e-8)


# ---- SAPO ----------------------------------------------------------------------------------------------------


def test_sapo_hand_values_gate_and_temperatures():
    # r = 1, 1, e^{0.5}; A = +2, −1, +1 -> τ = 1.0, 1.05, 1.0
    logp, old = leaf([[-1.0, -1.0, -0.5]]), torch.tensor([[-1.0, -1.0, -1.0]])
    adv, mask = torch.tensor([[2.0, -1.0, 1.0]]), torch.ones(1, 3, dtype=torch.bool)
    loss, info = tr.sapo_surrogate(logp, old, adv, mask, tau_pos=1.0, tau_neg=1.05)
    r3 = math.exp(0.5)
    sig = 1 / (1 + math.exp(-(r3 - 1)))
    want = [-2.0 * (0.5 * 4 / 1.0), 1.0 * (0.5 * 4 / 1.05), -(sig * 4.0)]
    assert loss.detach()[0].tolist() == pytest.approx(want, rel=1e-6)
    assert not info["clipped_low"].any() and not info["clipped_high"].any()


def test_sapo_gradient_is_ppo_on_policy_and_decays_smoothly():
    """∂l/∂log π = −A·4σ(τ(r−1))(1 − σ(τ(r−1)))·r: exactly −A at r = 1 (PPO's gradient), smaller off-policy,
    never cut to 0 as PPO's clip does, and faster-decaying for A < 0 (τ_neg > τ_pos)."""
    log_r = torch.linspace(-2, 2, 41)
    old = torch.full((2, 41), -1.5)
    logp = (old + log_r).requires_grad_(True)
    adv = torch.tensor([[1.0], [-1.0]]).expand(2, 41)
    mask = torch.ones(2, 41, dtype=torch.bool)
    g = grad_of(tr.sapo_surrogate(logp, old, adv, mask, 1.0, 1.05)[0], logp)
    r = torch.exp(log_r)
    for row, tau in ((0, 1.0), (1, 1.05)):
        s = torch.sigmoid(tau * (r - 1))
        assert torch.allclose(g[row], -adv[row] * 4 * s * (1 - s) * r, rtol=1e-5, atol=1e-7)
    assert g[0, 20].item() == pytest.approx(-1.0, abs=1e-6) and g[1, 20].item() == pytest.approx(1.0, abs=1e-6)
    assert (g != 0).all()
    weight = (g / r).abs()  # the gate's slope, 4σ(1−σ): 1 on-policy, decaying both ways
    assert weight[0, :20].diff().gt(0).all() and weight[0, 21:].diff().lt(0).all()
    assert (weight[1, 25:] < weight[0, 25:]).all()  # τ_neg > τ_pos: negative tokens' gradient decays faster


def trl_sapo(logp, old, adv, mask, tau_pos, tau_neg):
    """TRL ``loss_type="sapo"`` re-derived: gate σ(τ(r − 1))·4/τ with τ_pos where A > 0 else τ_neg, times −A;
    each sequence's token mean, then the mean over sequences."""
    r = torch.exp(logp - old)
    a = adv[:, None].expand_as(r)
    gate = torch.where(a > 0, torch.sigmoid(tau_pos * (r - 1)) * 4 / tau_pos, torch.sigmoid(tau_neg * (r - 1)) * 4 / tau_neg)
    per_token = -gate * a
    return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()


@pytest.mark.parametrize("seed", range(3))
def test_sapo_equals_trl_rule_loss_and_gradient(seed):
    logp, old, adv, mask = random_case(seed)
    ours = aggregate(tr.sapo_surrogate(logp, old, adv, mask, 1.0, 1.05)[0], mask, "seq-mean-token-mean")
    g_ours = torch.autograd.grad(ours, logp)[0]
    peer_logp = logp.detach().clone().requires_grad_(True)
    peer = trl_sapo(peer_logp, old, adv, mask, 1.0, 1.05)
    g_peer = torch.autograd.grad(peer, peer_logp)[0]
    assert torch.allclose(ours, peer, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g_ours, g_peer, rtol=1e-5, atol=1e-8)


# ---- DPPO ----------------------------------------------------------------------------------------------------


def test_dppo_tv_mask_by_hand():
    # p_old = 0.5 everywhere; p = 0.7, 0.55, 0.3, 0.45 with A = +1, +1, −1, −1 and thresholds 0.15
    old = torch.full((1, 4), math.log(0.5))
    logp = leaf([[math.log(0.7), math.log(0.55), math.log(0.3), math.log(0.45)]])
    adv, mask = torch.tensor([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4, dtype=torch.bool)
    loss, info = tr.dppo_surrogate(logp, old, adv, mask, 0.15, 0.15, "tv")
    # token 0 moved +0.2 > 0.15 with A > 0: out; token 2 moved −0.2 < −0.15 with A < 0: out
    assert info["clipped_high"].tolist() == [[True, False, False, False]]
    assert info["clipped_low"].tolist() == [[False, False, True, False]]
    r1, r3 = 0.55 / 0.5, 0.45 / 0.5
    want = [0.0, -1 * r1 * math.log(0.55), 0.0, 1 * r3 * math.log(0.45)]
    assert loss.detach()[0].tolist() == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert grad_of(loss, logp)[0].tolist() == pytest.approx([0.0, -r1, 0.0, r3], rel=1e-5, abs=1e-7)


def test_dppo_kl_mask_by_hand():
    # p_old = 0.5; p = 0.7 (A > 0, up: D = 0.0872 > 0.05, out), 0.3 (A > 0, down: kept whatever D),
    # 0.3 (A < 0, down: D = 0.0872, out), 0.52 (A < 0, up: kept)
    old = torch.full((1, 4), math.log(0.5))
    logp = leaf([[math.log(0.7), math.log(0.3), math.log(0.3), math.log(0.52)]])
    adv, mask = torch.tensor([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4, dtype=torch.bool)
    d = 0.5 * math.log(0.5 / 0.7) + 0.5 * math.log(0.5 / 0.3)
    assert tr.binary_kl(torch.tensor(math.log(0.7)), torch.tensor(math.log(0.5))).item() == pytest.approx(d, rel=1e-4)
    loss, info = tr.dppo_surrogate(logp, old, adv, mask, 0.05, 0.05, "kl")
    assert info["clipped_high"].tolist() == [[True, False, False, False]]
    assert info["clipped_low"].tolist() == [[False, False, True, False]]
    assert (grad_of(loss, logp)[0, [1, 3]] != 0).all()


def test_dppo_caps_the_weight_at_ratio_cap():
    logp, old = leaf([[-0.1]]), torch.tensor([[-5.0]])  # r = e^{4.9} ≈ 134, p moved 0.90 − 0.007
    mask = torch.ones(1, 1, dtype=torch.bool)
    loss, _ = tr.dppo_surrogate(logp, old, torch.tensor([[-1.0]]), mask, 0.15, 0.15, "tv", ratio_cap=20.0)
    assert grad_of(loss, logp).item() == pytest.approx(20.0)  # A < 0, p went up: kept, weight capped at 20


def verl_dppo(logp, old, adv, mask, low, high, divergence, cap):
    """verl's ``dppo_tv`` / ``dppo_kl`` re-derived: weight min(r, clip_ratio_c) detached; the valid mask from
    p − p_old (TV) or the binary KL and the direction of p (KL), per the sign of A; −A·w·log π·valid, token-mean."""
    a = adv[:, None].expand_as(logp)
    r = torch.exp((logp - old).clamp(-20, 20))
    w = torch.clamp(r, max=cap).detach()
    p, p_old = torch.exp(logp), torch.exp(old)
    if divergence == "tv":
        pos, neg = (p - p_old) <= high, (p - p_old) >= -low
    else:
        kl = p_old * (old - logp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        pos, neg = (kl <= high) | (p <= p_old), (kl <= low) | (p >= p_old)
    valid = torch.where(a > 0, pos, neg).detach().float()
    per_token = -a * w * logp * valid
    return (per_token * mask).sum() / mask.sum()


@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("seed", range(3))
def test_dppo_equals_verl_rule_loss_and_gradient(divergence, seed):
    logp, old, adv, mask = random_case(seed, spread=1.5)
    low, high = (0.15, 0.15) if divergence == "tv" else (0.05, 0.05)
    loss_tok, info = tr.dppo_surrogate(logp, old, adv, mask, low, high, divergence, ratio_cap=3.0)
    ours = aggregate(loss_tok, mask, "token-mean")
    g_ours = torch.autograd.grad(ours, logp)[0]
    peer_logp = logp.detach().clone().requires_grad_(True)
    peer = verl_dppo(peer_logp, old, adv, mask, low, high, divergence, cap=3.0)
    g_peer = torch.autograd.grad(peer, peer_logp)[0]
    assert torch.allclose(ours, peer, rtol=1e-6, atol=1e-7)
    assert torch.allclose(g_ours, g_peer, rtol=1e-6, atol=1e-8)
    assert (info["clipped_low"] | info["clipped_high"]).any()  # the case exercises the trust region


def test_padding_garbage_never_reaches_the_losses():
    logp, old = leaf([[-1.0, float("nan")]]), torch.tensor([[-1.2, float("nan")]])
    mask = torch.tensor([[True, False]])
    for name in NEW_PRESETS:
        loss, _ = losses.LOSSES[name].surrogate(logp, old, torch.tensor([1.0]), mask, 0.2, 0.2)
        g = grad_of(loss, logp)
        assert torch.isfinite(loss).all() and torch.isfinite(g).all() and g[0, 1] == 0, name


# ---- in the objective, the presets, the refused pairs --------------------------------------------------------


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_micro_batch_loss_routes_to_the_loss(name):
    logp, old, adv, mask = random_case(7)
    algo = AlgoConfig(loss=name, eps_low=0.15, eps_high=0.15)
    mb = {"response_mask": mask, "old_logp": old, "token_advantages": adv[:, None].expand_as(old)}
    knobs = Knobs(eps_low=0.15, eps_high=0.15)
    sel = select_tokens(algo, mb, knobs)
    loss, stats = micro_batch_loss(algo, knobs, mb, sel, logp, None)
    pure = {  # the registry's entry must call its pure function with the knobs and the default loss_args
        "cispo": lambda: tr.cispo_surrogate(logp, old, adv, mask, 0.15),
        "sapo": lambda: tr.sapo_surrogate(logp, old, adv, mask, tr.SAPO_TAU_POS, tr.SAPO_TAU_NEG),
        "dppo_tv": lambda: tr.dppo_surrogate(logp, old, adv, mask, 0.15, 0.15, "tv", tr.DPPO_RATIO_CAP),
        "dppo_kl": lambda: tr.dppo_surrogate(logp, old, adv, mask, 0.15, 0.15, "kl", tr.DPPO_RATIO_CAP),
    }
    want = aggregate(pure[name]()[0], mask, "token-mean")
    assert torch.allclose(loss, want) and stats["tokens"] == mask.sum()


@pytest.mark.parametrize("preset", [*NEW_PRESETS, "maxrl", "lite_ppo"])
def test_new_presets_compose(preset):
    algo = instantiate(compose_train([f"algo={preset}", *OUT]).algo)
    assert algo.name == preset
    if preset in NEW_PRESETS:
        assert algo.loss == preset
    assert {"cispo": algo.eps_high == 4.0, "sapo": algo.loss_args == {"tau_pos": 1.0, "tau_neg": 1.05},
            "dppo_tv": algo.eps_low == algo.eps_high == 0.15, "dppo_kl": algo.eps_low == algo.eps_high == 0.05,
            "maxrl": algo.advantage == "maxrl", "lite_ppo": algo.advantage == "grpo_batch"}[preset]


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"loss": "cispo", "selection": "clip_cov"}, ("algo.loss=cispo", "algo.selection=clip_cov")),
    ({"loss": "sapo", "selection": "kl_cov"}, ("algo.loss=sapo", "algo.selection=kl_cov")),
    ({"loss": "dppo_tv", "dual_clip": 3.0}, ("algo.dual_clip", "algo.loss=dppo_tv")),
    ({"loss": "dppo_kl", "archer": {"quantile": 0.8, "eps": 0.5, "kl_high": 0.0}}, ("algo.archer", "dppo_kl")),
    ({"loss": "sapo", "loss_args": {"ratio_cap": 5.0}}, ("algo.loss_args", "algo.loss=sapo")),
    ({"loss": "cispo", "loss_args": {"tau_pos": 1.0}}, ("algo.loss_args", "takes none")),
    ({"loss": "dppo_tv", "loss_args": {"ratio_cap": 0}}, ("algo.loss_args.ratio_cap",)),
])
def test_refused_pairs_name_both_keys(kwargs, names):
    with pytest.raises(ValueError) as err:
        AlgoConfig(**kwargs)
    for name in names:
        assert name in str(err.value)


def test_selection_rules_on_the_loss_mask_compose_with_the_new_losses():
    for name in NEW_PRESETS:
        assert AlgoConfig(loss=name, selection="forking").selection == "forking"  # accepted, not refused
        assert AlgoConfig(loss=name, erc={"low": 0.05, "high": 0.05}).erc.low == 0.05


@pytest.mark.parametrize("preset", NEW_PRESETS)
def test_adapo_is_refused_with_a_loss_that_replaces_the_clip(preset):
    cfg = compose_train([f"algo={preset}", "callbacks/entropy=adapo", *OUT])
    callbacks = instantiate_callbacks(cfg.callbacks)
    with pytest.raises(ValueError, match=f"ADAPOCallback drives eps_high.*algo.loss={preset}"):
        check_controllers_and_algo(callbacks, instantiate(cfg.algo))


def test_other_controllers_are_accepted_with_the_new_losses():
    for controller in ("entrocraft_hard", "adaptive_bonus", "entropic", "repo_r"):
        cfg = compose_train(["algo=cispo", f"callbacks/entropy={controller}", *OUT])
        check_controllers_and_algo(instantiate_callbacks(cfg.callbacks), instantiate(cfg.algo))
