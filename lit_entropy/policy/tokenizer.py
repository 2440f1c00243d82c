"""A character-level tokenizer built locally (nothing downloaded), for the Countdown lab policy.

Ids: ``<pad>``=0, ``<bos>``=1, ``<eos>``=2, ``<unk>``=3, then one id per alphabet character in order.
`CharTokenizer.to_hf` gives a `transformers.PreTrainedTokenizerFast` with the same ids, for engines
(vLLM) and checkpoints that expect a Hugging Face tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")
TOKENIZER_FILE = "char_tokenizer.json"
_FORMAT_VERSION = 1


class CharTokenizer:
    def __init__(self, alphabet: str) -> None:
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
        if len(set(alphabet)) != len(alphabet):
            raise ValueError(f"alphabet has repeated characters: {alphabet!r}")
        self._alphabet = alphabet
        self._tokens = list(SPECIAL_TOKENS) + list(alphabet)
        self._char_to_id = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(alphabet)}

    @classmethod
    def for_countdown(cls) -> CharTokenizer:
        from lit_entropy.tasks.countdown import COUNTDOWN_ALPHABET

        return cls(COUNTDOWN_ALPHABET)

    @property
    def alphabet(self) -> str:
        return self._alphabet

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def unk_id(self) -> int:
        return 3

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"CharTokenizer(alphabet={self._alphabet!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other._alphabet == self._alphabet

    def __hash__(self) -> int:
        return hash(self._alphabet)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """One id per character; characters outside the alphabet map to `unk_id`."""
        ids = [self._char_to_id.get(ch, self.unk_id) for ch in text]
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """Text of `ids` (does not stop at EOS). Ids outside the vocabulary (a model head padded past
        `vocab_size`) count as ``<unk>``; special ids are dropped when `skip_special`, else rendered."""
        n_special = len(SPECIAL_TOKENS)
        parts = []
        for raw in ids:
            i = int(raw)
            if not 0 <= i < len(self._tokens):
                i = self.unk_id
            if i < n_special:
                if not skip_special:
                    parts.append(self._tokens[i])
            else:
                parts.append(self._tokens[i])
        return "".join(parts)

    def save(self, directory: str | Path) -> Path:
        """Write ``char_tokenizer.json`` into `directory` (created if needed); returns its path."""
        path = Path(directory) / TOKENIZER_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"alphabet": self._alphabet, "version": _FORMAT_VERSION}), encoding="utf-8")
        return path

    @classmethod
    def load(cls, directory: str | Path) -> CharTokenizer:
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no character tokenizer at {path}")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"malformed tokenizer file {path}: {err}") from err
        if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"malformed tokenizer file {path}: expected version {_FORMAT_VERSION}")
        alphabet = data.get("alphabet")
        if not isinstance(alphabet, str) or not alphabet:
            raise ValueError(f"malformed tokenizer file {path}: 'alphabet' must be a non-empty string")
        try:
            return cls(alphabet)
        except ValueError as err:
            raise ValueError(f"malformed tokenizer file {path}: {err}") from err

    def to_hf(self) -> PreTrainedTokenizerFast:
        """An equivalent Hugging Face fast tokenizer (same ids; adds BOS with `add_special_tokens`)."""
        from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers, processors
        from tokenizers.models import WordLevel
        from transformers import PreTrainedTokenizerFast

        pad, bos, eos, unk = SPECIAL_TOKENS
        tok = Tokenizer(WordLevel(vocab={t: i for i, t in enumerate(self._tokens)}, unk_token=unk))
        # Every character is its own pre-token; `[\s\S]` (not `.`) so newlines are matched too.
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=Regex(r"[\s\S]"), behavior="isolated")
        tok.decoder = decoders.Fuse()
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, self.bos_id)]
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, pad_token=pad, bos_token=bos, eos_token=eos, unk_token=unk
        )
