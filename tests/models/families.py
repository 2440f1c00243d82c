"""Tiny random causal LMs of every supported family, built locally from ``transformers`` config classes.

Each is 2 layers (Gemma 3: 4, so that sliding and full layers both occur), width 64, head_dim 32 (vLLM's
CPU attention needs >= 32), a 96-token vocabulary. Sliding windows are 8 tokens where the family has
them, shorter than the test rows, so every window rule is exercised. No downloads.

``LIT_ENTROPY_TEST_DEVICE`` (e.g. ``cuda``) puts the models on that device, TF32 off, so that the same suite
checks the CUDA kernels (``scripts/gpu_check.sh``); unset, they stay on the CPU. The rows stay on the CPU as
the trainer's batches do; :mod:`tests.models.trainer_paths` moves them to the model's device.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

DEVICE_ENV = "LIT_ENTROPY_TEST_DEVICE"
VOCAB = 96
WINDOW = 8
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
              max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
LLAMA_LIKE = dict(COMMON, intermediate_size=96, num_key_value_heads=1, head_dim=32)


def _config(family: str):
    import transformers as tf

    builders: dict[str, Callable[[], object]] = {
        "llama": lambda: tf.LlamaConfig(**LLAMA_LIKE),
        "qwen2": lambda: tf.Qwen2Config(**LLAMA_LIKE, tie_word_embeddings=False),
        "qwen2_tied": lambda: tf.Qwen2Config(**LLAMA_LIKE, tie_word_embeddings=True),
        "qwen3": lambda: tf.Qwen3Config(**LLAMA_LIKE),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(**LLAMA_LIKE, num_experts=4, num_experts_per_tok=2,
                                               moe_intermediate_size=48),
        "mistral": lambda: tf.MistralConfig(**LLAMA_LIKE, sliding_window=WINDOW),
        "gemma2": lambda: tf.Gemma2Config(**LLAMA_LIKE, sliding_window=WINDOW, query_pre_attn_scalar=32),
        "gemma3_text": lambda: tf.Gemma3TextConfig(**dict(LLAMA_LIKE, num_hidden_layers=4), sliding_window=WINDOW,
                                                   sliding_window_pattern=2, query_pre_attn_scalar=32),
        "phi3": lambda: tf.Phi3Config(**{k: v for k, v in LLAMA_LIKE.items() if k != "head_dim"}),
        "olmo2": lambda: tf.Olmo2Config(**LLAMA_LIKE),
        "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=128,
                                      bos_token_id=1, eos_token_id=2, pad_token_id=0),
        "gpt_neox": lambda: tf.GPTNeoXConfig(**dict(COMMON, intermediate_size=96), rotary_pct=0.25),
    }
    return builders[family]()


FAMILIES = ["llama", "qwen2", "qwen2_tied", "qwen3", "qwen3_moe", "mistral", "gemma2", "gemma3_text", "phi3",
            "olmo2", "gpt2", "gpt_neox"]
"""Test names; ``qwen2`` and ``qwen2_tied`` are the same family with untied and tied embeddings."""
SLIDING = {"mistral", "gemma2", "gemma3_text"}
"""The test models with a window (8) shorter than the test rows."""


def suite_device() -> torch.device:
    """The device the suite's models run on: ``$LIT_ENTROPY_TEST_DEVICE``, else the CPU. On CUDA, TF32 matmuls
    and convolutions are turned off (the suite's fp32 tolerances are fp32 rounding)."""
    device = torch.device(os.environ.get(DEVICE_ENV) or "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # the legacy flags: mixing in the new API raises on read
        torch.backends.cudnn.allow_tf32 = False
    return device


def tiny_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A random fp32 model of ``family`` in eval mode (the library's default attention), on
    :func:`suite_device` (the weights are drawn on the CPU, so they are the same on every device)."""
    from transformers import AutoModelForCausalLM

    config = _config(family)

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        with torch.no_grad():  # some families initialise norms at 0 or 1 exactly: perturb them all a little
            for p in model.parameters():
                p.add_(0.02 * torch.randn_like(p))
    return model.to(suite_device()).eval()


def save_tiny(family: str, out: str | Path, seed: int = 0) -> Path:
    """``tiny_model(family)`` saved in Hugging Face format (what ``model=hf`` and vLLM load)."""
    out = Path(out)
    tiny_model(family, seed).save_pretrained(str(out), safe_serialization=True)
    return out


def grouped_rows(prompt_lens: tuple[int, ...] = (3, 5, 8, 11), max_response: int = 8, group: int = 3,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """Grouped right-padded ``[prompt][response][pad]`` rows, ``group`` per prompt, responses of 1 to
    ``max_response`` tokens (each group's first exactly ``max_response``). The defaults give rows of up to 19
    tokens, longer than every window of the tiny models; ``(2, 3, 5), 3`` gives rows of at most 8 (= WINDOW)."""
    g = torch.Generator().manual_seed(seed)
    rows, resp_lens = [], []
    for p in prompt_lens:
        prompt = torch.randint(3, VOCAB, (p,), generator=g).tolist()
        for j in range(group):
            n = max_response if j == 0 else int(torch.randint(1, max_response + 1, (1,), generator=g))
            rows.append(prompt + torch.randint(3, VOCAB, (n,), generator=g).tolist())
            resp_lens.append(n)
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attn = torch.zeros(len(rows), width, dtype=torch.long)
    resp = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, (r, n) in enumerate(zip(rows, resp_lens, strict=True)):
        ids[i, :len(r)] = torch.tensor(r)
        attn[i, :len(r)] = 1
        resp[i, len(r) - n:len(r)] = True
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp,
            "group_index": torch.arange(len(prompt_lens)).repeat_interleave(group)}


def sample_prompts(lengths: tuple[int, ...] = (3, 7, 11), seed: int = 1) -> list[list[int]]:
    """Random prompts of the given lengths (for the engines)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
