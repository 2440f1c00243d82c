"""Reward shaping (lit_entropy.rewards.shaping): DAPO's soft overlong punishment."""

from __future__ import annotations

import pytest

from lit_entropy.rewards.shaping import soft_overlong_penalty


def test_soft_overlong_penalty_follows_dapo():
    # max 20 tokens, buffer 4: free up to 16, then -0.25 per token, -1 at 20.
    assert [soft_overlong_penalty(n, 20, 4) for n in (1, 16, 17, 18, 19, 20)] == [0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert soft_overlong_penalty(18, 20, 4, factor=2.0) == -1.0
    with pytest.raises(ValueError, match="buffer"):
        soft_overlong_penalty(5, 20, 0)
