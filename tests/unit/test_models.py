"""The tiny lab policy: architecture checks and the warm-start cache."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.models import TinyArch, TinyLabPolicy, WarmStart


def small(cache_dir, steps=5) -> TinyLabPolicy:
    return TinyLabPolicy(arch=TinyArch(num_layers=1, hidden_size=64, intermediate_size=128),
                         warmstart=WarmStart(steps=steps, batch_size=8), cache_dir=str(cache_dir))


def test_warm_start_is_cached_and_reused(tmp_path):
    first = small(tmp_path).build()
    n_params = sum(p.numel() for p in first.model.parameters())
    assert 10_000 < n_params < 5_000_000
    assert first.model.config.head_dim >= 32
    mtime = (tmp_path / "warmstart").stat().st_mtime_ns
    again = small(tmp_path).build()
    assert again.path == first.path
    assert (tmp_path / "warmstart").stat().st_mtime_ns == mtime  # nothing rebuilt
    for a, b in zip(first.model.state_dict().values(), again.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = small(tmp_path, steps=6).build()
    assert other.path != first.path


def test_warm_start_lowers_the_loss(tmp_path):
    from lit_entropy.models import build_tiny_qwen2, supervised_warm_start
    from lit_entropy.tasks.countdown import CountdownConfig
    from lit_entropy.tokenizer import CharTokenizer

    tok = CharTokenizer.for_countdown()
    model = build_tiny_qwen2(tok.vocab_size, TinyArch(num_layers=1, hidden_size=64, intermediate_size=128), tok)
    short = supervised_warm_start(model, tok, CountdownConfig(), WarmStart(steps=2, batch_size=16))
    model = build_tiny_qwen2(tok.vocab_size, TinyArch(num_layers=1, hidden_size=64, intermediate_size=128), tok)
    longer = supervised_warm_start(model, tok, CountdownConfig(), WarmStart(steps=60, batch_size=16))
    assert longer["final_loss"] < short["final_loss"] - 0.3


def test_head_dim_below_32_is_rejected():
    with pytest.raises(ValueError, match="head_dim"):
        TinyArch(head_dim=16)
