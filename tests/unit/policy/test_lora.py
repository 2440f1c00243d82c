"""LoRA: config validation, adapters-only training, merged weights for the engine, adapters-off reference."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_entropy.policy.lora import LoRAConfig, apply_lora, as_lora_config, is_peft, merged_state_items
from lit_entropy.policy.models import TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer


def tiny_model() -> torch.nn.Module:
    tok = CharTokenizer.for_countdown()
    return build_tiny_qwen2(tok.vocab_size, TinyArch(hidden_size=64, num_layers=2, intermediate_size=96), tok)


def test_bad_lora_settings_name_themselves():
    with pytest.raises(ValueError, match="model.lora.r"):
        LoRAConfig(r=0)
    with pytest.raises(ValueError, match="unknown keys.*rank"):
        as_lora_config({"rank": 4})
    with pytest.raises(ValueError, match="not modules of this model"):
        apply_lora(tiny_model(), LoRAConfig(target_modules=["qkv"]))


def test_merged_weights_equal_peft_merge_and_keep_the_base_names():
    base = tiny_model()
    names = list(base.state_dict())
    model = apply_lora(base, LoRAConfig(r=4, alpha=8))
    assert is_peft(model) and not is_peft(tiny_model())
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # fresh adapters have B = 0; give them something to merge
    ours = dict(merged_state_items(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(ours) == names == list(reference)
    for name in names:
        assert torch.allclose(ours[name], reference[name], atol=1e-6), name
    ids = torch.randint(0, 20, (2, 7))
    plain = tiny_model()
    plain.load_state_dict(ours)
    assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)
    # The trainer's own weights are untouched: no in-place merge.
    assert not any("lora" in n for n in names)
    with model.disable_adapter():
        off = model(input_ids=ids).logits
    assert not torch.allclose(off, model(input_ids=ids).logits)


def test_only_adapters_get_gradients_and_optimizer_state():
    from types import SimpleNamespace

    from lit_entropy.algo import AlgoConfig
    from lit_entropy.module import PolicyModule

    model = apply_lora(tiny_model(), LoRAConfig(r=2))
    module = PolicyModule(SimpleNamespace(model=model, tokenizer=None, path="unused"), algo=AlgoConfig(kl_coef=0.05))
    opt = module.configure_optimizers()["optimizer"]
    trained = {id(p) for group in opt.param_groups for p in group["params"]}
    named = dict(module.named_parameters())
    assert trained == {id(p) for n, p in named.items() if "lora_" in n}
    assert module.ref_model is None  # with kl_coef > 0 the reference is the adapters-off model, not a copy
