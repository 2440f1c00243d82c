"""Training precision: the FP16 plugin with a real loss scaler on CPU and GPU, and the vLLM dtype it implies.

Lightning's ``Trainer(precision="16-mixed")`` on CPU silently becomes bf16 (no loss scaler), so
``precision=fp16`` builds the plugin explicitly: ``torch.autocast`` in float16 plus
``torch.amp.GradScaler`` (dynamic loss scaling: a step whose gradients overflow is skipped and the
scale halved). Log-probs, entropy, ratios and losses stay fp32 in every mode (the loss functions cast).
"""

from __future__ import annotations

import torch
from lightning.pytorch.plugins.precision import MixedPrecision

ENGINE_DTYPE = {
    "32-true": "float32", "32": "float32", "64-true": "float64",
    "bf16-mixed": "bfloat16", "bf16-true": "bfloat16",
    "16-mixed": "float16", "16-true": "float16",
}
"""The rollout engine dtype that samples from the distribution the trainer computes in."""


def fp16_mixed(accelerator: str = "cpu", init_scale: float = 2.0**16, growth_interval: int = 2000) -> MixedPrecision:
    """FP16 autocast with dynamic loss scaling on ``accelerator`` (``cpu``, or ``gpu``/``cuda``)."""
    device = "cuda" if accelerator in ("gpu", "cuda") else str(accelerator)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"precision=fp16 supports trainer.accelerator cpu or gpu, got {accelerator!r}")
    scaler = torch.amp.GradScaler(device, init_scale=init_scale, growth_interval=growth_interval)
    return MixedPrecision("16-mixed", device=device, scaler=scaler)


def engine_dtype_for(trainer_precision: str | None) -> str | None:
    """The engine dtype that matches ``Trainer.precision`` (None when unknown)."""
    return ENGINE_DTYPE.get(str(trainer_precision)) if trainer_precision is not None else None
