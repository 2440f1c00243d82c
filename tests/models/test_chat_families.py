"""Per family: ``data.chat_template`` renders the family's prompt format through the package's path
(:meth:`RolloutDataModule.encode_prompt`, :class:`HFTokenizerAdapter`), and stop strings cut completions
decoded by the family's kind of tokenizer (:func:`truncate_at_stop`, as the sampler calls it)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from lit_entropy.data.rollout_datamodule import RolloutDataModule
from lit_entropy.policy.models import HFTokenizerAdapter
from lit_entropy.rollout.base import Generation, truncate_at_stop
from lit_entropy.tasks.prompts import CountdownPrompts
from tests.models.chat_tokenizers import FORMATS, chat_tokenizer
from tests.models.families import FAMILIES

USER, SYSTEM = "What is 2+3?", "Be brief."
COMPLETION = " Let me think: 2+3 ≈ 5, café.</answer> And then more"
"""Characters outside the tokenizers' training text (byte tokens, split characters) before the stop."""


@pytest.mark.parametrize("family", FAMILIES)
def test_chat_template_renders_the_familys_prompt(family):
    fmt, tok = FORMATS[family], HFTokenizerAdapter(chat_tokenizer(family))
    dm = RolloutDataModule(CountdownPrompts(), chat_template=True, system_prompt=SYSTEM)
    if fmt.template is None:  # base-model families: refused at start, before any prompt is encoded
        with pytest.raises(ValueError, match="chat_template=true needs a tokenizer with a chat template"):
            dm.start(SimpleNamespace(tokenizer=tok))
        return
    expected = fmt.rendered
    if expected is None:  # Gemma 2's template refuses a system turn (data.system_prompt); without one it renders
        with pytest.raises(Exception, match="System role not supported"):
            dm.encode_prompt(tok, USER)
        dm.system_prompt = None
        expected = f"<bos><start_of_turn>user\n{USER}<end_of_turn>\n<start_of_turn>model\n"
    ids = dm.encode_prompt(tok, USER)
    assert tok.decode(ids, skip_special=False) == expected
    assert USER in tok.decode(ids)
    for special in dict.fromkeys([fmt.bos, fmt.eos, *fmt.turn_tokens]):  # each one token, BOS not doubled
        assert ids.count(tok.hf.convert_tokens_to_ids(special)) == expected.count(special), special


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("stop", ["</answer>", "≈", "é."])
def test_stop_strings_cut_completions_decoded_by_the_familys_tokenizer(family, stop):
    tok = HFTokenizerAdapter(chat_tokenizer(family))
    ids = tok.encode(COMPLETION) + [tok.eos_id]
    assert tok.decode(ids) == COMPLETION
    gen = Generation(token_ids=ids, logprobs=[-0.01 * i for i in range(len(ids))], truncated=True)
    cut = truncate_at_stop(gen, tok.decode, [stop])
    n = len(cut.token_ids)
    assert cut.token_ids == ids[:n] and cut.logprobs == gen.logprobs[:n] and not cut.truncated
    text = tok.decode(cut.token_ids)
    end = COMPLETION.index(stop) + len(stop)
    assert stop not in tok.decode(ids[:n - 1]) and COMPLETION.startswith(text) and len(text) >= end
    assert len(tok.decode(ids[:n - 1]).replace("\ufffd", "")) < end  # cut at the token that completes the stop
