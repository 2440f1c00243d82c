"""GPPO / CE-GPPO, ERC, Archer and SimKO against hand-computed cases, and as presets in the real update. The top-K
pass SimKO reads: tests/unit/diagnostics/test_topk.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import entropy_methods as em
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from tests.helpers import step_gradient
from tests.unit.test_module_micro_batching import make_minibatch, make_module

# ---------------------------------------------------------------------------------------------- GPPO



def test_gppo_betas_are_knobs_read_from_the_module():
    algo = AlgoConfig(loss="gppo", gppo_beta_low=0.75)
    module = make_module(4, loss="gppo", gppo_beta_low=0.75)
    assert (module.gppo_beta_low, module.gppo_beta_high) == (0.75, 1.0) == (algo.gppo_beta_low, algo.gppo_beta_high)
    module.gppo_beta_high = 0.5  # what a controller does
    assert module.knobs()["gppo_beta_high"] == 0.5


# ----------------------------------------------------------------------------------------------- ERC


def one_response(logp: torch.Tensor, **fields: torch.Tensor) -> dict[str, torch.Tensor]:
    n = logp.shape[1]
    mb = {"response_mask": torch.ones(1, n, dtype=torch.bool), "old_logp": logp.detach().clone(),
          "token_advantages": torch.ones(1, n)}
    mb.update(fields)
    return mb


def test_erc_removes_the_gradient_of_tokens_whose_entropy_ratio_leaves_the_band():
    keep, rho = em.erc_keep(torch.tensor([1.0, 1.04, 1.06, 0.94, 0.96]), torch.ones(5), 0.05, 0.05)
    assert keep.tolist() == [True, True, False, False, True]
    algo = AlgoConfig(erc={"low": 0.05, "high": 0.05})
    logp = torch.full((1, 5), -1.0, requires_grad=True)
    mb = one_response(logp, entropy=torch.ones(1, 5))
    sel = select_tokens(algo, mb, Knobs(0.2, 0.2))
    ent = torch.tensor([[1.0, 1.04, 1.06, 0.94, 0.96]])
    loss, stats = micro_batch_loss(algo, Knobs(0.2, 0.2), mb, sel, logp, ent)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(loss.detach()) == pytest.approx(-1.0)  # value unchanged: −r·A, token-mean
    assert grad.tolist()[0] == pytest.approx([-0.2, -0.2, 0.0, 0.0, -0.2])  # −A·r/N where kept
    assert int(stats["erc_acted"]) == 2
    assert float(stats["entropy_ratio"]) == pytest.approx(5.0, abs=1e-5)  # Σ ρ_t (mean 1)


# --------------------------------------------------------------------------------------- Archer, SimKO


def test_high_entropy_tokens_are_above_their_own_responses_quantile():
    entropy = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0], [3.0, 1.0, 2.0, 9.0, 9.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool)
    high = em.high_entropy_tokens(entropy, mask, 0.8)  # row 0: threshold 4.2; row 1: 2.6 over {3, 1, 2}
    assert high.tolist() == [[False, False, False, False, True], [True, False, False, False, False], [False] * 5]


def test_archer_clips_high_entropy_tokens_looser_and_weights_their_kl_apart():
    algo = AlgoConfig(archer={"quantile": 0.5, "eps": 0.5, "kl_high": 0.0}, kl_coef=0.1, kl_kind="k1")
    knobs = Knobs(0.2, 0.2, kl_coef=0.1)
    logp = torch.full((1, 2), math.log(1.4), requires_grad=True)
    mb = one_response(logp, entropy=torch.tensor([[0.1, 1.0]]), ref_logp=torch.full((1, 2), math.log(1.4) - 0.5))
    mb["old_logp"] = torch.zeros(1, 2)  # r = 1.4 on both tokens, A = 1
    sel = select_tokens(algo, mb, knobs)
    assert sel.prepared["archer_high"].tolist() == [[False, True]]  # threshold 0.55
    loss, _ = micro_batch_loss(algo, knobs, mb, sel, logp, None)
    (grad,) = torch.autograd.grad(loss, logp)
    # low-entropy token clipped at 1.2 (no gradient), high-entropy one unclipped below 1.5 (gradient −r·A);
    # KL k1 = 0.5 per token, averaged over the one low-entropy token, weight 0.1; the surrogate token-mean over 2
    assert float(loss.detach()) == pytest.approx((-1.2 - 1.4) / 2 + 0.1 * 0.5 / 1, abs=1e-6)
    assert grad.tolist()[0] == pytest.approx([0.1 / 1, -1.4 / 2], abs=1e-6)


@pytest.mark.parametrize("kl_high, expected", [(0.0, 0.1 * 2.0 / 4), (0.2, 0.1 * 2.0 / 4 + 0.2 * 0.5 / 1)])
def test_archer_averages_each_groups_kl_over_its_own_tokens(kl_high, expected):
    """Entropies 1..5, quantile 0.8: threshold 4.2, only token 5 is high. k1 = 0.5 everywhere, A = 0:
    loss = 0.1 · mean_low(KL) + kl_high · mean_high(KL) (the authors' script), not a token-mean over all 5."""
    algo = AlgoConfig(archer={"quantile": 0.8, "eps": 0.5, "kl_high": kl_high}, kl_coef=0.1, kl_kind="k1")
    knobs = Knobs(0.2, 0.2, kl_coef=0.1)
    logp = torch.zeros(1, 5, requires_grad=True)
    mb = one_response(logp, entropy=torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]), ref_logp=torch.full((1, 5), -0.5))
    mb["token_advantages"] = torch.zeros(1, 5)
    sel = select_tokens(algo, mb, knobs)
    assert sel.prepared["archer_high"].tolist() == [[False] * 4 + [True]]
    loss, _ = micro_batch_loss(algo, knobs, mb, sel, logp, None)
    (grad,) = torch.autograd.grad(loss, logp)
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert grad.tolist()[0] == pytest.approx([0.1 / 4] * 4 + [kl_high / 1], abs=1e-6)


