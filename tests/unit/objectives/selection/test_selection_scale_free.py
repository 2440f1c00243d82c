"""Clip-Cov / KL-Cov settings that mean the same at any batch size: minimum and expected counts, and Clip-Cov's
bounds as quantiles of the covariance term (lit_entropy/objectives/selection/clip_cov.py, kl_cov.py), checked on hand-computed cases
and at start-up through the real config."""

from __future__ import annotations

import pytest
import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives.selection.clip_cov import clip_cov
from lit_entropy.objectives.selection.kl_cov import kl_cov
from lit_entropy.objectives.selection.tokens import selection_count
from tests.helpers import compose_train

T, F = True, False
OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]


def _b(rows):
    return torch.tensor(rows, dtype=torch.bool)


# The 2 x 3 minibatch of test_selection.py (last column padding). N = 4 response tokens,
#   c = [2.5, -1.5 | -2.5, 3.5]; sorted [-2.5, -1.5, 2.5, 3.5].
# torch.quantile (linear, position q*(N-1)): q(0.5) = 0.5, q(0.75) = 2.75, q(1) = 3.5.
MASK = _b([[T, T, F], [T, T, F]])
ADV = torch.tensor([[2.0, 2.0, 1e6], [-2.0, -2.0, float("nan")]])
LOGP = torch.tensor([[-1.0, -3.0, 1e6], [-1.0, -4.0, -float("inf")]])
TOP_TWO, TOP_ONE = _b([[T, F, F], [F, T, F]]), _b([[F, F, F], [F, T, F]])


def test_paper_count_is_the_default_and_min_count_raises_or_removes_the_floor():
    assert selection_count(2e-4, 500) == 1  # the paper's max(1, floor(rho*N)) on a lab step of 500 tokens
    assert selection_count(2e-4, 500, min_count=0) == 0
    assert selection_count(2e-4, 500, min_count=8) == 8
    assert selection_count(0.03, 500, min_count=8) == 15  # floor(15) above the minimum
    assert selection_count(0.29, 100) == 29  # decimal arithmetic: 0.29 * 100 is 28.999... in floats
    assert selection_count(0.5, 0, min_count=3) == 0  # no tokens, nothing to pick


def test_stochastic_rounding_has_the_expected_count_at_any_batch_size():
    assert selection_count(0.3, 10, 0, "stochastic") == 3  # an integer product: no draw
    gen = torch.Generator().manual_seed(0)
    draws = [selection_count(0.1, 4, 0, "stochastic", gen) for _ in range(4000)]  # rho*N = 0.4
    assert set(draws) == {0, 1}
    assert sum(draws) / len(draws) == pytest.approx(0.4, abs=0.03)
    draws = [selection_count(0.0025, 1000, 0, "stochastic", gen) for _ in range(4000)]  # 2.5: 2 or 3
    assert set(draws) == {2, 3} and sum(draws) / len(draws) == pytest.approx(2.5, abs=0.04)


