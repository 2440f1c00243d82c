"""CharTokenizer: ids, round trips, persistence and parity with its Hugging Face twin."""

from __future__ import annotations

import json
import random

import pytest

from lit_entropy.policy.tokenizer import TOKENIZER_FILE, CharTokenizer
from lit_entropy.tasks.countdown import COUNTDOWN_ALPHABET


@pytest.fixture
def tok() -> CharTokenizer:
    return CharTokenizer.for_countdown()


def test_special_ids_and_vocab(tok):
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok.vocab_size == len(tok) == 4 + len(COUNTDOWN_ALPHABET)
    assert tok.encode(COUNTDOWN_ALPHABET) == list(range(4, tok.vocab_size))
    assert tok.encode("12", add_bos=True) == [tok.bos_id, 5, 6]


def test_round_trip_random_strings(tok):
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice(COUNTDOWN_ALPHABET) for _ in range(rng.randint(0, 40)))
        ids = tok.encode(text)
        assert len(ids) == len(text)
        assert all(4 <= i < tok.vocab_size for i in ids)
        assert tok.decode(ids) == text


def test_unknown_chars_and_special_ids_in_decode(tok):
    assert tok.encode("1a2") == [5, tok.unk_id, 6]
    ids = [tok.bos_id, *tok.encode("3+4"), tok.eos_id, tok.pad_id, tok.pad_id]
    assert tok.decode(ids) == "3+4"
    assert tok.decode(ids, skip_special=False) == "<bos>3+4<eos><pad><pad>"
    assert tok.decode([tok.vocab_size + 5, 5]) == "1"  # past the vocabulary (padded model head)
    assert tok.decode([-1, 5], skip_special=False) == "<unk>1"


def test_bad_alphabets_rejected():
    for bad in ["", "aa", None]:
        with pytest.raises(ValueError):
            CharTokenizer(bad)


def test_save_and_load(tmp_path):
    tok = CharTokenizer("xyz\n ")
    path = tok.save(tmp_path / "sub")
    assert path.name == TOKENIZER_FILE
    assert json.loads(path.read_text()) == {"alphabet": "xyz\n ", "version": 1}
    assert CharTokenizer.load(tmp_path / "sub") == tok
    with pytest.raises(FileNotFoundError, match=TOKENIZER_FILE):
        CharTokenizer.load(tmp_path)
    for content in ["{not json", json.dumps({"alphabet": "ab"}), json.dumps({"alphabet": "", "version": 1}),
                    json.dumps({"alphabet": "aa", "version": 1}), "[]"]:
        path.write_text(content)
        with pytest.raises(ValueError, match=TOKENIZER_FILE):
            CharTokenizer.load(tmp_path / "sub")


def test_to_hf_parity(tok, tmp_path):
    hf = tok.to_hf()
    assert (hf.pad_token_id, hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (0, 1, 2, 3)
    assert len(hf) == tok.vocab_size
    rng = random.Random(1)
    samples = ["3,5,2=16:(3+5)*2", "", "99+(1-2)/3"]
    samples += ["".join(rng.choice(COUNTDOWN_ALPHABET) for _ in range(30)) for _ in range(20)]
    for text in samples:
        assert hf.encode(text, add_special_tokens=False) == tok.encode(text)
        assert hf.encode(text) == tok.encode(text, add_bos=True)
        assert hf.decode(tok.encode(text, add_bos=True) + [tok.eos_id], skip_special_tokens=True) == text
    assert hf.encode("1a2", add_special_tokens=False) == tok.encode("1a2")
    # Newlines and spaces are single characters too (the pre-tokenizer splits every character).
    odd = CharTokenizer("a \nb")
    assert odd.to_hf().encode("a \n b", add_special_tokens=False) == odd.encode("a \n b")
    hf.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path).encode("3+4") == tok.encode("3+4", add_bos=True)
