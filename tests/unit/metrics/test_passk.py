"""pass@k: the unbiased estimator against brute force; the Metrics reduce by summing across ranks."""

from __future__ import annotations

import math
from itertools import combinations

import pytest
import torch
from torchmetrics.utilities.data import dim_zero_sum

from lit_entropy.metrics import Accuracy, MeanAtK, PassAtK, pass_at_k


def brute_force(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c of them correct) that contain a correct one."""
    correct = [i < c for i in range(n)]
    subsets = list(combinations(range(n), k))
    return sum(any(correct[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_matches_enumeration_of_subsets(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_force(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_closed_form_and_edge_cases():
    for n, c, k in [(100, 3, 10), (200, 50, 16), (64, 1, 1), (16, 0, 16), (16, 16, 1)]:
        exact = 1 - math.comb(n - c, k) / math.comb(n, k)
        assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12, abs=1e-15)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 3, 3) == 1.0  # n - c < k: surely passes
    assert pass_at_k(7, 2, 1) == pytest.approx(2 / 7)  # pass@1 = c/n
    # large n: the product form stays accurate where binomials would overflow floats
    assert pass_at_k(5000, 1, 1) == pytest.approx(1 / 5000, rel=1e-12)
    assert pass_at_k(5000, 1, 2500) == pytest.approx(0.5, rel=1e-12)
    assert 0.0 < pass_at_k(10**5, 1, 3) < 1.0


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_metrics_values():
    ns = torch.tensor([4, 4, 8, 2])
    cs = torch.tensor([0, 1, 8, 1])
    m = PassAtK(2)
    m.update(ns, cs)
    assert float(m.compute()) == pytest.approx(sum(brute_force(int(n), int(c), 2) for n, c in zip(ns, cs, strict=True)) / 4)
    mean = MeanAtK(2)
    mean.update(ns, cs)
    assert float(mean.compute()) == pytest.approx((0 + 0.25 + 1 + 0.5) / 4)
    acc = Accuracy()
    acc.update(ns, cs)
    assert float(acc.compute()) == pytest.approx(10 / 18)  # over samples, not problems
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(float(PassAtK(1).compute()))  # nothing seen yet
    with pytest.raises(ValueError, match="k"):
        PassAtK(4).update(torch.tensor([2]), torch.tensor([1]))  # fewer samples than k
    with pytest.raises(ValueError):
        MeanAtK(0)
    with pytest.raises(ValueError):
        Accuracy().update(torch.tensor([2]), torch.tensor([3]))
    with pytest.raises(ValueError, match="differ"):
        Accuracy().update(torch.tensor([2, 2]), torch.tensor([1]))


@pytest.mark.parametrize("make", [lambda: PassAtK(3), lambda: MeanAtK(3), Accuracy])
def test_two_ranks_sum_their_states(make):
    gen = torch.Generator().manual_seed(0)
    ns = torch.randint(3, 12, (40,), generator=gen)
    cs = (torch.rand(40, generator=gen) * (ns + 1)).long().clamp(max=ns)
    whole = make()
    whole.update(ns, cs)
    rank0, rank1 = make(), make()
    rank0.update(ns[:25], cs[:25])
    rank1.update(ns[25:], cs[25:])
    rank0.compute()  # a cached result must not survive the merge
    # every state is reduced with a sum, so what torch.distributed would gather-and-reduce
    assert all(fx is dim_zero_sum for fx in rank0._reductions.values())
    summed = {name: getattr(rank0, name) + getattr(rank1, name) for name in rank0._defaults}
    rank0.merge_state(rank1)
    assert float(rank0.compute()) == pytest.approx(float(whole.compute()), abs=1e-12)
    for name, value in summed.items():
        assert torch.equal(getattr(rank0, name), value)
    fresh = make()
    fresh.merge_state({name: getattr(whole, name) for name in whole._defaults})  # a state dict works too
    assert float(fresh.compute()) == pytest.approx(float(whole.compute()), abs=1e-12)
