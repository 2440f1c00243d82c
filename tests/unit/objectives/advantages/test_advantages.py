import math
from pathlib import Path

import pytest
import torch

from lit_entropy.objectives.advantages import ESTIMATORS, NO_BASELINE, compute_advantages
from lit_entropy.objectives.advantages.dr_grpo import dr_grpo
from lit_entropy.objectives.advantages.groups import group_has_signal, select_groups, zero_std_groups
from lit_entropy.objectives.advantages.grpo import grpo
from lit_entropy.objectives.advantages.reinforce_pp import reinforce_pp_baseline
from lit_entropy.objectives.advantages.rloo import rloo
from lit_entropy.objectives.advantages.signed import signed
from lit_entropy.objectives.advantages.w_reinforce import w_reinforce

S2 = 1 / math.sqrt(2)  # G=2, rewards {1, 0}: mean 0.5, unbiased std sqrt(0.5) -> ±0.5/0.70711
S4 = math.sqrt(3) / 2  # G=4, rewards {1,0,0,1}: mean 0.5, unbiased std sqrt(1/3) -> ±0.5*sqrt(3)


def test_grpo_g2_hand_example():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=2)
    expected = torch.tensor([S2, -S2, -S2, S2])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert adv.dtype == torch.float32


def test_grpo_g4_hand_example():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4)
    torch.testing.assert_close(adv, torch.tensor([S4, -S4, -S4, S4]), atol=1e-5, rtol=0)


def test_grpo_uses_unbiased_std_and_eps():
    r = torch.tensor([3.0, 1.0, 2.0])  # mean 2, unbiased std 1
    adv = grpo(r, group_size=3, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, 0.0]))
    adv_eps = grpo(r, group_size=3, eps=1.0)
    torch.testing.assert_close(adv_eps, torch.tensor([0.5, -0.5, 0.0]))


def test_dr_grpo_no_std_division():
    adv = grpo(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0]), group_size=4, scale_std=False)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])
    torch.testing.assert_close(adv, expected)


def test_all_equal_group_is_exactly_zero():
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 7.3, 7.3, 7.3], dtype=torch.float64)
    for scale in (True, False):
        adv = grpo(r, group_size=3, scale_std=scale)
        assert torch.isfinite(adv).all()
        assert (adv[:3] == 0).all() and (adv[6:] == 0).all()
        assert adv.dtype == torch.float32
    torch.testing.assert_close(
        grpo(r, 3)[3:6], torch.tensor([2 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)])
    )


def test_bf16_rewards_give_fp32():
    adv = grpo(torch.tensor([1.0, 0.0], dtype=torch.bfloat16), group_size=2)
    assert adv.dtype == torch.float32


def test_group_size_one_error():
    with pytest.raises(ValueError, match="G=1"):
        grpo(torch.tensor([1.0, 0.0]), group_size=1)


def test_non_divisible_error():
    with pytest.raises(ValueError, match="5.*3"):
        grpo(torch.ones(5), group_size=3)
    with pytest.raises(ValueError):
        zero_std_groups(torch.ones(5), group_size=2)


def test_zero_std_groups():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    assert zero_std_groups(r, 2).tolist() == [True, False, True, True]
    assert zero_std_groups(r, 4).tolist() == [False, False]


# ---- estimators beyond GRPO ------------------------------------------------------------------------

# Shared hand example: G=4, group 0 = {1,0,0,1} (mean 0.5), group 1 all-equal {1,1,1,1}.
R8 = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
BASELINE_FNS = [dr_grpo, rloo, reinforce_pp_baseline]


