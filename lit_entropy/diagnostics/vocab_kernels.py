"""The vocabulary-wide work of a pass on one chunk of logits, as functions ``torch.compile`` fuses.

Every pass turns logits ``[n, V]`` into fp32 per-token statistics. Written as eager torch ops, each step
(cast to fp32, divide by T, ``log_softmax``, ``exp``, multiply, sum, ...) reads and writes an ``n × V`` fp32
temporary: at SmolLM2's 49,152 columns that was a third of the update's time on the CPU
(docs/results.md, "The vocabulary-wide work"). Compiled by inductor, each function below becomes one or two
vectorised loops over each row and its fp32 temporaries never reach memory: 8× faster forward, 6× faster
backward for 2,048 rows of 49k bf16 logits here.

The functions, each on a chunk (``rows`` [n, V] in the logits' dtype, ``T`` the temperature, with
``z = rows / T`` in fp32, ``log p = z − lse``, ``p = e^{log p}``):

* :func:`lse_entropy` → ``lse = logsumexp(z)`` and ``H = −Σ_v p_v log p_v`` [n] (its sums accumulated in fp64);
* :func:`baseline` → the discriminator's ``N = Σ_v p_v²·(H + log p_v)`` [n];
* :func:`logits_grad` → ``∂(Σ g_logp·log p_t + g_ent·H)/∂rows`` [n, V] in ``rows``' dtype:
  ``(−p_v·(g_logp + g_ent·(log p_v + H)) + g_logp·1[v = t]) / T``.

``log p`` of the targets is ``z_t − lse``, computed by :func:`target_logprobs` (eager: ``n`` values), so every
pass that takes ``lse`` from :func:`lse_entropy` gets the same log-probs bit for bit (the pre-update pass and
the update: the first PPO ratio is exactly 1). Terms with ``p_v = 0`` (a ``−inf`` logit of the sampler's
truncation) contribute 0, never NaN.

:func:`call` runs a function compiled, or eagerly where the mode says so or compilation failed (logged once;
the eager values are the same formulas). Modes (``module.vocab_kernels``): ``compiled``, ``eager``, and
``auto``: compiled on the CPU for vocabularies of :data:`AUTO_MIN_VOCAB` columns or more, where it pays (the
lab's 16-token vocabulary and the test models stay eager, and nothing compiles there).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

log = logging.getLogger(__name__)

MODES = ("auto", "compiled", "eager")
AUTO_MIN_VOCAB = 16384
"""``auto`` compiles from this many columns on (the real models' 32k–256k vocabularies)."""

_compiled: dict[Callable, Callable] = {}
_failure: str | None = None


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"vocab_kernels must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def compiles(mode: str, logits: Tensor) -> bool:
    """Whether ``mode`` runs the compiled kernels on ``logits`` [..., V]."""
    check_mode(mode)
    if mode == "auto":
        return logits.device.type == "cpu" and logits.shape[-1] >= AUTO_MIN_VOCAB and _failure is None
    return mode == "compiled" and _failure is None


def call(fn: Callable, compiled: bool, *args):
    """``fn(*args)``, through ``torch.compile`` when ``compiled`` (eager, with one warning, where that fails)."""
    global _failure
    if compiled and _failure is None:
        for a in args:
            if isinstance(a, Tensor) and a.dim() >= 1 and a.shape[0] > 1:
                torch._dynamo.maybe_mark_dynamic(a, 0)  # one graph for every chunk size
        if fn not in _compiled:
            _compiled[fn] = torch.compile(fn)
        try:
            return _compiled[fn](*args)
        except Exception as err:  # a missing C++ compiler, an unsupported backend: the eager ops are the same rule
            _failure = f"{type(err).__name__}: {err}"
            log.warning("Compiled vocabulary kernels unavailable (%s); the passes run them eagerly", _failure)
    return fn(*args)


def failure() -> str | None:
    """Why compilation failed in this process (None: it did not)."""
    return _failure


def _scaled(rows: Tensor, temperature: float) -> Tensor:
    z = rows.float()
    return z if temperature == 1.0 else z / temperature


def lse_entropy(rows: Tensor, temperature: float) -> tuple[Tensor, Tensor]:
    """``(logsumexp(z), H)`` [n] of ``z = rows / T`` (fp32 results).

    With ``m = max z``, ``y = z − m``, ``S = Σ e^y``: ``lse = m + log S`` and ``H = log S − Σ e^y·y / S``. The terms
    are fp32; the two sums over the vocabulary accumulate in fp64. Summed in fp32 (as ``logsumexp`` and
    ``−Σ p log p`` are, and inductor's loop sums one vector lane at a time), 49k–152k terms lose up to 2e-5 of
    ``lse`` and of ``H`` against an fp64 reference; accumulated in fp64 both stay within 1e-6 (the fp32 rounding of
    the result), at no cost in time here (tests/unit/diagnostics/test_vocab_kernels.py, docs/results.md).
    """
    z = _scaled(rows, temperature)
    m = z.amax(dim=-1, keepdim=True)
    y = z - m
    e = y.exp()
    total = e.double().sum(-1)
    weighted = torch.where(e > 0, e * y, 0.0).double().sum(-1)
    log_total = total.log()
    return (m.squeeze(-1).double() + log_total).float(), (log_total - weighted / total).float()


def baseline(rows: Tensor, lse: Tensor, entropy: Tensor, temperature: float) -> Tensor:
    """The discriminator's on-policy baseline ``N = Σ_v p_v²·(H + log p_v)`` [n]."""
    log_p = _scaled(rows, temperature) - lse[:, None]
    p = log_p.exp()
    return torch.where(p > 0, p * p * (entropy[:, None] + log_p), 0.0).sum(-1)


def logits_grad(rows: Tensor, targets: Tensor, lse: Tensor, entropy: Tensor, g_logp: Tensor, g_ent: Tensor,
                temperature: float) -> Tensor:
    """The gradient [n, V] (``rows``' dtype) of ``Σ g_logp·log p_target + g_ent·H`` with respect to ``rows``."""
    log_p = _scaled(rows, temperature) - lse[:, None]
    p = log_p.exp()
    g = torch.where(p > 0, -p * (g_logp[:, None] + g_ent[:, None] * (log_p + entropy[:, None])), 0.0)
    columns = torch.arange(rows.shape[-1], device=rows.device)[None]
    g = g + torch.where(columns == targets[:, None], g_logp[:, None], 0.0)
    return (g if temperature == 1.0 else g / temperature).to(rows.dtype)


def target_logprobs(rows: Tensor, targets: Tensor, lse: Tensor, temperature: float) -> Tensor:
    """``log p`` [n] of ``targets`` from the chunk's ``lse``."""
    return _scaled(rows.gather(-1, targets[:, None]).squeeze(-1), temperature) - lse
