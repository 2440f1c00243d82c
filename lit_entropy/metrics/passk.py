"""pass@k and mean@k (docs/design.md §7.7): the unbiased estimators, and torchmetrics `Metric`s summed
across ranks.

For a problem with ``n`` sampled answers of which ``c`` are correct:

* pass@k = 1 − C(n−c, k) / C(n, k): the probability that at least one of k answers drawn without
  replacement from the n is correct (Chen et al. 2021). Computed as the product
  1 − ∏_{i=n−c+1}^{n} (1 − k/i), which never forms a binomial coefficient (no overflow, no cancellation).
* mean@k = c / n: the expected accuracy of k samples (the fraction correct among them).
* accuracy = Σc / Σn over all samples of all problems.

The metrics keep sums (and counts) as states with ``dist_reduce_fx="sum"``, so on several ranks each
rank updates with its own problems and ``compute()`` gives the value over all of them.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["Accuracy", "MeanAtK", "PassAtK", "pass_at_k"]


def _check(n: int, c: int, k: int) -> None:
    if not (0 <= c <= n):
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not (1 <= k <= n):
        raise ValueError(f"pass@k needs 1 <= k <= n (samples), got n={n}, k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k)/C(n, k), in product form."""
    n, c, k = int(n), int(c), int(k)
    _check(n, c, k)
    if n - c < k:
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def _as_counts(num_samples: Tensor, num_correct: Tensor) -> tuple[list[int], list[int]]:
    num_samples = torch.as_tensor(num_samples).reshape(-1)
    num_correct = torch.as_tensor(num_correct).reshape(-1)
    if num_samples.shape != num_correct.shape:
        raise ValueError(f"num_samples {tuple(num_samples.shape)} and num_correct {tuple(num_correct.shape)} differ")
    return [int(x) for x in num_samples.tolist()], [int(x) for x in num_correct.tolist()]


class _SummedMetric(Metric):
    """States are sums: ranks (or shards) merge by adding them."""

    full_state_update = False
    higher_is_better = True
    is_differentiable = False

    def merge_state(self, incoming_state) -> None:
        """Add another metric's (or a state dict's) sums to this one's."""
        super().merge_state(incoming_state)
        self._computed = None  # torchmetrics keeps a cached compute() result across merges
        self._update_count += 1  # merged-in data counts as an update (no "compute before update" warning)


class _PerProblemMean(_SummedMetric):
    """Mean over problems of a per-problem score; states: the score sum and the problem count."""

    def __init__(self, k: int, **kwargs) -> None:
        super().__init__(**kwargs)
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an int >= 1, got {k!r}")
        self.k = k
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _score(self, n: int, c: int) -> float:
        raise NotImplementedError

    def update(self, num_samples: Tensor, num_correct: Tensor) -> None:
        """``num_samples[p]`` answers were sampled for problem p, ``num_correct[p]`` of them correct."""
        ns, cs = _as_counts(num_samples, num_correct)
        for n, c in zip(ns, cs, strict=True):
            _check(n, c, self.k)
        self.total += sum(self._score(n, c) for n, c in zip(ns, cs, strict=True))
        self.count += len(ns)

    def compute(self) -> Tensor:
        if int(self.count) == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.total / self.count


class PassAtK(_PerProblemMean):
    """Mean over problems of the unbiased pass@k (`pass_at_k`); every problem needs >= k samples."""

    def _score(self, n: int, c: int) -> float:
        return pass_at_k(n, c, self.k)


class MeanAtK(_PerProblemMean):
    """mean@k: the expected accuracy of k samples, c/n averaged over problems (needs >= k samples)."""

    def _score(self, n: int, c: int) -> float:
        return c / n


class Accuracy(_SummedMetric):
    """Fraction of all sampled answers that are correct: Σ num_correct / Σ num_samples."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("correct", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("samples", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, num_samples: Tensor, num_correct: Tensor) -> None:
        ns, cs = _as_counts(num_samples, num_correct)
        for n, c in zip(ns, cs, strict=True):
            if not 0 <= c <= n:
                raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
        self.correct += sum(cs)
        self.samples += sum(ns)

    def compute(self) -> Tensor:
        if int(self.samples) == 0:
            return torch.tensor(float("nan"), dtype=torch.float64)
        return self.correct.double() / self.samples.double()