def test_archer_splits_over_every_response_token_even_those_a_correction_removed():
    algo = AlgoConfig(archer={"quantile": 0.8, "eps": 0.5, "kl_high": 0.0}, kl_coef=0.1, kl_kind="k1")
    logp = torch.zeros(1, 5, requires_grad=True)
    mb = one_response(logp, entropy=torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]]), ref_logp=torch.zeros(1, 5))
    mb["loss_mask"] = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)  # token 5 left the loss
    sel = select_tokens(algo, mb, Knobs(0.2, 0.2, kl_coef=0.1))
    # the threshold stays 4.2 (over all five), so no kept token is high; over the kept four it would be 3.4
    assert sel.prepared["archer_high"].tolist() == [[False] * 4 + [True]]
    assert int(sel.prepared["archer_n_high"]) == 0 and int(sel.prepared["archer_n_low"]) == 4


def test_the_archer_preset_keeps_the_authors_kl_clamp_and_dual_clip():
    from omegaconf import OmegaConf

    conf = OmegaConf.load(Path(__file__).resolve().parents[3] / "conf" / "algo" / "archer.yaml")
    assert (conf.kl_coef, conf.kl_clamp, conf.dual_clip) == (0.001, 10.0, 10.0)
    assert dict(conf.archer) == {"quantile": 0.8, "eps": 0.5, "kl_high": 0.0}


def test_simko_mixes_top_k_into_positive_high_entropy_tokens_and_penalises_negative_top1():
    logp = torch.log(torch.tensor([[0.3, 0.3, 0.6, 0.3]])).requires_grad_()
    old = logp.detach().clone()  # r = 1
    topk = torch.log(torch.tensor([[[0.6, 0.3]] * 4])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    is_top1 = torch.tensor([[False, False, True, False]])
    high = torch.tensor([[True, False, True, True]])
    logp_eff, adv_eff = em.simko_inputs(logp, old, adv, topk, is_top1, high, alpha=0.1, lam=1.1)
    assert torch.allclose(logp_eff, logp)  # the value is the sampled token's: the ratio is unchanged
    assert torch.equal(logp_eff[0, 1:], logp[0, 1:])
    assert adv_eff.tolist()[0] == pytest.approx([1.0, 1.0, -1.1, -1.0])  # λ on the high-entropy top-1 of a negative response
    g_logp, g_topk = torch.autograd.grad(logp_eff.sum(), (logp, topk))
    # d logp_eff = (1 − α)·∇log π + (α/K)·Σ_k ∇log π_k on the positive high-entropy token only
    assert g_logp.tolist()[0] == pytest.approx([0.9, 1.0, 1.0, 1.0], abs=1e-6)
    assert g_topk[0, 0].tolist() == pytest.approx([0.05, 0.05], abs=1e-6)
    assert g_topk[0, 1:].abs().sum() == 0


# ------------------------------------------------------------------------- the presets in the real update

PRESETS = {
    "gppo": {"loss": "gppo", "eps_high": 0.28},
    "ce_gppo": {"loss": "gppo", "eps_high": 0.28, "gppo_beta_low": 0.75},
    "erc": {"erc": {"low": 0.05, "high": 0.05}},
    "archer": {"archer": {"quantile": 0.8, "eps": 0.5, "kl_high": 0.0}},
    "simko": {"simko": {"k": 3, "alpha": 0.01, "lam": 1.1, "quantile": 0.8}},
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_method_learns_and_is_micro_batch_invariant(name):
    results = []
    for size in (10, 3):
        module = make_module(size, **PRESETS[name])
        mb = make_minibatch(module)
        mb["old_logp"] = torch.where(mb["response_mask"], mb["old_logp"] - 0.3 * mb["advantages"][:, None], 0.0)
        mb["entropy"] = mb["entropy"] * 1.04  # some tokens leave ERC's band
        results.append(step_gradient(module, mb))
    (loss, grads), (loss3, grads3) = results
    assert math.isfinite(loss) and sum(float(g.abs().sum()) for g in grads) > 0
    assert loss3 == pytest.approx(loss, abs=1e-6)
    for a, b in zip(grads, grads3, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"loss": "gspo", "archer": {}}, "algo.archer"),
    ({"selection": "kl_cov", "simko": {}}, "algo.simko"),
    ({"loss": "gppo", "selection": "kl_cov"}, "loss=gppo"),
    ({"archer": {"kl_high": 0.1}}, "kl_coef"),
    ({"erc": {"lo": 0.1}}, "algo.erc"),
])
def test_combinations_that_cannot_work_fail_at_start_up(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlgoConfig(**kwargs)
