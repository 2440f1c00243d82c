import os
import subprocess
import sys
import textwrap

import pytest
import torch

from lit_entropy.diagnostics.entropy import (
    align_to_input,
    naive_logprobs_and_entropy,
    shift_for_causal_lm,
    token_logprobs_and_entropy,
)

VOCAB = 5000


def _inputs(batch=3, length=37, vocab=VOCAB, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(batch, length, vocab, generator=gen) * 4).to(dtype)
    targets = torch.randint(0, vocab, (batch, length), generator=gen)
    return logits, targets


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.6, 1.0, 1.3])
@pytest.mark.parametrize("chunk_size", [1, 16, 37, 111, 1024])
def test_chunked_matches_naive(dtype, temperature, chunk_size):
    logits, targets = _inputs(dtype=dtype)  # 111 rows: 16 does not divide them, 37 and 111 do
    logp, ent = token_logprobs_and_entropy(logits, targets, temperature, chunk_size=chunk_size)
    ref_logp, ref_ent = naive_logprobs_and_entropy(logits.float(), targets, temperature)
    assert logp.dtype == ent.dtype == torch.float32
    assert logp.shape == ent.shape == targets.shape
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=0)
    # the naive reference on the raw bf16 input casts to fp32 itself
    torch.testing.assert_close(naive_logprobs_and_entropy(logits, targets, temperature)[1], ref_ent)


def test_entropy_known_values():
    logits = torch.zeros(1, 2, 8)
    logits[0, 1, 3] = 1e4  # one-hot
    logp, ent = token_logprobs_and_entropy(logits, torch.tensor([[5, 3]]), chunk_size=1)
    torch.testing.assert_close(ent, torch.tensor([[torch.log(torch.tensor(8.0)).item(), 0.0]]))
    torch.testing.assert_close(logp, torch.tensor([[-torch.log(torch.tensor(8.0)).item(), 0.0]]))


def test_without_entropy():
    logits, targets = _inputs(batch=2, length=5, vocab=50)
    logp, ent = token_logprobs_and_entropy(logits, targets, with_entropy=False)
    assert ent is None
    torch.testing.assert_close(logp, naive_logprobs_and_entropy(logits, targets)[0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_gradients_match_naive(dtype, temperature):
    logits, targets = _inputs(batch=2, length=13, vocab=700, dtype=dtype, seed=1)
    gen = torch.Generator().manual_seed(2)
    w_logp, w_ent = torch.randn(2, 13, generator=gen), torch.randn(2, 13, generator=gen)

    a = logits.clone().requires_grad_()
    logp, ent = token_logprobs_and_entropy(a, targets, temperature, chunk_size=5)
    (grad_logp,) = torch.autograd.grad((logp * w_logp).sum(), a, retain_graph=True)
    (grad_both,) = torch.autograd.grad((logp * w_logp).sum() + (ent * w_ent).sum(), a)

    b = logits.clone().requires_grad_()
    ref_logp, ref_ent = naive_logprobs_and_entropy(b, targets, temperature)
    (ref_grad_logp,) = torch.autograd.grad((ref_logp * w_logp).sum(), b, retain_graph=True)
    (ref_grad_both,) = torch.autograd.grad((ref_logp * w_logp).sum() + (ref_ent * w_ent).sum(), b)

    assert grad_logp.dtype == dtype
    atol = 1e-6 if dtype == torch.float32 else 1e-3  # bf16 gradients: both paths round to bf16 at the end
    torch.testing.assert_close(
        grad_logp, ref_grad_logp, atol=atol, rtol=0 if dtype == torch.float32 else 1e-2
    )
    torch.testing.assert_close(
        grad_both, ref_grad_both, atol=atol, rtol=0 if dtype == torch.float32 else 1e-2
    )


def test_shift_and_align_on_non_contiguous_view():
    logits, input_ids = _inputs(batch=3, length=9, vocab=300, seed=3)
    leaf = logits.clone().requires_grad_()
    shifted, targets = shift_for_causal_lm(leaf, input_ids)
    assert shifted.shape == (3, 8, 300) and torch.equal(targets, input_ids[:, 1:])
    assert not shifted.is_contiguous()
    logp, ent = token_logprobs_and_entropy(shifted, targets, chunk_size=7)
    ref_logp, ref_ent = naive_logprobs_and_entropy(logits[:, :-1], input_ids[:, 1:])
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=0)
    (grad,) = torch.autograd.grad(logp.sum(), leaf)
    ref_leaf = logits.clone().requires_grad_()
    (ref_grad,) = torch.autograd.grad(
        naive_logprobs_and_entropy(ref_leaf[:, :-1], input_ids[:, 1:])[0].sum(), ref_leaf
    )
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=0)
    assert torch.equal(grad[:, -1], torch.zeros(3, 300))

    aligned = align_to_input(logp)
    assert aligned.shape == input_ids.shape
    assert torch.equal(aligned[:, 0], torch.zeros(3)) and torch.equal(aligned[:, 1:], logp)


def test_input_validation():
    logits, targets = _inputs(batch=1, length=2, vocab=10)
    with pytest.raises(ValueError):
        token_logprobs_and_entropy(logits, targets, temperature=0.0)
    with pytest.raises(ValueError):
        token_logprobs_and_entropy(logits, targets[:, :1])
    with pytest.raises(ValueError):
        token_logprobs_and_entropy(logits, targets, chunk_size=0)


# Peak resident memory of one call, measured in a fresh interpreter: reset the kernel's high-water mark
# (VmHWM) after building the inputs, run the function, read VmHWM − VmRSS before the call.
_MEASURE = textwrap.dedent(
    """
    import sys, torch
    from lit_entropy.diagnostics import entropy as E

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    torch.set_num_threads(1)
    name, grad = sys.argv[1], sys.argv[2] == "1"
    fn = getattr(E, name + "_logprobs_and_entropy")
    logits = torch.randn(4, 1024, 8192).requires_grad_(grad)  # 4096 rows x 8192 vocab, 128 MiB
    targets = torch.randint(0, 8192, (4, 1024))
    fn(logits[:1, :8], targets[:1, :8], 0.9, chunk_size=256)  # warm up lazy initialisation
    base = status("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with torch.set_grad_enabled(grad):
        out = fn(logits, targets, 0.9, chunk_size=256)
    print(status("VmHWM") - base)
    """
)


def _peak_bytes(name: str, grad: bool) -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _MEASURE, name, "1" if grad else "0"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=120,
    )
    return int(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc peak-RSS reset")
@pytest.mark.parametrize("grad", [False, True])
def test_chunked_peak_memory_is_lower(grad):
    naive = _peak_bytes("naive", grad)
    chunked = _peak_bytes("token", grad)
    mib = 2**20
    # naive materialises several [4096, 8192] fp32 temporaries (128 MiB each); chunked a few 8 MiB ones
    assert naive > 256 * mib, f"naive peak {naive / mib:.0f} MiB: measurement does not discriminate"
    assert chunked < naive / 2, f"chunked {chunked / mib:.0f} MiB vs naive {naive / mib:.0f} MiB"
