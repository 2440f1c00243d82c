"""The tiny lab policy: architecture checks and the warm-start cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart


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
    from lit_entropy.policy.models import build_tiny_qwen2, supervised_warm_start
    from lit_entropy.policy.tokenizer import CharTokenizer
    from lit_entropy.tasks.countdown import CountdownConfig

    tok = CharTokenizer.for_countdown()
    model = build_tiny_qwen2(tok.vocab_size, TinyArch(num_layers=1, hidden_size=64, intermediate_size=128), tok)
    short = supervised_warm_start(model, tok, CountdownConfig(), WarmStart(steps=2, batch_size=16))
    model = build_tiny_qwen2(tok.vocab_size, TinyArch(num_layers=1, hidden_size=64, intermediate_size=128), tok)
    longer = supervised_warm_start(model, tok, CountdownConfig(), WarmStart(steps=60, batch_size=16))
    assert longer["final_loss"] < short["final_loss"] - 0.3


def test_head_dim_below_32_is_rejected():
    with pytest.raises(ValueError, match="head_dim"):
        TinyArch(head_dim=16)


@pytest.mark.parametrize("damage", ["truncate", "flip", "tokenizer"])
def test_a_corrupt_warm_start_cache_is_detected_and_rebuilt(tmp_path, damage, caplog):
    first = small(tmp_path).build()
    expected = [t.clone() for t in first.model.state_dict().values()]  # the weights are mmapped from the file
    path = Path(first.path)
    assert (path / "checksums.json").exists()
    weights = path / "model.safetensors"
    if damage == "truncate":  # a full disk or a killed copy
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "flip":  # still loads, wrong numbers
        data = bytearray(weights.read_bytes())
        data[-5] ^= 0xFF
        weights.write_bytes(bytes(data))
    else:
        (path / "char_tokenizer.json").unlink()
    with caplog.at_level("WARNING"):
        again = small(tmp_path).build()
    assert any("corrupt" in r.message for r in caplog.records)
    for a, b in zip(expected, again.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)  # rebuilt deterministically


def test_a_cache_written_before_checksums_gets_them_when_it_loads(tmp_path):
    first = small(tmp_path).build()
    (Path(first.path) / "checksums.json").unlink()
    small(tmp_path).build()
    assert (Path(first.path) / "checksums.json").exists()


class FixedPrompts:
    def __init__(self, *texts: str) -> None:
        self.texts = texts

    def sample(self, n: int, iteration: int, round: int = 0) -> list:
        from lit_entropy.tasks.prompts import Prompt

        return [Prompt(t) for t in self.texts[:n]]


def test_the_character_model_refuses_prompts_it_cannot_read_or_fit():
    spec = TinyLabPolicy()
    spec.check_prompts(FixedPrompts("3,5,2=16:", "9,9,9=99:"), max_new_tokens=16)
    with pytest.raises(ValueError, match=r"prompt 1 .*outside its alphabet.*\[' ', 'J', 'a', 'e', 'h'.*model=smollm2_135m.*model=hf"):
        spec.check_prompts(FixedPrompts("3,5,2=16:", "Jane has 3 apples"), max_new_tokens=16)
    with pytest.raises(ValueError, match=r"needs 70 positions.*rollout.max_new_tokens=60.*max_position_embeddings=64"):
        spec.check_prompts(FixedPrompts("3,5,2=16:"), max_new_tokens=60)


def test_build_lock_excludes_a_second_process(tmp_path):
    import subprocess
    import sys

    from lit_entropy.policy.models import build_lock

    target = tmp_path / "cache" / "policy"
    probe = ("import fcntl, sys\nf = open(sys.argv[1], 'w')\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "    print('free')\nexcept BlockingIOError:\n    print('held')\n")
    lock = tmp_path / "cache" / ".policy.lock"
    with build_lock(target):
        held = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
    free = subprocess.run([sys.executable, "-c", probe, str(lock)], capture_output=True, text=True).stdout
    assert (held.strip(), free.strip()) == ("held", "free")
