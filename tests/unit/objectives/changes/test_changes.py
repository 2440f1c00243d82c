"""The registry of per-token surrogate changes (lit_entropy/objectives/changes/): its entries, their settings, and
adding one (the worked example of docs/objectives.md)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import changes
from lit_entropy.objectives.changes import SurrogateChange
from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.policy_loss import aggregate
from tests.unit.objectives.test_objective import logp_entropy, make_minibatch


def test_archer_simko_and_erc_are_registered_by_their_files():
    assert {"archer", "erc", "simko"} <= set(changes.CHANGES)
    assert changes.topk(AlgoConfig(simko={"k": 4})) == 4 and changes.topk(AlgoConfig()) == 0
    assert [c.name for c, _ in changes.active(AlgoConfig(erc={"low": 0.1, "high": 0.1}))] == ["erc"]


@pytest.mark.parametrize(("key", "bad"), [("archer", {"quantile": 2.0}), ("simko", {"kk": 3}), ("erc", {"lo": 0.1})])
def test_a_bad_setting_names_its_key(key, bad):
    with pytest.raises(ValueError, match=f"algo.{key}"):
        AlgoConfig(**{key: bad})


# ------------------------------------------------------------------ the worked example of docs/objectives.md


@dataclass(frozen=True)
class LowProbClipArgs:
    p_min: float = 0.01
    eps: float = 0.1


def split(args, mb, kept, loss_mask):
    """Over the whole minibatch: the kept response tokens below probability p_min."""
    return {"low_prob": kept & (mb["old_logp"] < math.log(args.p_min))}


def own_clip_range(args, loss_tok, info, clipped, logp, advantages, prepared):
    """Those tokens' surrogate at the clip range (eps, eps); the others' as it was."""
    low = prepared["low_prob"]
    loss_low, info_low = clipped(logp, advantages, args.eps, args.eps)
    return torch.where(low, loss_low, loss_tok), {k: torch.where(low, info_low[k], v) for k, v in info.items()}


@pytest.fixture
def low_prob_clip(monkeypatch):
    change = SurrogateChange("low_prob_clip", LowProbClipArgs, prepare=split, surrogate=own_clip_range)
    monkeypatch.setitem(changes.CHANGES, "low_prob_clip", change)
    return change


def test_a_new_change_is_a_file_and_a_yaml(low_prob_clip):
    algo = AlgoConfig(surrogate_changes={"low_prob_clip": {"p_min": 0.1, "eps": 0.05}})
    assert algo.surrogate_changes["low_prob_clip"] == LowProbClipArgs(0.1, 0.05)
    mb, model = make_minibatch()
    logp, ent = logp_entropy(model, mb["input_ids"])
    logp = logp + 0.3 * torch.randn_like(logp)  # ratios off 1, so that the two clip ranges differ
    knobs = Knobs(0.2, 0.2)
    sel = select_tokens(algo, mb, knobs)
    mask = mb["response_mask"]
    low = sel.prepared["low_prob"]
    assert torch.equal(low, mask & (mb["old_logp"] < math.log(0.1))) and 0 < int(low.sum()) < int(mask.sum())
    loss, _ = micro_batch_loss(algo, knobs, mb, sel, logp, ent)
    adv = mb["token_advantages"]
    plain, _ = clipped_surrogate(logp, mb["old_logp"], adv, 0.2, 0.2, None, mask=mask)
    tight, _ = clipped_surrogate(logp, mb["old_logp"], adv, 0.05, 0.05, None, mask=mask)
    expected = aggregate(torch.where(low, tight, plain), mask, "token-mean", num_tokens=mask.sum())
    assert torch.allclose(loss, expected, atol=1e-6)
    base, _ = micro_batch_loss(AlgoConfig(), knobs, mb, select_tokens(AlgoConfig(), mb, knobs), logp, ent)
    assert not torch.allclose(loss, base)  # the change acted


def test_a_new_change_is_checked_at_start_up(low_prob_clip):
    with pytest.raises(ValueError, match="algo.low_prob_clip"):
        AlgoConfig(surrogate_changes={"low_prob_clip": {"p_max": 0.3}})
    with pytest.raises(ValueError, match="algo.surrogate_changes"):
        AlgoConfig(surrogate_changes={"no_such_change": {}})
    with pytest.raises(ValueError, match="algo.surrogate_changes"):
        AlgoConfig(surrogate_changes={"archer": {}})  # has its own key
    with pytest.raises(ValueError, match="algo.low_prob_clip changes the per-token PPO surrogate"):
        AlgoConfig(loss="cispo", surrogate_changes={"low_prob_clip": {}})
