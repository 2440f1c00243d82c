"""Per-token advantage shaping (lit_entropy/objectives/token_shaping/) against hand-computed groups."""

import math

import pytest
import torch

from lit_entropy.objectives import token_shaping as ts
from lit_entropy.objectives.advantages.grpo import grpo
from lit_entropy.objectives.token_shaping.entropy_adv import entropy_advantage
from lit_entropy.objectives.token_shaping.grpo_s import grpo_s
from lit_entropy.objectives.token_shaping.gtpo import gtpo

NAN = float("nan")


def _rows(entropies: list[list[float]], width: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows: one prompt token (column 0), then the response entropies, then padding (NaN)."""
    h = torch.full((len(entropies), width), NAN)
    mask = torch.zeros(len(entropies), width, dtype=torch.bool)
    for i, row in enumerate(entropies):
        h[i, 1 : 1 + len(row)] = torch.tensor(row)
        mask[i, 1 : 1 + len(row)] = True
    return h, mask


def test_entropy_advantage_adds_the_capped_entropy_term():
    h, mask = _rows([[1.0, 2.0], [1.0, 0.1], [3.0]])
    adv = torch.tensor([1.5, -0.5, 0.0])
    out = entropy_advantage(adv, h, mask, alpha=0.4, kappa=2.0)
    expected = torch.tensor([
        [0.0, 1.5 + 0.4, 1.5 + 0.75, 0.0],  # min(0.4·1, 1.5/2) = 0.4; min(0.4·2, 0.75) = 0.75 (the cap)
        [0.0, -0.5 + 0.25, -0.5 + 0.04, 0.0],  # a negative advantage is softened, never flipped
        [0.0, 0.0, 0.0, 0.0],  # A = 0 (an all-equal group) stays 0 whatever the entropy
    ])
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)


def test_gtpo_hand_group():
    # G = 4: two successes S1 (H 1, 3), S2 (H 3); two failures F1 (H 1, 2), F2 (H 4, 2).
    h, mask = _rows([[1.0, 3.0], [3.0], [1.0, 2.0], [4.0, 2.0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    # successes, t=0: shares 1/4, 3/4 of d_0 = 2 -> 1 + 0.1·0.5, 1 + 0.1·1.5; t=1: S1 alone -> 1 + 0.1·1.
    # {1.05, 1.10, 1.15}: mean 1.10, unbiased std 0.05 -> S1 (-1, 0), S2 (+1).
    # failures, t=0: inverse shares 1/1.25, 0.25/1.25 of h_0 = 2 -> -1 - 0.16, -1 - 0.04; t=1: -1.1 each.
    # {-1.16, -1.1, -1.04, -1.1}: mean -1.1, unbiased std sqrt(0.0072/3) -> F1 (-1.2247, 0), F2 (+1.2247, 0).
    z = 0.06 / math.sqrt(0.0072 / 3)
    expected = torch.tensor([[0, -1, 0, 0], [0, 1, 0, 0], [0, -z, 0, 0], [0, z, 0, 0]], dtype=torch.float32)
    out = gtpo(rewards, h, mask, group_size=4)
    torch.testing.assert_close(out, expected, atol=2e-4, rtol=0)


def test_gtpo_groups_are_independent_and_a_lone_success_gets_zero():
    h, mask = _rows([[1.0, 3.0], [3.0], [1.0, 2.0], [4.0, 2.0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    two = gtpo(torch.cat([rewards, rewards]), torch.cat([h, h]), torch.cat([mask, mask]), group_size=4)
    torch.testing.assert_close(two[:4], two[4:])
    # one success: its entropy share is 1 at every position, so all its token rewards are equal -> 0.
    lone = gtpo(torch.tensor([1.0, 0.0]), *_rows([[1.0, 5.0], [2.0]]), group_size=2)
    assert (lone[0] == 0).all()


def test_gtpo_group_norm_z_scores_the_whole_group_and_keeps_the_sign_of_the_reward():
    # R = [1, 1, 0], H = [[3, 1], [1, 3], [2, 2]]: shaped rewards [[1.15, 1.05], [1.05, 1.15], [-1.1, -1.1]]
    # (t=0: shares 3/4, 1/4 of d_0 = 2; the lone failure takes the whole penalty h_t = 1 at each position).
    h, mask = _rows([[3.0, 1.0], [1.0, 3.0], [2.0, 2.0]])
    rewards = torch.tensor([1.0, 1.0, 0.0])
    shaped = torch.tensor([1.15, 1.05, 1.05, 1.15, -1.1, -1.1])
    z = (shaped - shaped.mean()) / (shaped.std() + 1e-6)  # one mean and unbiased std over all six tokens
    out = gtpo(rewards, h, mask, group_size=3, norm="group")
    torch.testing.assert_close(out[mask], z, atol=1e-4, rtol=0)  # 0.689, 0.601, 0.601, 0.689, -1.290, -1.290
    assert (out[:2][mask[:2]] > 0).all() and (out[2][mask[2]] < 0).all()
    # the per-set reading of the same group: each set centred on itself, so half of the successes' tokens go negative
    per_set = gtpo(rewards, h, mask, group_size=3)
    assert (per_set[:2][mask[:2]] < 0).sum() == 2 and (per_set[2] == 0).all()
    with pytest.raises(ValueError, match="norm='tokens'"):
        ts.check_args("gtpo", {"norm": "tokens"})


def test_grpo_s_hand_group():
    # mean entropies: S1 1 (tokens 0.5, 1.5), S2 3, F1 1, F2 4.
    h, mask = _rows([[0.5, 1.5], [3.0], [1.0], [4.0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    shaped = torch.tensor([1 + 0.1 * 0.25 * 2, 1 + 0.1 * 0.75 * 2, -1 - 0.1 * 0.8 * 2, -1 - 0.1 * 0.2 * 2])
    expected = (shaped - shaped.mean()) / (shaped.std() + 1e-6)  # 1.05, 1.15, -1.16, -1.04 -> GRPO's normalisation
    torch.testing.assert_close(grpo_s(rewards, h, mask, group_size=4), expected, atol=1e-4, rtol=0)


def test_shape_dispatch_and_sequence_values():
    h, mask = _rows([[1.0, 3.0], [3.0], [1.0, 2.0], [4.0, 2.0]])
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    base = grpo(rewards, 4)
    seq, tok = ts.shape("entropy_adv", base, rewards, h, mask, 4)
    assert seq is base and torch.equal(tok, entropy_advantage(base, h, mask))
    seq, tok = ts.shape("gtpo", base, rewards, h, mask, 4)
    torch.testing.assert_close(seq, tok.sum(-1) / mask.sum(-1))
    seq, tok = ts.shape("grpo_s", base, rewards, h, mask, 4, beta2=0.2)
    torch.testing.assert_close(tok, torch.where(mask, seq[:, None].expand(mask.shape), torch.zeros(())))
    assert torch.isfinite(tok).all()


@pytest.mark.parametrize("name,args,match", [
    ("entropy_bonus", {}, "choose one of"),
    ("gtpo", {"alpha": 0.4}, "alpha1"),
    ("entropy_adv", {"kappa": 0.0}, "kappa"),
    (None, {"alpha": 1.0}, "null"),
])
def test_check_args_errors(name, args, match):
    with pytest.raises(ValueError, match=match):
        ts.check_args(name, args)


@pytest.mark.parametrize("kwargs,match", [
    ({"token_shaping": "gtpo", "advantage": "rloo"}, "leave it at grpo"),
    ({"token_shaping": "entropy_adv", "token_shaping_args": {"alpha1": 1.0}}, "alpha"),
    ({"token_shaping": "shaping"}, "choose one of"),
    ({"advantage": "passk", "advantage_args": {"k": 0}}, "advantage_args.k"),
    ({"advantage": "qae", "advantage_args": {"quantile_k": 1.5}}, "quantile_k"),
])
def test_algo_config_rejects_bad_shaping_and_estimator_args(kwargs, match):
    from lit_entropy.algo import AlgoConfig

    with pytest.raises(ValueError, match=match):
        AlgoConfig(**kwargs)


def test_every_file_of_the_folder_registers_the_rule_named_after_it():
    """A new shaping rule is its file: each file registers one rule under the file's name."""
    from pathlib import Path

    folder = Path(ts.__file__).parent
    files = {p.stem for p in folder.glob("*.py")} - {"__init__"}
    assert {name: r.fn.__module__.rpartition(".")[2] for name, r in ts.SHAPINGS.items()} == {n: n for n in files}
    assert {name for name, r in ts.SHAPINGS.items() if r.replaces_estimator} == {"gtpo", "grpo_s"}
