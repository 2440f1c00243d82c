"""A tiny policy in Hugging Face format with a real trained tokenizer and a chat template, built locally.

It stands in for a hub model in tests and on machines without a network: ``model=hf
model.name_or_path=<dir>`` loads it like any Hugging Face causal LM (``from_pretrained``), vLLM loads
the same folder, and the tokenizer has what real instruct models have — byte-level BPE trained with the
``tokenizers`` library on the given texts (e.g. GSM8K), special tokens and a Jinja chat template.
``scripts/make_tiny_hf.py`` builds one from the local GSM8K JSONL (docs/design.md §11). The weights are
random: it exercises the plumbing, not reasoning.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from lit_entropy.policy.models import HFTokenizerAdapter, TinyArch, build_tiny_qwen2

SPECIAL_TOKENS = ["<|endoftext|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Each message as ``<|role|>\\ncontent<|end|>``; the assistant's turn ends with ``<|end|>`` (its EOS)."""


def build_tiny_hf_policy(out_dir: str | Path, texts: Iterable[str], vocab_size: int = 512,
                         arch: TinyArch | None = None, seed: int = 0) -> Path:
    """Train the tokenizer on ``texts``, build a random tiny Qwen2 for it, ``save_pretrained`` both."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    out = Path(out_dir)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<|endoftext|>", eos_token="<|end|>",
                                  pad_token="<|pad|>")
    tok.chat_template = CHAT_TEMPLATE
    arch = arch or TinyArch(hidden_size=128, num_layers=2, max_position_embeddings=512)
    model = build_tiny_qwen2(len(tok), arch, HFTokenizerAdapter(tok), seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(out))
    model.save_pretrained(str(out), safe_serialization=True)
    return out
