"""bf16 linear layers through fp32 kernels: the same bf16 contract, the fp32 kernel, everything else untouched."""

import json
import sys

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


@pytest.fixture
def engine_weight():
    """A weight as vLLM holds it: a bf16 parameter that needs no grad."""
    emu.forget_fp32_weights()
    g = torch.Generator().manual_seed(2)
    yield torch.nn.Parameter(torch.randn(48, 64, generator=g).to(BF16), requires_grad=False)
    emu.forget_fp32_weights()


def test_an_engine_weight_is_converted_once_until_it_changes_in_place(engine_weight, monkeypatch):
    conversions = []
    to_fp32 = torch.Tensor.float
    monkeypatch.setattr(torch.Tensor, "float", lambda t: conversions.append(t.shape) or to_fp32(t))
    x = torch.randn(5, 64).to(BF16)
    with torch.no_grad():
        first = emu.linear(x, engine_weight)
        assert torch.equal(emu.linear(x, engine_weight), first)
        assert conversions.count((48, 64)) == 1  # the second call used the kept copy
        engine_weight.mul_(2)  # in place: its version counter moves
        assert torch.equal(emu.linear(x, engine_weight), (x.float() @ engine_weight.float().T).to(BF16))
        assert conversions.count((48, 64)) == 3  # (one of them the check's own)
    # with grad, a weight that needs grad, or the copies switched off: converted at every call
    emu.linear(x, engine_weight)
    with torch.no_grad():
        emu.linear(x, torch.nn.Parameter(engine_weight.detach().clone()))
        monkeypatch.setattr(emu, "keep_fp32_copies", False)
        emu.linear(x, engine_weight)
    assert conversions.count((48, 64)) == 6


def test_a_reload_that_writes_through_data_is_seen_through_the_vllm_hook(engine_weight, monkeypatch):
    """vLLM's loader writes ``param.data``, which moves no version counter: its reload must drop the copies."""
    import types

    class Worker:  # vLLM's Worker, as far as the hook goes
        def reload_weights(self, weights_iterator=None):
            for param, value in weights_iterator:
                param.data.copy_(value)

    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", types.SimpleNamespace(Worker=Worker))
    monkeypatch.setattr(emu, "_RELOAD_HOOKED", False)
    x = torch.randn(5, 64).to(BF16)
    with torch.no_grad():
        emu.linear(x, engine_weight)  # hooks the reload, keeps a copy
        version = engine_weight._version
        Worker().reload_weights(weights_iterator=iter([(engine_weight, torch.ones(48, 64))]))
        assert engine_weight._version == version  # invisible to the version counter ...
        out = emu.linear(x, engine_weight)
    assert torch.equal(out, (x.float() @ torch.ones(64, 48)).to(BF16))  # ... and still seen


def test_a_compiled_graph_keeps_the_copy_through_the_op_and_computes_the_same(engine_weight, monkeypatch):
    monkeypatch.setattr(F, "linear", emu.linear)
    layer = torch.nn.Linear(64, 48, bias=False).to(BF16).requires_grad_(False)
    layer.weight = engine_weight
    compiled = torch.compile(layer, backend="inductor", fullgraph=True)
    x = torch.randn(5, 64).to(BF16)
    with torch.no_grad():
        out = compiled(x)
    assert torch.equal(out, (x.float() @ engine_weight.float().T).to(BF16))
    assert [kept[0]() for kept in emu._fp32_copies.values()] == [engine_weight]  # kept by the op at run time


@pytest.mark.slow
@pytest.mark.integration
def test_a_compiled_bf16_vllm_engine_samples_the_same_with_the_copies_across_a_weight_sync(tmp_path, monkeypatch):
    """The study's engine (bf16, compiled graph) on a CPU without bf16 units: the kept copies change no token and
    no log-prob, before and after the trainer's weights are loaded into it."""
    pytest.importorskip("vllm")
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        pytest.skip("vLLM's oneDNN has bf16 kernels on this CPU: its linear layers never reach F.linear")
    from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    policy = TinyLabPolicy(arch=TinyArch(num_layers=2), warmstart=WarmStart(steps=30),
                           cache_dir=str(tmp_path / "policy")).build()
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "vllm"))  # compiled afresh, with the op in the graph
    monkeypatch.setattr(F, "linear", emu.linear)
    emu.forget_fp32_weights()
    tok = policy.tokenizer
    engine = VLLMEngine(policy.path, eos_id=tok.eos_id, dtype="bfloat16", max_model_len=64, generation_batch=12,
                        enforce_eager=False)
    prompts = [tok.encode(t, add_bos=True) for t in ("3,5,2=16:", "7,1,4=11:", "9,9,3=27:")]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=12)

    def sample(keep: bool, seed: int):
        monkeypatch.setattr(emu, "keep_fp32_copies", keep)
        return [(g.token_ids, g.logprobs) for p in engine.generate(prompts, n=4, sampling=sampling, seed=seed)
                for g in p]

    try:
        kept = sample(True, 11)
        matrices = engine.llm.collective_rpc(lambda worker: [
            id(p) for p in worker.model_runner.model.parameters() if p.ndim == 2])[0]
        assert set(matrices) <= set(emu._fp32_copies)  # every weight matrix (the embedding shares the head's)
        assert sample(False, 11) == kept
        before_sync = sample(True, 12)
        with torch.no_grad():
            for p in policy.model.parameters():
                p.add_(0.05 * torch.randn_like(p))
        engine.sync_weights(policy.model)
        after_sync = sample(True, 12)
        assert after_sync != before_sync  # the new weights are sampled from ...
        assert sample(False, 12) == after_sync  # ... through the copies made after the reload
    finally:
        engine.close()
        emu.forget_fp32_weights()


def test_installed_sees_this_module_and_a_copy_loaded_under_another_name(monkeypatch):
    monkeypatch.setattr(F, "linear", emu.original_linear)
    assert emu.installed() is False
    emu.install()
    assert emu.installed() is True
    copy = lambda *a, **k: None  # noqa: E731  (what a study environment's .pth loads: the module as `bf16_via_fp32`)
    copy.__module__ = "bf16_via_fp32"
    monkeypatch.setattr(F, "linear", copy)
    assert emu.installed() is True
    copy.__module__ = "somebody_else"
    assert emu.installed() is False
