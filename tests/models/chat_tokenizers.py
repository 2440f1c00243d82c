"""Each family's tokenizer kind and chat-template format, built locally (no downloads).

Two tokenizer kinds cover the families: byte-level BPE (GPT-2, GPT-NeoX, Qwen, Llama 3, OLMo 2: every
byte is a token, a character can be split across tokens) and SentencePiece-style BPE (Mistral, Phi-3,
Gemma: ``▁`` marks spaces, characters outside the vocabulary fall back to ``<0xNN>`` byte tokens). Each
gets its family's special tokens and a chat template of its instruct models' format, shortened but with
their system-turn behaviour (Mistral and Gemma 3 fold the system turn into a user turn, Gemma 2 refuses
one). GPT-2 and GPT-NeoX checkpoints have no chat template, so theirs get none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

CORPUS = ["What is 2+3? The answer is 5.", "Be brief. Think step by step, then answer.",
          "<answer>42</answer> and more text", "Natalia sold clips to 48 of her friends in April."] * 20

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
LLAMA3 = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
          "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
          "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
MISTRAL = ("{{ bos_token }}{% set system = messages[0]['content'] + '\n\n' if messages[0]['role'] == 'system' "
           "else '' %}{% for m in messages if m['role'] != 'system' %}{% if m['role'] == 'user' %}"
           "[INST] {{ system if loop.last else '' }}{{ m['content'] }}[/INST]"
           "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
_GEMMA_TURNS = ("{% for m in messages if m['role'] != 'system' %}<start_of_turn>"
                "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ first if loop.first else '' }}"
                "{{ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
                "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
GEMMA2 = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
          "supported') }}{% endif %}{% set first = '' %}" + _GEMMA_TURNS)
GEMMA3 = ("{{ bos_token }}{% set first = messages[0]['content'] + '\n\n' if messages[0]['role'] == 'system' "
          "else '' %}" + _GEMMA_TURNS)
PHI3 = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
OLMO2 = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
         "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@dataclass(frozen=True)
class ChatFormat:
    kind: str
    """``byte`` (byte-level BPE) or ``sentencepiece`` (``▁`` spaces, byte fallback)."""
    bos: str
    eos: str
    template: str | None
    turn_tokens: tuple[str, ...] = ()
    """Special tokens of the template besides BOS and EOS."""
    rendered: str | None = None
    """The prompt the template renders for system ``Be brief.`` and user ``What is 2+3?`` (None: refused)."""


_QWEN = ChatFormat("byte", "<|endoftext|>", "<|im_end|>", CHATML, ("<|im_start|>",),
                   "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
                   "<|im_start|>assistant\n")
_GEMMA_PROMPT = "<bos><start_of_turn>user\nBe brief.\n\nWhat is 2+3?<end_of_turn>\n<start_of_turn>model\n"
FORMATS = {
    "llama": ChatFormat("byte", "<|begin_of_text|>", "<|eot_id|>", LLAMA3, ("<|start_header_id|>", "<|end_header_id|>"),
                        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n"),
    "qwen2": _QWEN, "qwen2_tied": _QWEN, "qwen3": _QWEN, "qwen3_moe": _QWEN,
    "mistral": ChatFormat("sentencepiece", "<s>", "</s>", MISTRAL, ("[INST]", "[/INST]"),
                          "<s>[INST] Be brief.\n\nWhat is 2+3?[/INST]"),
    "gemma2": ChatFormat("sentencepiece", "<bos>", "<eos>", GEMMA2, ("<start_of_turn>", "<end_of_turn>"), None),
    "gemma3_text": ChatFormat("sentencepiece", "<bos>", "<eos>", GEMMA3, ("<start_of_turn>", "<end_of_turn>"),
                              _GEMMA_PROMPT),
    "phi3": ChatFormat("sentencepiece", "<s>", "<|end|>", PHI3, ("<|system|>", "<|user|>", "<|assistant|>"),
                       "<|system|>\nBe brief.<|end|>\n<|user|>\nWhat is 2+3?<|end|>\n<|assistant|>\n"),
    "olmo2": ChatFormat("byte", "<|endoftext|>", "<|endoftext|>", OLMO2, ("<|system|>", "<|user|>", "<|assistant|>"),
                        "<|endoftext|><|system|>\nBe brief.\n<|user|>\nWhat is 2+3?\n<|assistant|>\n"),
    "gpt2": ChatFormat("byte", "<|endoftext|>", "<|endoftext|>", None),
    "gpt_neox": ChatFormat("byte", "<|endoftext|>", "<|endoftext|>", None),
}


@cache
def chat_tokenizer(family: str):
    """A ``PreTrainedTokenizerFast`` of ``family``'s kind, special tokens and chat template (shared: do not
    modify it)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fmt = FORMATS[family]
    specials = list(dict.fromkeys([fmt.bos, fmt.eos, *fmt.turn_tokens]))
    if fmt.kind == "byte":
        bpe = Tokenizer(models.BPE())
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        bpe = Tokenizer(models.BPE())
        bpe.normalizer = normalizers.Replace(" ", "▁")
        bpe.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
        alphabet = []
    bpe.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=specials,
                                                        initial_alphabet=alphabet, show_progress=False))
    if fmt.kind == "sentencepiece":  # the 256 byte tokens join the model's vocabulary, as in SentencePiece
        spec = json.loads(bpe.to_str())
        vocab = spec["model"]["vocab"]
        for b in range(256):
            vocab.setdefault(f"<0x{b:02X}>", len(vocab))
        spec["model"]["byte_fallback"] = True
        bpe = Tokenizer.from_str(json.dumps(spec))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=fmt.bos, eos_token=fmt.eos)
    tok.chat_template = fmt.template
    return tok
