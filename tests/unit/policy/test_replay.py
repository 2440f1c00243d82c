"""lit_entropy.policy.replay: the sampler's top-k / top-p kept set and the renormalised log-probs and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.policy import passes, replay
from lit_entropy.rollout.base import Generation, SamplingConfig, truncate_at_stop

PROBS = [0.5, 0.3, 0.15, 0.05]


def logits(*rows: list[float]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32).log()


def kept(*args, **kw) -> list[int]:
    return replay.kept_mask(*args, **kw)[0].nonzero().flatten().tolist()


def test_kept_set_by_hand():
    z = logits(PROBS)
    # Ascending cumulative mass 0.05, 0.20, 0.50, 1: top_p = 0.75 drops those <= 0.25.
    assert kept(z, top_p=0.75) == [0, 1]
    assert kept(z, top_p=1.0) == [0, 1, 2, 3]
    assert kept(z, top_k=3) == [0, 1, 2]
    # Top-k first, then top-p on the survivors renormalised: 0.15 / 0.95 = 0.158 <= 1 - 0.8 goes too.
    assert kept(z, top_p=0.8, top_k=3) == [0, 1]
    assert kept(z, top_p=0.97) == [0, 1, 2, 3]  # 0.05 > 0.03 stays
    # The sampled token always stays; a reported count overrides the rule.
    assert kept(z, top_p=0.75, sampled=torch.tensor([3])) == [0, 1, 3]
    assert kept(z, top_p=0.75, kept_count=torch.tensor([3])) == [0, 1, 2]
    assert kept(z, top_p=0.75, kept_count=torch.tensor([0])) == [0, 1]  # 0: unknown, the rule applies
    assert kept(z, top_p=0.01) == [0]  # at least one token


def test_truncated_log_softmax_and_entropy_by_hand():
    z = logits(PROBS)
    lp = replay.truncated_log_softmax(z, top_p=0.75)
    assert lp[0, :2].tolist() == pytest.approx([math.log(0.5 / 0.8), math.log(0.3 / 0.8)], abs=1e-6)
    assert torch.isinf(lp[0, 2:]).all()
    # The differentiable path the trainer uses: Forward.stats on masked logits, at a temperature.
    T = 0.5
    raw = (z * T).view(1, 1, 4).requires_grad_(True)  # raw / T = z
    fwd = passes.Forward(model=None, micro_batch_size=1, temperature=T, top_p=0.75)
    out = fwd.stats(raw, torch.tensor([[1]]), lambda v: v)
    logp, ent = out.logp, out.entropy
    q = torch.tensor([0.5, 0.3]) / 0.8
    assert float(logp.detach()) == pytest.approx(math.log(0.3 / 0.8), abs=1e-6)
    assert float(ent.detach()) == pytest.approx(float(-(q * q.log()).sum()), abs=1e-6)
    # Its gradient is the truncated distribution's: nothing flows to the dropped logits.
    (logp + ent).sum().backward()
    ref = (z * T).view(1, 1, 4).requires_grad_(True)
    tl = (ref[0, 0] / T).masked_fill(torch.tensor([False, False, True, True]), float("-inf")).log_softmax(-1)
    p = tl[:2].exp()
    (tl[1] - (p * tl[:2]).sum()).backward()
    assert torch.allclose(raw.grad, ref.grad, atol=1e-6)
    assert raw.grad[0, 0, 2:].abs().max() == 0


def test_full_entropy_and_the_default_path_is_untouched():
    z = logits(PROBS).view(1, 1, 4)
    assert replay.truncate_logits(z, torch.zeros(1, 1, dtype=torch.long)) is z  # no truncation: same tensor
    fwd = passes.Forward(model=None, micro_batch_size=1, top_p=0.75)
    out = fwd.stats(z, torch.tensor([[0]]), lambda v: v, with_full_entropy=True)
    ent, full = out.entropy, out.full_entropy
    p = torch.tensor(PROBS)
    assert float(full) == pytest.approx(float(-(p * p.log()).sum()), abs=1e-6)
    assert float(ent) < float(full)
    plain = passes.Forward(model=None, micro_batch_size=1)
    assert not plain.replays and fwd.replays
    logp = plain.stats(z, torch.tensor([[0]]), lambda v: v).logp
    assert float(logp) == pytest.approx(math.log(0.5), abs=1e-6)


@pytest.mark.parametrize(("top_p", "top_k"), [(0.9, 0), (0.6, 0), (1.0, 5), (0.8, 7), (0.95, 3)])
def test_kept_set_is_the_samplers(top_p, top_k):
    """The same set as transformers' warpers (temperature, top-k, top-p) and, where installed, vLLM's."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    gen = torch.Generator().manual_seed(0)
    z = torch.randn(64, 40, generator=gen) * 3
    ours = replay.kept_mask(z, top_p, top_k)
    scores = z.clone()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    assert torch.equal(ours, torch.isfinite(scores))
    try:
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
    except Exception:  # noqa: BLE001 - vLLM is optional
        return
    k = torch.full((64,), top_k, dtype=torch.long) if top_k else None
    p = torch.full((64,), top_p) if top_p < 1 else None
    assert torch.equal(ours, torch.isfinite(apply_top_k_top_p_pytorch(z.clone(), k, p)))


def test_sampling_config_knobs_default_off_and_are_checked():
    s = SamplingConfig()
    assert s.top_k == 0 and s.sync_every == 1 and s.temperature_error == 0.0 and s.engine_temperature == 1.0
    assert SamplingConfig(temperature=0.7, temperature_error=0.2).engine_temperature == pytest.approx(0.9)
    for bad in ({"top_k": -1}, {"sync_every": 0}, {"temperature": 0.5, "temperature_error": -0.5}):
        with pytest.raises(ValueError):
            SamplingConfig(**bad)


def test_stop_strings_cut_the_kept_sizes_too():
    gen = Generation(token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3], truncated=True, kept=[4, 5, 6])
    cut = truncate_at_stop(gen, lambda ids: "".join("ab!"[i - 1] for i in ids), ["b"])
    assert cut.token_ids == [1, 2] and cut.kept == [4, 5]