def test_dr_grpo_hand_example_matches_grpo_without_std():
    adv = dr_grpo(R8, group_size=4)
    expected = torch.tensor([0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(adv, grpo(R8, 4, scale_std=False))
    # mean of {3, 1, 2} is 2 -> {1, -1, 0}, no division by the std
    torch.testing.assert_close(dr_grpo(torch.tensor([3.0, 1.0, 2.0]), 3), torch.tensor([1.0, -1.0, 0.0]))


def test_rloo_hand_example():
    # R_0 = 1, others {0, 0, 1} mean 1/3 -> 2/3; R_1 = 0, others {1, 0, 1} mean 2/3 -> -2/3.
    # Equivalently G/(G-1)·(R - mean) = 4/3 · ±0.5 = ±2/3.
    adv = rloo(R8, group_size=4)
    t = 2.0 / 3.0
    torch.testing.assert_close(adv, torch.tensor([t, -t, -t, t, 0.0, 0.0, 0.0, 0.0]))
    # G=2 {3, 1}: 3 - 1 = 2, 1 - 3 = -2
    torch.testing.assert_close(rloo(torch.tensor([3.0, 1.0]), 2), torch.tensor([2.0, -2.0]))


def test_rloo_equals_explicit_leave_one_out_mean():
    gen = torch.Generator().manual_seed(0)
    for g in (2, 3, 5, 8):
        r = torch.rand(4 * g, generator=gen, dtype=torch.float64)
        expected = torch.empty_like(r)
        for start in range(0, r.numel(), g):
            for i in range(start, start + g):
                others = [r[j].item() for j in range(start, start + g) if j != i]
                expected[i] = r[i] - sum(others) / len(others)
        torch.testing.assert_close(rloo(r, g), expected.float(), atol=1e-6, rtol=0)


def test_reinforce_pp_hand_example():
    # x = R - group mean = [.5, -.5, -.5, .5, 0, 0, 0, 0]; batch mean 0;
    # population var = 4·0.25 / 8 = 1/8, std = 1/(2√2); x / std = ±√2, zeros stay 0.
    s = math.sqrt(2)
    expected = torch.tensor([s, -s, -s, s, 0.0, 0.0, 0.0, 0.0])
    torch.testing.assert_close(reinforce_pp_baseline(R8, 4, eps=0.0), expected)
    # default eps=1e-6: 0.5 / (0.353553 + 1e-6)
    torch.testing.assert_close(reinforce_pp_baseline(R8, 4), expected * (1 / (1 + 1e-6 * 2 * s)))
    # eps enters as std + eps: std = 1/(2√2), eps = 1/(2√2) -> ±√2/2
    torch.testing.assert_close(reinforce_pp_baseline(R8, 4, eps=1 / (2 * s)), expected / 2)


def test_reinforce_pp_whitens_over_sequences_population_std():
    gen = torch.Generator().manual_seed(1)
    r = torch.rand(48, generator=gen)
    adv = reinforce_pp_baseline(r, 6, eps=0.0)
    assert adv.dtype == torch.float32
    assert abs(adv.mean().item()) < 1e-6
    assert abs(adv.std(correction=0).item() - 1.0) < 1e-5  # population std is 1 ...
    assert abs(adv.std(correction=1).item() - math.sqrt(48 / 47)) < 1e-5  # ... not the unbiased one
    # Group-centring first: shifting one group's rewards by a constant changes nothing.
    shifted = r.clone()
    shifted[:6] += 10.0
    torch.testing.assert_close(reinforce_pp_baseline(shifted, 6, eps=0.0), adv, atol=1e-5, rtol=0)
    # Same ordering and sign as Dr.GRPO (a positive rescaling of it).
    ratio = adv / dr_grpo(r, 6)
    torch.testing.assert_close(ratio, ratio[:1].expand_as(ratio))


def test_reinforce_pp_zero_variance_batch_gives_zeros():
    for eps in (1e-6, 0.0):
        adv = reinforce_pp_baseline(torch.tensor([0.3, 0.3, 1.0, 1.0, 0.0, 0.0]), 2, eps=eps)
        assert torch.isfinite(adv).all()
        assert (adv == 0).all()


def test_w_reinforce_values():
    adv = w_reinforce(R8)  # default: threshold 1.0, λ = 0.1, no baseline
    expected = torch.tensor([0.1, -1.0, -1.0, 0.1, 0.1, 0.1, 0.1, 0.1])
    torch.testing.assert_close(adv, expected)
    assert adv.dtype == torch.float32
    # threshold is inclusive: 0.5 >= 0.5 is correct
    adv = w_reinforce(torch.tensor([0.7, 0.2, 0.5, 0.49]), correct_threshold=0.5, lam=0.5)
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.0, 0.5, -1.0]))
    # all-equal groups still get ±: no baseline
    torch.testing.assert_close(w_reinforce(torch.zeros(3)), torch.full((3,), -1.0))
    # group_size is accepted, only checked; G = 1 is fine
    torch.testing.assert_close(w_reinforce(R8, group_size=1), w_reinforce(R8))
    torch.testing.assert_close(w_reinforce(R8, group_size=4), w_reinforce(R8))
    with pytest.raises(ValueError, match="8.*3"):
        w_reinforce(R8, group_size=3)
    with pytest.raises(ValueError):
        w_reinforce(torch.ones(2, 2))


