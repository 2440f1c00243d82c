"""Every entropy controller closes the loop on the lab (real Trainer, in-process on tests/harness.py).

Each controller's exact resume is tests/integration/test_controller_resume.py; the knob-conflict refusal a
unit test of ``lit_entropy.train.check_knob_owners`` (tests/unit/test_train_knob_owners.py)."""

from __future__ import annotations

import math

import pytest

from tests.helpers import CONF, read_scalars

pytestmark = pytest.mark.integration

CONTROLLERS = sorted(p.stem for p in (CONF / "callbacks" / "entropy").glob("*.yaml") if p.stem != "none")
"""Every controller config, discovered: a new controller needs no edit here."""
NEEDS = {"gppo_beta": ["algo=ce_gppo"]}  # the objective a controller's knob needs


@pytest.mark.parametrize("name", CONTROLLERS)
def test_controller_closed_loop_smoke(tmp_path, harness, name):
    """Every iteration logs the target and each of the controller's own ``control/*`` values, all finite."""
    scalars = harness.fit([f"callbacks/entropy={name}", "rollout=hf", *NEEDS.get(name, [])], tmp_path).scalars
    own = [tag for tag in scalars if tag.startswith("control/") and tag not in ("control/target_entropy",
                                                                                 "control/kept_frac")]
    assert own, f"{name} logs no control/* value of its own: {sorted(scalars)}"
    for tag in ["control/target_entropy", *own]:
        values = [v for _, v in scalars[tag]]
        assert len(values) == 3 and all(math.isfinite(v) for v in values), (tag, values)
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])


HIGH = ["callbacks.entropy.target=1.5"]  # far above the lab's entropy (~0.5 nats): every iteration is below it
RAISE_ENTROPY = {  # the knob's values, iteration by iteration, when the entropy is below target all along (§7.4)
    "adapo": (HIGH, "control/eps_high", "up"),  # a looser upper clip lets unlikely tokens rise
    "adaptive_bonus": (HIGH, "control/entropy_coef", "up"),
    "repo_r": (HIGH, "control/repo_lambda", "up"),
    "repo_d": (HIGH, "control/repo_lambda", "up"),
    "entropic": (HIGH, "control/pic_alpha", "negative"),  # e = H - H* < 0: positives weigh 1 + alpha < 1
    "gppo_beta": (HIGH, "control/gppo_beta_high", "up"),  # more pull on the clipped rare tokens being raised
    "entrocraft_hard": (["callbacks.entropy.band.kind=constant", "callbacks.entropy.band.start=[1.4,1.5]"],
                        "control/direction", "negative"),  # NSR: the failures' push down, which raises entropy
}


@pytest.mark.parametrize("name", sorted(RAISE_ENTROPY))
def test_each_controller_moves_its_knob_toward_more_entropy_below_target(tmp_path, harness, name):
    """A controller that never moved its knob would pass the smoke test above; this one would fail it."""
    extra, tag, how = RAISE_ENTROPY[name]
    scalars = harness.fit([f"callbacks/entropy={name}", "rollout=hf", *extra, *NEEDS.get(name, [])], tmp_path).scalars
    values = [v for _, v in sorted(scalars[tag])]
    assert len(values) == 3, values
    if how == "up":
        assert values[0] < values[1] < values[2], values
    else:
        assert all(v < 0 for v in values), values


GATED = {  # the controllers that act only on one side of the target: what they log below it and above it
    "stare": (["callbacks.entropy.top_frac=0.5"], "train/stare_reweighted_frac"),  # per optimizer step
    "aepo": (["callbacks.entropy.prompt_frac=1.0", "callbacks.entropy.rows_frac=0.25"], "control/aepo_rows_frac"),
}


@pytest.mark.parametrize("name", sorted(GATED))
def test_gated_controllers_act_under_their_target_and_not_over_it(tmp_path, harness, name):
    """STARE reweights only while the entropy is under its target; AEPO draws at t_high (all its rows) under it and
    at t_low (half of them) over it. A real draw, pre-update pass and update on the lab, each side of the target."""
    extra, dose = GATED[name]
    runs = {side: harness.fit([f"callbacks/entropy={name}", "rollout=hf", f"callbacks.entropy.target={target}",
                               *extra], tmp_path, name=side).scalars
            for side, target in (("under", 1.5), ("over", 0.01))}
    under, over = ([v for _, v in sorted(runs[side][dose])] for side in ("under", "over"))
    logged = len(runs["under"]["train/loss"]) if name == "stare" else 3  # STARE's every optimizer step, AEPO's iteration
    assert len(under) == len(over) == logged >= 3
    assert all(math.isfinite(v) for side in runs.values() for _, v in side["train/loss"])
    if name == "stare":
        assert all(v > 0 for v in under), under  # the gate is open and picks tokens every iteration
        assert over == [0.0] * logged
        assert {v for _, v in runs["under"]["control/stare_gate"]} == {1.0}
    else:
        assert [v for _, v in runs["under"]["control/aepo_temperature"]] == pytest.approx([1.2] * 3)  # float32 logs
        assert [v for _, v in runs["over"]["control/aepo_temperature"]] == pytest.approx([0.8] * 3)
        assert sum(under) > 0, under  # rows better than their group entered the batch
        assert all(v <= 0.125 + 1e-9 for v in over), over  # at most half of the 25 %


@pytest.mark.slow  # a measurement of the lever (~2 min, two 6-iteration runs of the full lab), not a guard
def test_entrocraft_hard_lever_moves_lab_entropy_the_designed_way(tmp_path, harness):
    """The lab's default controller has a lever with the designed sign (docs/controllers/entrocraft.md).

    The full lab (800-step warm start, 128 prompts x 8) for 6 iterations with the direction forced by a
    constant band far away: RAFT++ every iteration (m = +1) must leave entropy well below NSR every
    iteration (m = -1). Measured: 0.399 vs 0.492 at iteration 5.
    """
    finals = {}
    for name, band in {"raft": "[0.0,0.01]", "nsr": "[2.0,2.1]"}.items():
        harness.fit(["trainer.max_epochs=6", "callbacks/entropy=entrocraft_hard", "callbacks.entropy.band.kind=constant",
                     f"callbacks.entropy.band.start={band}"], tmp_path, smoke=False, name=name)
        scalars = read_scalars(tmp_path / name)
        direction = {v for _, v in scalars["control/direction"]}
        assert direction == ({1.0} if name == "raft" else {-1.0})
        finals[name] = [v for _, v in sorted(scalars["rollout/entropy"])][-1]
    assert finals["nsr"] > finals["raft"] + 0.03, finals
