"""What every rollout engine shares (lit_entropy.rollout.base): a generation cut at its stop strings. The engines
themselves: tests/integration/rollout/."""

from __future__ import annotations

from lit_entropy.rollout.base import Generation, truncate_at_stop


def test_truncate_at_stop_cuts_after_the_completing_token():
    vocab = {1: "The", 2: " answer", 3: " is", 4: " 4", 5: "</", 6: "answer>", 7: " more"}
    decode = lambda ids: "".join(vocab[i] for i in ids)  # noqa: E731
    gen = Generation(token_ids=[1, 2, 3, 4, 5, 6, 7, 7], logprobs=[-0.1 * i for i in range(8)], truncated=True)
    cut = truncate_at_stop(gen, decode, ["</answer>"])
    assert cut.token_ids == [1, 2, 3, 4, 5, 6] and cut.logprobs == gen.logprobs[:6] and not cut.truncated
    assert truncate_at_stop(gen, decode, ["nowhere"]) is gen
    assert truncate_at_stop(gen, decode, ["answer", "is"]).token_ids == [1, 2]  # the earliest of several