def test_estimators_all_equal_groups_zero():
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 7.3, 7.3, 7.3], dtype=torch.float64)
    for fn in BASELINE_FNS:
        adv = fn(r, 3)
        assert adv.dtype == torch.float32
        assert torch.isfinite(adv).all()
        assert (adv[:3] == 0).all() and (adv[6:] == 0).all(), fn.__name__
        assert (adv[3:6] != 0).all()


def test_estimators_group_size_one_error():
    for fn in BASELINE_FNS:
        with pytest.raises(ValueError, match="G=1"):
            fn(torch.tensor([1.0, 0.0]), 1)
    with pytest.raises(ValueError, match="G=1"):
        compute_advantages("rloo", torch.tensor([1.0, 0.0]), 1)


def test_estimators_shape_errors():
    for fn in BASELINE_FNS:
        with pytest.raises(ValueError, match="5.*3"):
            fn(torch.ones(5), 3)
        with pytest.raises(ValueError, match="1-D"):
            fn(torch.ones(2, 4), 2)


def test_estimators_fp32_output_from_other_dtypes():
    for r in (R8.bfloat16(), R8.double(), R8.long(), R8.bool()):
        for name in ESTIMATORS:
            adv = compute_advantages(name, r, 4)
            assert adv.dtype == torch.float32 and adv.shape == (8,), (name, r.dtype)
            torch.testing.assert_close(adv, compute_advantages(name, R8, 4))


def test_signed_is_two_r_minus_one_with_no_baseline():
    """TOPR's ±1 rewards (Le Roux et al. 2025): A = 2R − 1, binary rewards exactly ±1, all-equal groups kept."""
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])  # a mixed group, an all-correct one, an all-wrong one
    assert signed(r).tolist() == [1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, -1.0]
    assert compute_advantages("signed", r, 2).tolist() == signed(r).tolist()
    shaped = torch.tensor([0.75, 0.5, 0.25, -0.5])  # non-binary rewards (an overlong penalty): the same affine map
    torch.testing.assert_close(signed(shaped), torch.tensor([0.5, 0.0, -0.5, -2.0]))
    rng = torch.Generator().manual_seed(0)
    rand = torch.rand(64, generator=rng, dtype=torch.float64)
    torch.testing.assert_close(compute_advantages("signed", rand, 8), (2 * rand - 1).float())  # the formula
    torch.testing.assert_close(compute_advantages("signed", r, 1), signed(r))  # G = 1: no baseline to need a group
    assert compute_advantages("signed", r, 4, eps=1.0, lam=0.3).tolist() == signed(r).tolist()  # takes no option
    with pytest.raises(ValueError, match="8.*3"):
        signed(r, group_size=3)
    with pytest.raises(ValueError, match="1-D"):
        signed(torch.ones(2, 2))


# ---- dispatcher --------------------------------------------------------------------------------------


def test_every_file_of_the_folder_registers_one_estimator_under_its_name():
    """The registry is filled by the folder's files (a new estimator is its file): each file but the shared
    groups.py registers the estimator named after it, and nothing else registers one."""
    folder = Path(ESTIMATORS["grpo"].fn.__code__.co_filename).parent
    files = {p.stem for p in folder.glob("*.py")} - {"__init__", "groups"}
    assert set(ESTIMATORS) == files
    assert {name: e.fn.__module__.rpartition(".")[2] for name, e in ESTIMATORS.items()} == {n: n for n in files}
    assert set(NO_BASELINE) == {"w_reinforce", "signed"}


def test_dispatcher_maps_names():
    assert set(ESTIMATORS) == {"grpo", "dr_grpo", "rloo", "reinforce_pp", "w_reinforce", "qae", "passk", "maxrl",
                               "grpo_batch", "signed"}
    torch.testing.assert_close(compute_advantages("grpo", R8, 4), grpo(R8, 4))
    torch.testing.assert_close(compute_advantages("dr_grpo", R8, 4), dr_grpo(R8, 4))
    torch.testing.assert_close(compute_advantages("rloo", R8, 4), rloo(R8, 4))
    torch.testing.assert_close(compute_advantages("reinforce_pp", R8, 4), reinforce_pp_baseline(R8, 4))
    torch.testing.assert_close(compute_advantages("w_reinforce", R8, 4), w_reinforce(R8))
    torch.testing.assert_close(compute_advantages("w_reinforce", R8, 1), w_reinforce(R8))


