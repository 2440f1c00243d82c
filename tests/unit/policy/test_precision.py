"""Precision (docs/design.md §8): a real FP16 loss scaler on CPU, the engine dtype, why ratios stay fp32."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.policy.precision import (
    cpu_half_support,
    engine_dtype_for,
    fp16_mixed,
    slow_half_precision_note,
)
from tests.helpers import compose_train

AVX2_ONLY = {"x86": True, "half_units": False}
AMX = {"x86": True, "half_units": True}


def test_fp16_plugin_on_cpu_skips_an_overflowing_step_and_halves_the_scale():
    plugin = fp16_mixed("cpu", init_scale=1024.0)
    assert plugin.precision == "16-mixed" and plugin.device == "cpu"
    scaler = plugin.scaler
    layer = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    before = [p.detach().clone() for p in layer.parameters()]
    with plugin.forward_context():
        out = layer(torch.ones(2, 3))
    assert out.dtype == torch.float16  # fp16 autocast on the CPU, not bf16
    scaler.scale(out.float().sum() * float("inf")).backward()  # an overflow
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, p) for a, p in zip(before, layer.parameters(), strict=True))  # step skipped
    assert scaler.get_scale() == 512.0  # scale halved
    opt.zero_grad()
    with plugin.forward_context():
        loss = layer(torch.ones(2, 3)).float().sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert not all(torch.equal(a, p) for a, p in zip(before, layer.parameters(), strict=True))  # a real step


def test_engine_dtype_follows_the_trainer():
    assert engine_dtype_for("32-true") == "float32"
    assert engine_dtype_for("bf16-mixed") == "bfloat16"
    assert engine_dtype_for("16-mixed") == "float16"
    assert engine_dtype_for(None) is None
    with pytest.raises(ValueError, match="accelerator"):
        fp16_mixed("tpu")


def test_bf16_rounded_log_probs_bias_clipping_and_fp32_removes_it():
    """Petrenko et al. 2026: on-policy tokens (logp == logp_old) whose current log-prob is held in bf16 get
    ratios off 1 by up to ~1 %, enough to clip them under a tight clip range; the fp32 path gives r = 1."""
    g = torch.Generator().manual_seed(0)
    old = -4.0 * torch.rand(4096, 64, generator=g)  # fp32 pre-update log-probs
    adv = torch.randn(4096, 1, generator=g).expand(4096, 64)
    eps = 3e-3  # a tight clip range (GSPO-sized ranges are tighter still)
    exact, info32 = clipped_surrogate(old.clone(), old, adv, eps, eps)
    bf16_logp = old.to(torch.bfloat16).float()  # the same log-probs computed and held in bf16
    rounded, info16 = clipped_surrogate(bf16_logp, old, adv, eps, eps)
    clip32 = float((info32["clipped_low"] | info32["clipped_high"]).float().mean())
    clip16 = float((info16["clipped_low"] | info16["clipped_high"]).float().mean())
    assert clip32 == 0.0 and bool((info32["ratio"] == 1).all())
    assert clip16 > 0.1  # measured 0.18 of on-policy tokens lose their gradient
    # The bias: bf16's error grows with |logp|, so the clipped tokens are the unlikely ones, whose
    # positive-advantage updates are the ones that raise entropy (the drift toward collapse).
    clipped_pos = info16["clipped_high"]
    assert float(-old[clipped_pos].mean()) > float(-old[adv > 0].mean()) + 0.5
    # The ratio spread bf16 induces on-policy, versus none in fp32.
    assert float((info16["ratio"] - 1).abs().max()) > 5e-3
    # Our loss casts to fp32 whatever it is given: bf16 inputs holding the same values give the same result.
    same, _ = clipped_surrogate(old.to(torch.bfloat16), old.to(torch.bfloat16), adv.to(torch.bfloat16), eps, eps)
    assert same.dtype == torch.float32 and bool((same == -adv.to(torch.bfloat16).float()).all())
    assert exact.dtype == torch.float32 and rounded.dtype == torch.float32


def test_an_engine_in_another_dtype_is_reported_at_start_up(caplog):
    from types import SimpleNamespace

    from lit_entropy.data.rollout_datamodule import RolloutDataModule
    from lit_entropy.policy.tokenizer import CharTokenizer
    from lit_entropy.rewards.config import RewardConfig
    from lit_entropy.rollout.sampler import Sampler
    from lit_entropy.tasks.prompts import CountdownPrompts

    made = []

    def engine(**kw):
        made.append(kw)
        return SimpleNamespace(dtype="float32", close=lambda: None)

    trainer = SimpleNamespace(world_size=1, precision="bf16-mixed")
    module = SimpleNamespace(tokenizer=CharTokenizer.for_countdown(), policy_path="unused", _trainer=trainer,
                             model=SimpleNamespace(config=SimpleNamespace(max_position_embeddings=64)))
    dm = RolloutDataModule(CountdownPrompts(), Sampler(engine, reward=RewardConfig(mode="inline")))
    with caplog.at_level("WARNING"):
        dm.start(module)
    assert made and "samples in float32 but the trainer computes in bfloat16" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        dm.start(module)  # once per run, not once per iteration
    assert "samples in" not in caplog.text
    trainer.precision = "32-true"
    dm.sampler.engine = None
    with caplog.at_level("WARNING"):
        dm.start(module)
    assert "samples in" not in caplog.text
    dm.close()


@pytest.mark.parametrize(("precision", "engine", "named"), [
    ("bf16-mixed", "bfloat16", "bf16"), ("16-mixed", "float16", "fp16"), ("32-true", "bfloat16", "bf16"),
    ("bf16-true", None, "bf16"), ("bf16-mixed", "float16", "bf16 and fp16")])
def test_half_precision_on_a_cpu_without_half_units_is_named(precision, engine, named):
    note = slow_half_precision_note(precision, engine, True, AVX2_ONLY)
    assert note is not None and note.startswith(f"{named} on a CPU without AMX") and "precision=fp32" in note


@pytest.mark.parametrize(("precision", "engine", "on_cpu", "support"), [
    ("32-true", "float32", True, AVX2_ONLY),  # nothing half
    ("32-true", None, True, AVX2_ONLY),
    ("bf16-mixed", "bfloat16", True, AMX),  # the units are there
    ("bf16-mixed", "bfloat16", False, AVX2_ONLY),  # a GPU run
    ("bf16-mixed", "bfloat16", True, {"x86": False, "half_units": False}),  # another architecture: not measured
])
def test_no_note_where_half_precision_is_not_slow_or_not_known_to_be(precision, engine, on_cpu, support):
    assert slow_half_precision_note(precision, engine, on_cpu, support) is None


def test_this_cpus_support_is_what_torch_reports():
    support = cpu_half_support()
    assert set(support) == {"x86", "half_units"} and all(isinstance(v, bool) for v in support.values())
    assert support["half_units"] == (torch.cpu._is_amx_tile_supported() or torch.cpu._is_avx512_bf16_supported())


@pytest.mark.parametrize(("overrides", "warned"), [(["precision=bf16"], True), (["precision=fp16"], True),
                                                   (["precision=fp32"], False)])
def test_build_warns_of_slow_half_precision_at_start_up(monkeypatch, caplog, overrides, warned):
    """What ``scripts/train.py`` does: ``build`` logs the note after the start-up block, from the composed
    precision group (trainer and engine), on a CPU reported to lack the units."""
    from lit_entropy import train

    monkeypatch.setattr(train, "cpu_half_support", lambda: AVX2_ONLY)
    cfg = compose_train(["debug=smoke", "rollout=hf", "paths.output_dir=unused", "logger=[]", *overrides])
    with caplog.at_level("WARNING", logger="lit_entropy.train"):
        train.build(cfg)
    notes = [r.getMessage() for r in caplog.records if "without AMX" in r.getMessage()]
    assert len(notes) == int(warned), notes
