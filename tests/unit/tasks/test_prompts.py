"""Prompt templates: a JSONL source's named base-model template (R1-Zero), and a chat template that needs a
tokenizer that has one. DAPO's soft overlong punishment: tests/unit/rewards/test_shaping.py; stop strings:
tests/unit/rollout/test_base.py."""

from __future__ import annotations

import pytest

from lit_entropy.tasks.math_sources import R1_ZERO_TEMPLATE, JSONLPrompts


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
