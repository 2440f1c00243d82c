"""The arithmetic task's wordings (lit_entropy.tasks.arithmetic_text): every style and phrasing carries the
problem's numbers in order, and the config refuses what cannot be worded. The generator and the verifier:
test_arithmetic.py."""

from __future__ import annotations

import re

import pytest

from lit_entropy.tasks.arithmetic import ArithmeticConfig, generate_problems
from tests.unit.tasks.test_arithmetic import DEFAULT_TASK


def test_styles_and_wordings():
    cfg = ArithmeticConfig(**{**DEFAULT_TASK, "num_operands": [3, 3]})
    texts = [p.text for p in generate_problems(400, 0, cfg)]
    assert any(t.startswith(("Start", "Take", "Begin", "Think")) for t in texts)  # steps
    assert any("How many" in t for t in texts) and any(" + " in t or " - " in t for t in texts)
    for p in generate_problems(200, 1, cfg):
        assert [int(x) for x in re.findall(r"\d+", p.text)] == list(p.operands)  # the numbers, in order, no others
    for bad in ({"style": "story", "ops": "+*"}, {"style": ["expression", "poem"]}, {"phrasing": "odd"},
                {"held_out_fraction": 1.0}, {"num_operands": [3, 2]}, {"transfer_extra_operands": 0}):
        with pytest.raises(ValueError):
            ArithmeticConfig(**bad)
