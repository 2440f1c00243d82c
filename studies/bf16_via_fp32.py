"""bf16 linear layers through fp32 kernels, for a study's bf16 runs on a CPU without bf16 units.

On an x86 CPU with neither AVX512-BF16 nor AMX (AVX2 only), PyTorch has no fast bf16 GEMM: a bf16 ``F.linear``
at SmolLM2's shapes ran 6.5× slower than fp32 and a bf16-autocast forward and backward of the model 11.5× slower
(165 s against 14 s for 4 × 160 tokens, one core; docs/real_lm_study.md), so the real-LM study's bf16 cells cannot
run there. The bf16 kernels of the faster CPUs take bf16 operands, multiply and accumulate in fp32 and round the
output to bf16; :func:`linear` computes the same thing with fp32 kernels: it rounds the operands to bf16, runs the
fp32 GEMM on them (their products are exact in fp32) and rounds the output to bf16. Only the order of the fp32
accumulation differs from any bf16 kernel, as it differs between any two of them. The backward follows from autograd
through the same casts: gradients are rounded to bf16 where the native kernels round them.

It applies where bf16 is wanted on the CPU: inside a CPU autocast in bf16 (how ``precision=bf16`` trains) or when
both operands are bf16 tensors; everything else (fp32, fp16, other devices) goes to the original ``F.linear``
untouched. :func:`install` replaces ``torch.nn.functional.linear`` in the process (``nn.Linear`` looks it up
at each call); :func:`install_from_env` does so only when ``LIT_ENTROPY_BF16_VIA_FP32=1``, which a study's
environment calls at interpreter start-up from a ``.pth`` file, so that the pinned code of its runs is unchanged.
This module imports nothing from lit-entropy for that reason. vLLM's CPU engine (in the run's process) computes its
linear layers with oneDNN, which has no bf16 matmul on such a CPU ("could not create a primitive descriptor"), so
it falls back to ``torch.nn.functional.linear`` on bf16 tensors: the engine's bf16 layers come here too, once
vLLM compiles its graph afresh (a graph from its compile cache keeps the native GEMMs: give such runs a cache of
their own, ``VLLM_CACHE_ROOT``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

ENV_VAR = "LIT_ENTROPY_BF16_VIA_FP32"
"""Set to ``1`` to have :func:`install_from_env` install :func:`linear`."""

MARKER = f"[{ENV_VAR}=1]"
"""The line's start :func:`install_from_env` writes to stderr: a run folder's logs that hold it ran with it."""

RUN_LOGS = ("study_stdout.log", "train.log")
"""The files of a study run folder :func:`ran_with_it` reads (the launcher's capture of stdout and stderr)."""

original_linear = F.linear
"""``torch.nn.functional.linear`` as PyTorch defines it, for everything :func:`linear` does not take."""


def wants_bf16(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``F.linear(x, weight)`` would run a bf16 GEMM on the CPU: under a bf16 CPU autocast, or on two
    bf16 tensors outside any CPU autocast."""
    if x.device.type != "cpu":
        return False
    if torch.is_autocast_enabled("cpu"):
        return torch.get_autocast_dtype("cpu") == torch.bfloat16
    return x.dtype == torch.bfloat16 and weight.dtype == torch.bfloat16


class _Bf16Linear(torch.autograd.Function):
    """The linear layer on bf16 operands, forward and backward by fp32 GEMMs with bf16 results, autocast off.

    The backward is written out because the trainer calls ``backward`` inside its autocast, which would run the
    fp32 GEMMs of an fp32 linear's backward as (slow) bf16 ones again; computed here, each gradient is what the
    native bf16 backward gives: bf16 operands, fp32 sums, a bf16 result."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _fp32_gemm(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        bf16 = torch.bfloat16
        with torch.autocast("cpu", enabled=False):
            g = grad.to(bf16).float().reshape(-1, weight.shape[0])
            gx = (g @ weight.float()).to(bf16).reshape(x.shape) if ctx.needs_input_grad[0] else None
            gw = (g.T @ x.float().reshape(-1, weight.shape[1])).to(bf16) if ctx.needs_input_grad[1] else None
            gb = g.sum(0).to(bf16) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _fp32_gemm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    with torch.autocast("cpu", enabled=False):
        out = original_linear(x.float(), weight.float(), None if bias is None else bias.float())
    return out.to(torch.bfloat16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with a bf16 result computed by the fp32 kernel on bf16-rounded operands (see the module)."""
    if not wants_bf16(x, weight):
        return original_linear(x, weight, bias)
    bf16 = torch.bfloat16
    x, weight, bias = x.to(bf16), weight.to(bf16), None if bias is None else bias.to(bf16)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _Bf16Linear.apply(x, weight, bias)
    return _fp32_gemm(x, weight, bias)


def install() -> None:
    """Route every ``torch.nn.functional.linear`` of this process through :func:`linear`."""
    F.linear = linear


def uninstall() -> None:
    """Give ``torch.nn.functional.linear`` back its original."""
    F.linear = original_linear


def install_from_env() -> bool:
    """:func:`install` when ``LIT_ENTROPY_BF16_VIA_FP32=1`` (saying so on stderr, which a study run's log keeps);
    whether it did."""
    if os.environ.get(ENV_VAR) != "1":
        return False
    install()
    print(f"{MARKER} bf16 linear layers on the CPU run as fp32 GEMMs on bf16-rounded operands "
          "(studies/bf16_via_fp32.py)", file=sys.stderr)
    return True


def ran_with_it(folder: str | Path) -> bool:
    """Whether the run in ``folder`` ran (in part, if resumed) with :func:`linear` installed: its logs hold
    :data:`MARKER`, or, for a run imported from a records file, its ``done.json`` says so."""
    folder = Path(folder)
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()).get("bf16_via_fp32"):
        return True
    return any(MARKER in (folder / name).read_text(errors="replace") for name in RUN_LOGS if (folder / name).is_file())
