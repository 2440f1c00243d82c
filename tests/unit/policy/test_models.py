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


def test_the_shipped_warm_start_is_the_one_of_the_default_settings():
    """The package ships the default settings' warm start, and the composed default config asks for exactly it."""
    from hydra.utils import instantiate

    from lit_entropy.policy.models import LAB_START, shipped_start
    from tests.helpers import compose_train

    rebuild = "a default of the lab's arch, warm start or task changed: run `python scripts/build_lab_start.py`"
    assert shipped_start(TinyLabPolicy().cache_key()) == LAB_START, rebuild
    composed = instantiate(compose_train([]).model)
    assert composed.shipped and composed.cache_key() == TinyLabPolicy().cache_key(), rebuild


def test_the_default_policy_loads_the_shipped_weights_and_builds_nothing(tmp_path):
    from safetensors.torch import load_file

    from lit_entropy.policy.models import LAB_START

    bundle = TinyLabPolicy(cache_dir=str(tmp_path)).build()
    assert Path(bundle.path) == LAB_START and not (tmp_path / "warmstart").exists()
    shipped = load_file(str(LAB_START / "model.safetensors"))
    state = bundle.model.state_dict()
    assert all(torch.equal(state[name], weights) for name, weights in shipped.items())


@pytest.fixture
def shipped_small(tmp_path, monkeypatch) -> Path:
    """A small policy's warm start put where the package ships its own (``LAB_START`` pointed at a copy)."""
    import shutil

    from lit_entropy.policy import models

    built = Path(small(tmp_path / "built").build().path)
    monkeypatch.setattr(models, "LAB_START", tmp_path / "lab_start")
    shutil.copytree(built, models.LAB_START)
    return models.LAB_START


def test_the_shipped_start_serves_only_its_own_settings_and_only_when_asked(tmp_path, shipped_small):
    assert Path(small(tmp_path / "a").build().path) == shipped_small
    assert not (tmp_path / "a" / "warmstart").exists()
    other = small(tmp_path / "b", steps=6).build()  # other settings: warm-started here
    assert Path(other.path).parent == tmp_path / "b" / "warmstart"
    here = small(tmp_path / "c")
    here.shipped = False  # the same settings, asked to warm-start on this machine
    assert Path(here.build().path).parent == tmp_path / "c" / "warmstart"


def test_a_damaged_shipped_start_is_reported_and_never_loaded(tmp_path, shipped_small, caplog):
    data = bytearray((shipped_small / "model.safetensors").read_bytes())
    data[-5] ^= 0xFF  # still loads, wrong numbers
    (shipped_small / "model.safetensors").write_bytes(bytes(data))
    with caplog.at_level("WARNING"):
        bundle = small(tmp_path / "a").build()
    assert any("fails its checksums" in r.message for r in caplog.records)
    assert Path(bundle.path).parent == tmp_path / "a" / "warmstart"


@pytest.mark.slow
def test_the_shipped_warm_start_is_what_this_code_builds(tmp_path):
    """Warm-start the default settings here (a minute or two) and compare with the shipped copy: the same loss, the
    same weights up to the machine's arithmetic (bit for bit on the kind of machine that made it: 2-core AVX2)."""
    import json

    from safetensors.torch import load_file

    from lit_entropy.policy.models import LAB_START

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as scripts/build_lab_start.py made it
    try:
        here = Path(TinyLabPolicy(cache_dir=str(tmp_path), shipped=False).build().path)
    finally:
        torch.set_num_threads(threads)
    shipped_stats = json.loads((LAB_START / "warmstart.json").read_text())
    here_stats = json.loads((here / "warmstart.json").read_text())
    assert abs(here_stats["final_loss"] - shipped_stats["final_loss"]) < 0.02
    ours, theirs = load_file(str(here / "model.safetensors")), load_file(str(LAB_START / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        gap = (ours[name] - theirs[name]).norm() / theirs[name].norm().clamp_min(1e-12)
        assert gap < 0.05, (name, float(gap))
