"""Evaluation metrics: unbiased pass@k, mean@k and accuracy (torchmetrics, reduce across ranks)."""

from lit_entropy.metrics.passk import Accuracy, MeanAtK, PassAtK, pass_at_k

__all__ = ["Accuracy", "MeanAtK", "PassAtK", "pass_at_k"]