def test_dispatcher_forwards_meaningful_kwargs_only():
    r = torch.tensor([3.0, 1.0, 2.0])
    torch.testing.assert_close(compute_advantages("grpo", r, 3, eps=1.0), torch.tensor([0.5, -0.5, 0.0]))
    torch.testing.assert_close(
        compute_advantages("grpo", r, 3, scale_std=False), torch.tensor([1.0, -1.0, 0.0])
    )
    torch.testing.assert_close(
        compute_advantages("reinforce_pp", R8, 4, eps=0.0), reinforce_pp_baseline(R8, 4, eps=0.0)
    )
    torch.testing.assert_close(
        compute_advantages("w_reinforce", r, 3, lam=0.5, correct_threshold=2.0),
        torch.tensor([0.5, -1.0, 0.5]),
    )
    # a config-wide set of options: each estimator takes only what applies to it
    opts = {"eps": 1.0, "lam": 0.3, "correct_threshold": 0.5, "scale_std": True}
    torch.testing.assert_close(compute_advantages("rloo", R8, 4, **opts), rloo(R8, 4))
    torch.testing.assert_close(compute_advantages("dr_grpo", R8, 4, **opts), dr_grpo(R8, 4))
    torch.testing.assert_close(
        compute_advantages("w_reinforce", R8, 4, **opts), w_reinforce(R8, correct_threshold=0.5, lam=0.3)
    )


def test_dispatcher_errors():
    with pytest.raises(ValueError, match="ppo") as err:
        compute_advantages("ppo", R8, 4)
    for name in ESTIMATORS:
        assert name in str(err.value)
    with pytest.raises(TypeError, match="lamda"):
        compute_advantages("w_reinforce", R8, 4, lamda=0.1)
    with pytest.raises(ValueError, match="8.*3"):
        compute_advantages("w_reinforce", R8, 3)


# ---- dynamic sampling (DAPO) ------------------------------------------------------------------------


def test_group_has_signal_is_complement():
    r = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.5, 0.5])
    assert group_has_signal(r, 2).tolist() == [False, True, False, False]
    assert group_has_signal(r, 4).tolist() == [True, True]
    assert group_has_signal(R8, 4).tolist() == [True, False]
    close = torch.tensor([1.0, 1.0 + 1e-12], dtype=torch.float64)  # equal in fp32, not in the rewards' float64
    assert group_has_signal(close, 2).tolist() == [True]
    with pytest.raises(ValueError, match="G=1"):
        group_has_signal(r, 1)


def test_select_groups():
    signal = torch.tensor([False, True, True, False, True])
    out = select_groups(2, signal)
    assert out.dtype == torch.int64 and out.tolist() == [1, 2]
    assert select_groups(3, signal).tolist() == [1, 2, 4]
    assert select_groups(10, signal).tolist() == [1, 2, 4]  # fewer than needed: all of them
    empty = select_groups(0, signal)
    assert empty.dtype == torch.int64 and empty.numel() == 0
    assert select_groups(4, torch.zeros(3, dtype=torch.bool)).numel() == 0
    # filling a batch of 3 groups over two rounds
    r1 = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.0])  # G=2: signal [F, T, T]
    r2 = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0])  # signal [F, T, T]
    first = select_groups(3, group_has_signal(r1, 2))
    second = select_groups(3 - first.numel(), group_has_signal(r2, 2))
    assert first.tolist() == [1, 2] and second.tolist() == [1]


def test_select_groups_errors():
    with pytest.raises(ValueError, match="bool"):
        select_groups(1, torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="bool"):
        select_groups(1, torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=">= 0"):
        select_groups(-1, torch.tensor([True]))


def test_the_worked_example_of_the_docs_registers_and_runs():
    """docs/objectives.md, "Adding an advantage estimator": its file, run as written, registers an estimator that
    the dispatcher and the config accept."""
    from lit_entropy.algo import AlgoConfig

    text = (Path(__file__).resolve().parents[4] / "docs" / "objectives.md").read_text()
    code = text.split("# lit_entropy/objectives/advantages/median.py\n", 1)[1].split("```", 1)[0]
    try:
        exec(compile(code, "median.py", "exec"), {"__name__": "median_example"})
        group = torch.tensor([1.0, 0.0, 0.0, 1.0])  # torch's median of an even group is its lower middle value, 0
        torch.testing.assert_close(compute_advantages("median", R8, 4, eps=0.0),
                                   torch.cat([group / group.std(), torch.zeros(4)]))
        assert AlgoConfig(advantage="median").advantage == "median"
    finally:
        ESTIMATORS.pop("median", None)
