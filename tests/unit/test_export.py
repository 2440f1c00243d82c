"""``lit-entropy-export``: a training checkpoint becomes a Hugging Face folder that transformers loads without
the package, with the trained policy's logits (full fine-tune, LoRA merged, the lab's character model).

The checkpoints are a real short run's (``tests/harness.py``: ``model=hf`` on a tiny BPE model, the HF engine,
one iteration), their weights then perturbed in place in the trainer's own file and in the trainer's live
model alike, so the exported weights are the checkpoint's and not the base folder's, and LoRA's B is non-zero
(the merge matters). The run config is saved as Hydra saves it, in ``.hydra/config.yaml`` beside
``checkpoints/``.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.export import ExportError, export_checkpoint
from tests.helpers import compose_train

TEXTS = ["3,5,2=16:", "Natalia sold 48 clips in April.", "12*7 = 84, so \\boxed{84}"]
RUN = ["model=hf", "rollout=hf", "data=countdown", "trainer.max_epochs=1", "batch.prompts_per_iter=2",
       "batch.group_size=2", "batch.num_minibatches=1", "batch.micro_batch_size=4", "rollout.max_new_tokens=4",
       "reward.mode=inline", "callbacks/entropy=none", "callbacks/law=none"]
LORA = "model.lora={r: 4, alpha: 8}"


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    """A tiny Qwen2 (tied embeddings) with a trained byte-level BPE tokenizer and a chat template."""
    from lit_entropy.policy.hf_tiny import build_tiny_hf_policy
    from lit_entropy.policy.models import TinyArch

    texts = [f"{a}+{b}={a + b}, {a}*{b}={a * b}: \\boxed{{{a * b}}}" for a in range(15) for b in range(15)] + TEXTS
    arch = TinyArch(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96,
                    max_position_embeddings=128)
    return build_tiny_hf_policy(tmp_path_factory.mktemp("tiny_hf"), texts, vocab_size=300, arch=arch)


@torch.no_grad()
def perturb(ckpt: Path, model: torch.nn.Module, seed: int, scale: float = 0.05) -> None:
    """Add the same noise to every trainable-or-not parameter of the live ``model`` and to its ``model.*``
    entries in the trainer's checkpoint file (in place: tied tensors stay one tensor), and rewrite the file."""
    blob = torch.load(ckpt, map_location="cpu", weights_only=True)
    state = blob["state_dict"]
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = scale * torch.randn(p.shape, generator=g)
        p.add_(noise)
        state[f"model.{name}"].add_(noise)
    torch.save(blob, ckpt)


def fit(tiny_hf: Path, root: Path, name: str, extra: list[str], seed: int) -> tuple[Path, torch.nn.Module]:
    """A real one-iteration run; its ``last.ckpt`` (perturbed) and the trainer's model (perturbed alike)."""
    from tests.harness import Harness

    result = Harness().fit([*RUN, f"model.name_or_path={tiny_hf}", *extra], root, name=name)
    (result.run_dir / ".hydra").mkdir()
    OmegaConf.save(result.cfg, result.run_dir / ".hydra" / "config.yaml")  # as Hydra writes it (unresolved)
    perturb(result.last_ckpt, result.module.model, seed)
    return result.last_ckpt, result.module.model.eval()


@pytest.fixture(scope="module")
def full_run(tiny_hf, tmp_path_factory):
    return fit(tiny_hf, tmp_path_factory.mktemp("runs"), "full", [], seed=1)


@pytest.fixture(scope="module")
def lora_run(tiny_hf, tmp_path_factory):
    return fit(tiny_hf, tmp_path_factory.mktemp("runs"), "lora", [LORA], seed=2)


def logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].float()


def load(out: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(out)).eval(), AutoTokenizer.from_pretrained(str(out))


def check_same_policy(out: Path, policy: torch.nn.Module, tiny_hf: Path) -> None:
    """The exported folder's tokenizer gives the base tokenizer's ids, and its model the policy's logits."""
    from transformers import AutoTokenizer

    model, tok = load(out)
    base_tok = AutoTokenizer.from_pretrained(str(tiny_hf))
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        assert ids == base_tok.encode(text, add_special_tokens=False)
        torch.testing.assert_close(logits(model, ids), logits(policy, ids), rtol=1e-5, atol=1e-5)


