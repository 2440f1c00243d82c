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

The engine's weights are bf16 parameters that change only when the trainer's are loaded into it, yet converting them
to fp32 at every call took about a quarter of the generation (a decode step reads each weight once, so the
conversion is most of its memory traffic). Without grad, outside autocast, a bf16 ``nn.Parameter`` that needs no
grad (how vLLM holds its weights) has its fp32 copy kept (:func:`fp32_weight`) until the parameter changes in place
(its version counter), dies, or vLLM reloads weights (:func:`forget_fp32_weights`, which the first such call hooks
into vLLM's ``Worker.reload_weights``: its loader writes through ``.data``, which no version counter sees). The copy is
``weight.float()``, bit for bit, so the results are exactly those without it. The engine's compiled graph reaches it
through a custom op (:data:`cached_linear`), opaque to the compiler, which would otherwise trace the conversion into
the graph; a weight that reaches the op as another tensor object than the parameter is converted as before.
"""

from __future__ import annotations

import json
import os
import sys
import weakref
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
        out = original_linear(x.float(), fp32_weight(weight), None if bias is None else bias.float())
    return out.to(torch.bfloat16)


keep_fp32_copies = True
"""Whether :func:`fp32_weight` keeps copies at all (off: every call converts, to compare the two)."""
_fp32_copies: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}
"""``id(parameter) -> (weak reference to it, its version, the reload count, its fp32 copy)``."""
_reloads = 0
"""How many times vLLM reloaded weights in this process (:func:`forget_fp32_weights`)."""
_RELOAD_HOOKED = False


def keeps_fp32_copy(weight: torch.Tensor) -> bool:
    """Whether :func:`fp32_weight` keeps ``weight``'s fp32 copy: a bf16 parameter that needs no grad (an engine's
    weight; a trained parameter changes at every step), used without grad."""
    return (isinstance(weight, torch.nn.Parameter) and weight.dtype == torch.bfloat16 and not weight.requires_grad
            and not torch.is_grad_enabled())


def fp32_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight.float()``; for a weight :func:`keeps_fp32_copy` takes, the copy made at its first use since it last
    changed (in place, by its version counter, or by a vLLM reload)."""
    if not (keep_fp32_copies and keeps_fp32_copy(weight)) or weight.is_inference():  # (no version counter)
        return weight.float()
    _hook_vllm_reload()
    key = id(weight)
    kept = _fp32_copies.get(key)
    if kept is not None and kept[0]() is weight and kept[1] == weight._version and kept[2] == _reloads:
        return kept[3]
    copy = weight.float()
    _fp32_copies[key] = (weakref.ref(weight, lambda ref, k=key: _forget(k, ref)), weight._version, _reloads, copy)
    return copy


def _forget(key: int, ref: weakref.ref) -> None:
    if key in _fp32_copies and _fp32_copies[key][0] is ref:
        del _fp32_copies[key]


def forget_fp32_weights() -> None:
    """Drop every kept fp32 copy: the weights changed where no version counter sees it (vLLM's reload)."""
    global _reloads
    _reloads += 1
    _fp32_copies.clear()


def _hook_vllm_reload() -> None:
    """Have vLLM's ``Worker.reload_weights`` (how an engine is given new weights) call :func:`forget_fp32_weights`
    after it, once vLLM's worker module is imported (it is before any engine computes with its weights)."""
    global _RELOAD_HOOKED
    if _RELOAD_HOOKED:
        return
    module = sys.modules.get("vllm.v1.worker.gpu_worker")
    if module is None:
        return
    worker = module.Worker
    reload = worker.reload_weights

    def reload_weights(self, *args, **kwargs):
        try:
            return reload(self, *args, **kwargs)
        finally:
            forget_fp32_weights()

    worker.reload_weights = reload_weights
    _RELOAD_HOOKED = True


@torch.library.custom_op("lit_entropy_bf16_via_fp32::linear", mutates_args=())
def cached_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`_fp32_gemm` as an op a compiled graph calls as it is (keeping :func:`fp32_weight`'s copies)."""
    return _fp32_gemm(x, weight, bias)


@cached_linear.register_fake
def _(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]), dtype=torch.bfloat16)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` with a bf16 result computed by the fp32 kernel on bf16-rounded operands (see the module)."""
    if not wants_bf16(x, weight):
        return original_linear(x, weight, bias)
    bf16 = torch.bfloat16
    x, weight, bias = x.to(bf16), weight.to(bf16), None if bias is None else bias.to(bf16)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return _Bf16Linear.apply(x, weight, bias)
    if keeps_fp32_copy(weight):  # (`weight.to(bf16)` of a bf16 tensor is the tensor itself)
        return cached_linear(x, weight, bias)
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


def installed() -> bool:
    """Whether this process's ``torch.nn.functional.linear`` is :func:`linear`: this module's, or a copy of the module
    that a study environment's ``.pth`` loaded under another name."""
    return getattr(F.linear, "__module__", "").rpartition(".")[2] == "bf16_via_fp32"


def ran_with_it(folder: str | Path) -> bool:
    """Whether the run in ``folder`` ran (in part, if resumed) with :func:`linear` installed: its logs hold
    :data:`MARKER`, or, for a run imported from a records file, its ``done.json`` says so."""
    folder = Path(folder)
    done = folder / "done.json"
    if done.is_file() and json.loads(done.read_text()).get("bf16_via_fp32"):
        return True
    return any(MARKER in (folder / name).read_text(errors="replace") for name in RUN_LOGS if (folder / name).is_file())
