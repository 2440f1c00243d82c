"""Per-family rules of lit_entropy.policy.model_support (attention windows, the shared-prompt check, the start-up
report, the vLLM refusals, checkpoint names) and FSDP2's decoder-layer discovery."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import transformers as tf

from lit_entropy.policy import model_support as ms
from lit_entropy.policy.strategies import decoder_layers
from tests.models.families import FAMILIES, save_tiny, tiny_model

SMALL = dict(vocab_size=32, hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
             intermediate_size=64)


@pytest.mark.parametrize(("config", "windows"), [
    (tf.LlamaConfig(**SMALL, num_hidden_layers=2), [None, None]),
    (tf.Olmo2Config(**SMALL, num_hidden_layers=2), [None, None]),
    (tf.GPT2Config(n_layer=2, n_positions=1024), [None, None]),
    (tf.GPTNeoXConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2), [None, None]),
    (tf.Qwen2Config(**SMALL, num_hidden_layers=4), [None] * 4),  # window 4096 kept, use_sliding_window off
    (tf.Qwen2Config(**SMALL, num_hidden_layers=4, use_sliding_window=True, sliding_window=16, max_window_layers=2),
     [None, None, 16, 16]),
    (tf.Qwen3Config(**SMALL, num_hidden_layers=3, use_sliding_window=True, sliding_window=16, max_window_layers=1),
     [None, 16, 16]),
    (tf.Qwen3MoeConfig(**SMALL, num_hidden_layers=2), [None, None]),
    (tf.Qwen3MoeConfig(**SMALL, num_hidden_layers=2, use_sliding_window=True, sliding_window=16), [16, 16]),
    (tf.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=8), [8, 8]),
    (tf.MistralConfig(**SMALL, num_hidden_layers=2, sliding_window=None), [None, None]),
    (tf.Gemma2Config(**SMALL, num_hidden_layers=4, sliding_window=8), [8, None, 8, None]),
    (tf.Gemma3TextConfig(**SMALL, num_hidden_layers=6, sliding_window=8, sliding_window_pattern=3),
     [8, 8, None, 8, 8, None]),
    (tf.Gemma3TextConfig(**SMALL, num_hidden_layers=6, sliding_window=512), [512] * 5 + [None]),
    (tf.Phi3Config(vocab_size=32, hidden_size=64, num_attention_heads=2, num_hidden_layers=2, sliding_window=2047),
     [2047, 2047]),
    (tf.Phi3Config(vocab_size=32, hidden_size=64, num_attention_heads=2, num_hidden_layers=2), [None, None]),
    # Configs written before ``layer_types`` existed:
    (SimpleNamespace(model_type="qwen2", num_hidden_layers=3, use_sliding_window=True, sliding_window=4,
                     max_window_layers=2), [None, None, 4]),
    (SimpleNamespace(model_type="gemma2", num_hidden_layers=3, sliding_window=4), [4, None, 4]),
    (SimpleNamespace(model_type="gemma3_text", num_hidden_layers=4, sliding_window=4, sliding_window_pattern=2),
     [4, None, 4, None]),
])
def test_each_family_window_rule(config, windows):
    assert ms.layer_windows(config) == windows


def test_shared_prompts_are_exact_up_to_the_shortest_window():
    config = tf.Gemma2Config(**SMALL, num_hidden_layers=4, sliding_window=8)
    assert ms.shortest_window(config) == (8, 0)
    assert ms.shared_prompts_exact(config, 8) == (True, "")
    ok, reason = ms.shared_prompts_exact(config, 9)
    assert not ok and "gemma2: layer 0 attends to a sliding window of 8 tokens" in reason and "(9 tokens)" in reason
    assert ms.shared_prompts_exact(tf.LlamaConfig(**SMALL, num_hidden_layers=2), 10**6) == (True, "")


def test_a_refused_batch_is_logged_once(caplog):
    model = tiny_model("mistral")
    with caplog.at_level(logging.INFO, logger="lit_entropy.policy.model_support"):
        assert ms.allow_shared_prompts(model, 8)
        assert not ms.allow_shared_prompts(model, 9)
        assert not ms.allow_shared_prompts(model, 30)
        assert ms.allow_shared_prompts(model, 5)
    refusals = [r for r in caplog.records if "shared prompts off" in r.getMessage()]
    assert len(refusals) == 1 and "mistral: layer 0" in refusals[0].getMessage()


def test_startup_report_names_family_windows_ties_and_fast_paths():
    report = ms.startup_report(tiny_model("gemma3_text"))
    assert report.startswith("model: gemma3_text (Gemma3ForCausalLM), 0.13M parameters")
    assert "sliding windows: [8] tokens on 2 of 4 layers" in report
    assert "tied input/output embeddings: yes" in report
    assert "on for batches of rows up to 8 tokens, longer batches run whole rows" in report
    report = ms.startup_report(tiny_model("gpt_neox"))
    assert "sliding windows: none" in report and "tied input/output embeddings: no" in report
    assert "shared prefill (rollout=hf): on" in report
    assert "rollout=vllm: refused (vLLM runs GPTNeoXForCausalLM through its Transformers backend" in report
    assert len(report.splitlines()) == 5


def test_hf_policy_build_logs_the_report(tmp_path, caplog):
    from lit_entropy.policy.hf_tiny import build_tiny_hf_policy
    from lit_entropy.policy.models import HFPolicy, TinyArch

    texts = ["two plus three is five", "seven minus four is three"] * 20
    path = build_tiny_hf_policy(tmp_path, texts, vocab_size=300,
                                arch=TinyArch(hidden_size=64, num_layers=1, intermediate_size=64))
    with caplog.at_level(logging.INFO, logger="lit_entropy.policy.models"):
        HFPolicy(name_or_path=str(path)).build()
    assert any(r.getMessage().startswith("model: qwen2 (Qwen2ForCausalLM)") for r in caplog.records)


def test_vllm_refuses_what_it_cannot_run_by_family():
    pytest.importorskip("vllm")
    transformers_backend = ms.vllm_refusal(tf.Olmo2Config(**SMALL, num_hidden_layers=2), "Olmo2ForCausalLM")
    assert "Transformers backend" in transformers_backend
    assert ms.vllm_refusal(tf.LlamaConfig(**SMALL, num_hidden_layers=2), "LlamaForCausalLM") is None
    moe = ms.vllm_refusal(tf.Qwen3MoeConfig(**SMALL, num_hidden_layers=2), "Qwen3MoeForCausalLM")
    assert (moe is None) == torch.cuda.is_available()


def test_vllm_engine_refuses_at_start_naming_the_family(tmp_path):
    pytest.importorskip("vllm")
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    path = save_tiny("olmo2", tmp_path)
    with pytest.raises(ValueError, match=r"rollout=vllm cannot run the olmo2 model .*use rollout=hf"):
        VLLMEngine(str(path), eos_id=2)


def test_checkpoint_names_are_the_saved_files_names(tmp_path):
    from safetensors import safe_open

    model = tiny_model("qwen3_moe")
    model.save_pretrained(str(tmp_path))
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    items = ms.checkpoint_items(model, list(model.state_dict().items()), engine_names=set())
    assert {name for name, _ in items} == saved  # fused experts split back into one tensor per expert
    gemma = tiny_model("gemma2")
    state = list(gemma.state_dict().items())
    assert "lm_head.weight" in dict(state)
    assert "lm_head.weight" not in dict(ms.checkpoint_items(gemma, state, engine_names=set()))
    assert "lm_head.weight" in dict(ms.checkpoint_items(gemma, state, engine_names={"lm_head.weight"}))
    assert "lm_head.weight" in dict(ms.checkpoint_items(gemma, state))  # engine unknown: keep it


def test_dropout_is_switched_off_without_drawing_random_numbers():
    model = tiny_model("gpt2")  # GPT2Config, like GPT-2 checkpoints, drops 0.1 of attention, residuals, embeddings
    ids = torch.randint(3, 96, (2, 9))
    with torch.no_grad():
        reference = model(input_ids=ids).logits  # eval mode
        model.train()
        assert not torch.equal(model(input_ids=ids).logits, reference)
        assert ms.disable_dropout(model) == [0.1]
        state = torch.random.get_rng_state()
        assert torch.equal(model(input_ids=ids).logits, reference)
        assert torch.equal(torch.random.get_rng_state(), state)
    assert model.config.attn_pdrop == model.config.resid_pdrop == model.config.embd_pdrop == 0.0
    assert ms.disable_dropout(tiny_model("llama")) == []


def test_hf_policy_loads_gpt2_without_dropout(tmp_path, caplog):
    from lit_entropy.policy.models import HFPolicy
    from lit_entropy.policy.tokenizer import CharTokenizer

    save_tiny("gpt2", tmp_path)
    CharTokenizer.for_countdown().to_hf().save_pretrained(str(tmp_path))
    with caplog.at_level(logging.INFO, logger="lit_entropy.policy.models"):
        model = HFPolicy(name_or_path=str(tmp_path)).build().model
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert any("dropout: off (the checkpoint's [0.1])" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("family", FAMILIES)
def test_fsdp2_finds_every_familys_decoder_layers(family):
    model = tiny_model(family)
    layers = decoder_layers(model)
    assert len(layers) == ms.text_config(model).num_hidden_layers
    assert all(type(layer).__name__ in model._no_split_modules for layer in layers)


def test_fsdp2_layers_are_not_a_longer_list_of_experts():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(8))

    class Model(torch.nn.Module):
        _no_split_modules = ["Block"]

        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList(Block() for _ in range(2))

    model = Model()
    assert decoder_layers(model) == list(model.layers)
    del Model._no_split_modules
    assert len(decoder_layers(model)) == 8  # without the declaration: the largest ModuleList
