"""Prompt encoding with chat templates, stop strings, DAPO's soft overlong punishment."""

from __future__ import annotations

import pytest

from lit_entropy.rewards.shaping import soft_overlong_penalty
from lit_entropy.rollout.base import Generation, truncate_at_stop
from lit_entropy.tasks.math_sources import R1_ZERO_TEMPLATE, JSONLPrompts


def test_soft_overlong_penalty_follows_dapo():
    # max 20 tokens, buffer 4: free up to 16, then -0.25 per token, -1 at 20.
    assert [soft_overlong_penalty(n, 20, 4) for n in (1, 16, 17, 18, 19, 20)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert soft_overlong_penalty(18, 20, 4, factor=2.0) == -1.0
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(5, 20, 0)


def test_truncate_at_stop_cuts_after_the_completing_token():
    vocab = {1: "The", 2: " answer", 3: " is", 4: " 4", 5: "</", 6: "answer>", 7: " more"}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    gen = Generation(token_ids=[1, 2, 3, 4, 5, 6, 7, 7], logprobs=[-0.1 * i for i in range(8)], truncated=True)
    cut = truncate_at_stop(gen, decode, ["</answer>"])
    assert cut.token_ids == [1, 2, 3, 4, 5, 6] and cut.logprobs == gen.logprobs[:6] and not cut.truncated
    assert truncate_at_stop(gen, decode, ["nowhere"]) is gen
    assert truncate_at_stop(gen, decode, ["answer", "is"]).token_ids == [1, 2]  # the earliest of several


def test_r1_zero_template_is_a_named_base_model_template(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    prompt = JSONLPrompts(data, template="r1_zero", shuffle=False).all_prompts()[0]
    assert prompt.text == R1_ZERO_TEMPLATE.replace("{question}", "1+1?") and prompt.text.endswith("<think>")


def test_chat_template_needs_a_tokenizer_that_has_one():
    from types import SimpleNamespace

    from lit_entropy.data.rollout_datamodule import RolloutDataModule
    from lit_entropy.policy.tokenizer import CharTokenizer
    from lit_entropy.rewards.config import RewardConfig
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.sampler import Sampler
    from lit_entropy.tasks.prompts import CountdownPrompts

    dm = RolloutDataModule(CountdownPrompts(), chat_template=True)
    with pytest.raises(ValueError, match="chat_template"):
        dm.start(SimpleNamespace(tokenizer=CharTokenizer.for_countdown()))
    with pytest.raises(ValueError, match="overlong_buffer"):
        Sampler(None, SamplingConfig(max_new_tokens=8), RewardConfig(overlong_buffer=9))