def test_a_full_fine_tune_exports_with_its_logits_tied_embeddings_and_tokenizer(full_run, tiny_hf, tmp_path):
    from safetensors.torch import load_file

    ckpt, policy = full_run
    out = export_checkpoint(ckpt, tmp_path / "exported")
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "export.json"} <= names
    check_same_policy(out, policy, tiny_hf)
    model, tok = load(out)
    assert model.config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    weights = load_file(str(out / "model.safetensors"))
    assert "lm_head.weight" not in weights and all(t.dtype == torch.float32 for t in weights.values())
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert chat == "<|user|>\nhi<|end|>\n<|assistant|>\n"  # the chat template travels with the tokenizer
    gen = json.loads((out / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"], gen["bos_token_id"]) == \
        (tok.eos_token_id, tok.pad_token_id, tok.bos_token_id) == (tok.convert_tokens_to_ids("<|end|>"), 1, 0)
    record = json.loads((out / "export.json").read_text())
    assert record["source_checkpoint"]["path"] == str(ckpt.resolve()) and len(record["source_checkpoint"]["sha256"]) == 64
    assert record["model_spec"]["name_or_path"] == str(tiny_hf) and record["lora_merged"] is False
    assert record["dtype"] == "float32" and record["package_version"]


def test_lora_adapters_are_merged_into_the_base_weights(lora_run, tiny_hf, tmp_path):
    from safetensors.torch import load_file

    ckpt, policy = lora_run
    state = torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]
    b = [v for k, v in state.items() if "lora_B" in k]
    assert b and all(float(v.abs().max()) > 0 for v in b)  # the adapters change the policy
    out = export_checkpoint(ckpt, tmp_path / "exported")
    assert not [k for k in load_file(str(out / "model.safetensors")) if "lora" in k]
    assert "lora" not in (out / "config.json").read_text()
    check_same_policy(out, policy, tiny_hf)
    with policy.disable_adapter():  # without the merge the folder would hold these logits
        base = logits(policy, [5, 20, 30, 40])
    assert (logits(load(out)[0], [5, 20, 30, 40]) - base).abs().max() > 1e-2
    assert json.loads((out / "export.json").read_text())["lora_merged"] is True


@pytest.fixture
def cli_process_state():
    """The environment and warnings filters as they were after (the CLI quiets third-party noise)."""
    saved = dict(os.environ)
    with warnings.catch_warnings():
        yield
    os.environ.clear()
    os.environ.update(saved)


def test_a_non_empty_folder_is_refused_unless_forced(full_run, tmp_path, capsys, cli_process_state):
    from lit_entropy.cli.export import main

    ckpt, _ = full_run
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(ExportError, match="not empty.*--force"):
        export_checkpoint(ckpt, out)
    assert main([str(ckpt), str(out)]) == 1
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["notes.txt"]  # untouched
    assert main([str(ckpt), str(out), "--force", "--dtype", "bf16"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert not (out / "notes.txt").exists() and (out / "model.safetensors").is_file()
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_a_checkpoint_without_policy_weights_is_refused(tmp_path):
    bad = tmp_path / "other.ckpt"
    torch.save({"state_dict": {"critic.weight": torch.zeros(2)}, "epoch": 0}, bad)
    with pytest.raises(ExportError, match=r"no 'model\.\*' keys"):
        export_checkpoint(bad, tmp_path / "out")
    junk = tmp_path / "junk.ckpt"
    junk.write_text("not a checkpoint")
    with pytest.raises(ExportError, match="not a readable torch checkpoint"):
        export_checkpoint(junk, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_without_a_run_config_the_base_folder_is_named(full_run, lora_run, tiny_hf, tmp_path):
    loose = tmp_path / "loose" / "last.ckpt"
    loose.parent.mkdir()
    shutil.copy(full_run[0], loose)
    with pytest.raises(ExportError, match="--model-dir"):
        export_checkpoint(loose, tmp_path / "a")
    out = export_checkpoint(loose, tmp_path / "b", model_dir=tiny_hf)
    check_same_policy(out, full_run[1], tiny_hf)
    shutil.copy(lora_run[0], loose)
    with pytest.raises(ExportError, match="LoRA adapters.*alpha"):
        export_checkpoint(loose, tmp_path / "c", model_dir=tiny_hf)


def test_the_lab_policy_exports_with_its_character_tokenizer(tmp_path):
    """The lab's character model: its tokenizer saved as a Hugging Face fast tokenizer with the same ids."""
    from transformers import PreTrainedTokenizerFast

    from lit_entropy.policy.models import TinyArch, TinyLabPolicy, WarmStart

    arch = dict(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=32)
    policy = TinyLabPolicy(arch=TinyArch(**arch), warmstart=WarmStart(steps=0), cache_dir=str(tmp_path / "c")).build()
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    with torch.no_grad():
        for p in policy.model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.save({"epoch": 1, "state_dict": {f"model.{k}": v for k, v in policy.model.state_dict().items()}}, ckpt)
    cfg = compose_train([*(f"model.arch.{k}={v}" for k, v in arch.items()), "model.warmstart.steps=0",
                         f"paths.output_dir={run}"])
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    out = export_checkpoint(ckpt, tmp_path / "exported")
    model, tok = load(out)
    assert isinstance(tok, PreTrainedTokenizerFast)
    for text in ("3,5,2=16:", "7,1,4=11:(7+4)*1"):
        ids = tok.encode(text)  # BOS added, as the lab encodes its prompts
        assert ids == policy.tokenizer.encode(text, add_bos=True)
        torch.testing.assert_close(logits(model, ids), logits(policy.model.eval(), ids), rtol=1e-5, atol=1e-5)
    assert tok.decode(ids, skip_special_tokens=True) == "7,1,4=11:(7+4)*1"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == policy.tokenizer.eos_id
