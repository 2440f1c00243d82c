"""bf16 linear layers through fp32 kernels: the same bf16 contract, the fp32 kernel, everything else untouched."""

import json

import pytest
import torch
import torch.nn.functional as F

from studies import bf16_via_fp32 as emu

BF16 = torch.bfloat16


@pytest.fixture
def tensors():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 64, generator=g, requires_grad=True)
    w = torch.randn(48, 64, generator=g, requires_grad=True)
    b = torch.randn(48, generator=g, requires_grad=True)
    return x, w, b


def test_under_bf16_autocast_it_is_the_fp32_gemm_of_the_rounded_operands_rounded(tensors):
    x, w, b = tensors
    with torch.autocast("cpu", dtype=BF16):
        out = emu.linear(x, w, b)
    want = (x.detach().to(BF16).float() @ w.detach().to(BF16).float().T + b.detach().to(BF16).float()).to(BF16)
    assert out.dtype == BF16
    assert torch.equal(out, want)


def test_it_agrees_with_the_native_bf16_kernel_forward_and_backward(tensors):
    x, w, b = tensors
    grad_out = torch.randn(12, 48, generator=torch.Generator().manual_seed(1)).to(BF16)
    results = []
    for fn in (emu.linear, emu.original_linear):
        for t in tensors:
            t.grad = None
        with torch.autocast("cpu", dtype=BF16):
            out = fn(x, w, b)
        out.backward(grad_out)
        results.append((out.detach(), x.grad.clone(), w.grad.clone(), b.grad.clone()))
    for mine, native in zip(*results, strict=True):
        assert mine.dtype == native.dtype
        scale = native.float().abs().max()
        # one bf16 rounding apart at most (relative 2^-8), from the order of the fp32 accumulation
        assert (mine.float() - native.float()).abs().max() <= scale * 2**-7


def test_gradients_are_rounded_to_bf16_where_the_native_kernels_round_them(tensors):
    x, w, b = tensors
    with torch.autocast("cpu", dtype=BF16):
        out = emu.linear(x, w, b)
    out.float().sum().backward()
    for t in (x, w):
        assert t.grad.dtype == torch.float32
        assert torch.equal(t.grad, t.grad.to(BF16).float())  # representable in bf16: rounded there


def test_a_backward_inside_the_autocast_runs_no_bf16_gemm(tensors, monkeypatch):
    """The trainer calls backward inside its autocast: the backward's GEMMs must not go back to bf16 there."""
    x, w, b = tensors
    seen = []
    mm = torch.Tensor.__matmul__
    monkeypatch.setattr(torch.Tensor, "__matmul__",
                        lambda a, c: seen.append((a.dtype, c.dtype, torch.is_autocast_enabled("cpu"))) or mm(a, c))
    with torch.autocast("cpu", dtype=BF16):
        out = emu.linear(x, w, b)
        out.float().square().sum().backward()
    assert seen and all(d == (torch.float32, torch.float32, False) for d in seen)
    assert x.grad is not None and w.grad is not None and b.grad is not None


def test_bf16_tensors_outside_autocast_are_taken(tensors):
    x, w, _ = (t.detach().to(BF16) for t in tensors)
    out = emu.linear(x, w)
    assert out.dtype == BF16
    assert torch.equal(out, (x.float() @ w.float().T).to(BF16))


@pytest.mark.parametrize("case", ["fp32", "fp16 autocast", "fp32 weight with bf16 input"])
def test_everything_else_goes_to_the_original_untouched(tensors, case, monkeypatch):
    x, w, b = (t.detach() for t in tensors)
    calls = []
    monkeypatch.setattr(emu, "original_linear", lambda *a: calls.append(a))
    if case == "fp32":
        emu.linear(x, w, b)
    elif case == "fp16 autocast":
        with torch.autocast("cpu", dtype=torch.float16):
            emu.linear(x, w, b)
    else:
        emu.linear(x.to(BF16), w, None)
    assert len(calls) == 1
    assert calls[0][0] is not None and calls[0][0].dtype == (BF16 if case.endswith("bf16 input") else x.dtype)


def test_install_from_env_only_when_asked_and_nn_linear_then_uses_it(monkeypatch, capsys):
    monkeypatch.setattr(F, "linear", emu.original_linear)
    monkeypatch.delenv(emu.ENV_VAR, raising=False)
    assert emu.install_from_env() is False
    assert F.linear is emu.original_linear
    monkeypatch.setenv(emu.ENV_VAR, "1")
    assert emu.install_from_env() is True
    assert F.linear is emu.linear
    assert emu.ENV_VAR in capsys.readouterr().err
    emu.uninstall()
    assert F.linear is emu.original_linear
    emu.install()
    layer = torch.nn.Linear(8, 4)
    seen = []
    monkeypatch.setattr(emu, "original_linear", lambda *a: seen.append(a[0].dtype) or torch.zeros(1))
    with torch.autocast("cpu", dtype=BF16):
        layer(torch.randn(2, 8))
    assert seen == [torch.float32]  # reached through F.linear, with the rounded operands in fp32


def test_a_run_folder_ran_with_it_when_its_logs_or_its_imported_done_json_say_so(tmp_path):
    plain, logged, imported = (tmp_path / n for n in ("plain", "logged", "imported"))
    for folder in (plain, logged, imported):
        folder.mkdir()
    (plain / "train.log").write_text("model: llama\n")
    (plain / "done.json").write_text(json.dumps({"returncode": 0}))
    (logged / "study_stdout.log").write_text(f"{emu.MARKER} bf16 linear layers ...\n")
    (imported / "done.json").write_text(json.dumps({"returncode": 0, "bf16_via_fp32": True, "imported": True}))
    assert [emu.ran_with_it(f) for f in (plain, logged, imported, tmp_path / "missing")] == [False, True, True, False]
