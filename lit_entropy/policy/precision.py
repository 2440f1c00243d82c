"""Training precision: the FP16 plugin with a real loss scaler on CPU and GPU, and the vLLM dtype it implies.

Lightning's ``Trainer(precision="16-mixed")`` on CPU silently becomes bf16 (no loss scaler), so
``precision=fp16`` builds the plugin explicitly: ``torch.autocast`` in float16 plus
``torch.amp.GradScaler`` (dynamic loss scaling: a step whose gradients overflow is skipped and the
scale halved). Log-probs, entropy, ratios and losses stay fp32 in every mode (the loss functions cast).
"""

from __future__ import annotations

import platform

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


HALF_DTYPES = {"bfloat16": "bf16", "float16": "fp16"}
"""The half-precision dtypes, by their short name in the precision group."""


def cpu_half_support() -> dict[str, bool]:
    """What torch reports of this CPU: ``x86``, and ``half_units`` when it has AMX tiles or AVX512-BF16, the units
    that make bf16 matmuls fast (on an AVX512-BF16 machine vLLM generated in fp32 at 0.64x its bf16 speed)."""
    def flag(name: str) -> bool:
        probe = getattr(torch.cpu, name, None)
        return bool(probe()) if callable(probe) else False

    return {"x86": platform.machine().lower() in ("x86_64", "amd64"),
            "half_units": flag("_is_amx_tile_supported") or flag("_is_avx512_bf16_supported")}


def slow_half_precision_note(trainer_precision: str | None, engine_dtype: str | None, on_cpu: bool,
                             support: dict[str, bool]) -> str | None:
    """A warning for half precision (trainer or rollout engine) on an x86 CPU without AMX or AVX512-BF16, where
    torch falls back to slow generic kernels: on an AVX2-only AMD EPYC one core ran a 576x576 by 576x1536 matmul
    at 44 GFLOP/s in fp32 and 1.2 (bf16) or 1.3 (fp16) in half precision, and the first iteration of
    ``experiment=real_lm`` took over 20 minutes instead of about one. None where nothing is half, off the CPU, on another
    architecture (not measured) or where the units are there."""
    half = sorted({HALF_DTYPES.get(str(engine_dtype_for(trainer_precision))), HALF_DTYPES.get(str(engine_dtype))} - {None})
    if not half or not on_cpu or not support.get("x86") or support.get("half_units"):
        return None
    return (f"{' and '.join(half)} on a CPU without AMX or AVX512-BF16 (torch reports "
            f"{torch.backends.cpu.get_cpu_capability()}): its half-precision matmuls run 30-50x slower than fp32 "
            "here; precision=fp32 is the fast choice on this machine")