def test_clip_cov_min_count():
    # rho = 0.1: floor(0.4) = 0 -> min_count tokens of the two candidates (c = 2.5, 3.5)
    m, _ = clip_cov(LOGP, ADV, MASK, None, rho=0.1, min_count=0)
    assert not m.any()
    m, frac = clip_cov(LOGP, ADV, MASK, None, rho=0.1, min_count=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(m, TOP_TWO) and frac.item() == 0.5
    m, _ = clip_cov(LOGP, ADV, MASK, None, rho=0.1, min_count=3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(m, TOP_TWO)  # never more than the candidates


def test_clip_cov_quantile_bounds_by_hand():
    pick_all = {"rho": 1.0, "bounds": "quantile", "generator": torch.Generator().manual_seed(0)}
    m, _ = clip_cov(LOGP, ADV, MASK, None, bound_low=0.5, bound_high=1.0, **pick_all)  # 0.5 < c <= 3.5
    assert torch.equal(m, TOP_TWO)
    m, _ = clip_cov(LOGP, ADV, MASK, None, bound_low=0.75, bound_high=1.0, **pick_all)  # 2.75 < c <= 3.5
    assert torch.equal(m, TOP_ONE)
    m, _ = clip_cov(LOGP, ADV, MASK, None, bound_low=0.0, bound_high=0.75, **pick_all)  # -2.5 < c <= 2.75
    assert torch.equal(m, _b([[T, T, F], [F, F, F]]))


def test_quantile_bounds_are_scale_free_and_absolute_bounds_are_not():
    """Ten times the advantages: c is ten times larger. The absolute (1, 5) range then holds no token; the
    quantile range picks the same tokens as before."""
    big = ADV * 10
    m, _ = clip_cov(LOGP, big, MASK, None, rho=1.0)
    assert not m.any()
    for adv in (ADV, big):
        m, _ = clip_cov(LOGP, adv, MASK, None, rho=1.0, bounds="quantile", bound_low=0.5, bound_high=1.0,
                        generator=torch.Generator().manual_seed(0))
        assert torch.equal(m, TOP_TWO)


def test_kl_cov_min_count():
    # k = 0.1: floor(0.4) = 0; c ranks (1,1) 3.5 > (0,0) 2.5 > (0,1) -1.5 > (1,0) -2.5
    assert torch.equal(kl_cov(LOGP, ADV, MASK, k=0.1)[0], TOP_ONE)  # the default: at least one
    assert not kl_cov(LOGP, ADV, MASK, k=0.1, min_count=0)[0].any()
    m, frac = kl_cov(LOGP, ADV, MASK, k=0.1, min_count=3)
    assert torch.equal(m, _b([[T, T, F], [F, T, F]])) and frac.item() == 0.75
    assert kl_cov(LOGP, ADV, MASK, k=0.1, min_count=10)[0].sum().item() == 4  # capped at N
    assert not kl_cov(LOGP, ADV, MASK, k=0.0, min_count=3)[0].any()  # k = 0 selects none


@pytest.mark.parametrize("args,key", [
    ({"bounds": "quantile"}, "bound_low"),  # the absolute defaults 1 and 5 are not quantiles
    ({"bounds": "quantile", "bound_low": 0.9, "bound_high": 0.5}, "bound_low"),
    ({"bounds": "relative"}, "bounds"),
    ({"rounding": "nearest"}, "rounding"),
    ({"min_count": -1}, "min_count"),
    ({"min_count": 1.5}, "min_count"),
    ({"bound_low": 5.0, "bound_high": 1.0}, "bound_low"),
])
def test_bad_clip_cov_values_fail_at_start_up_by_name(args: dict, key: str) -> None:
    with pytest.raises(ValueError, match=f"algo.selection_args.{key}"):
        AlgoConfig(selection="clip_cov", selection_args={"rho": 1e-2, **args})
    with pytest.raises(ValueError, match="algo.selection_args.min_count"):
        AlgoConfig(selection="kl_cov", selection_args={"k": 1e-2, "min_count": -2})


def test_the_presets_keep_the_papers_values_and_take_the_new_keys_from_the_command_line() -> None:
    cfg = compose_train(["algo=clip_cov", *OUT])
    args = cfg.algo.selection_args
    assert (args.rho, args.bound_low, args.bound_high, args.bounds, args.min_count, args.rounding) == \
        (2e-4, 1.0, 5.0, "absolute", 1, "floor")
    assert compose_train(["algo=kl_cov", *OUT]).algo.selection_args.min_count == 1
    cfg = compose_train(["algo=clip_cov", "algo.selection_args.bounds=quantile", "algo.selection_args.bound_low=0.9",
                         "algo.selection_args.bound_high=1.0", "algo.selection_args.rounding=stochastic",
                         "algo.selection_args.min_count=0", *OUT])
    assert instantiate(cfg.algo).selection_args["bounds"] == "quantile"
    cfg = compose_train(["algo=clip_cov", "algo.selection_args.bounds=quantile", *OUT])
    with pytest.raises(InstantiationException, match="bound_low"):
        instantiate(cfg.algo)
