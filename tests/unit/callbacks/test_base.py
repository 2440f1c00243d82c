"""Controller configuration: the schedule grammar, the progress node, error prefixes, old keys."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from hydra.utils import instantiate

from lit_entropy.callbacks import (
    ADAPOCallback,
    AdaptiveEntropyBonusCallback,
    EntrocraftCallback,
    EntroPICCallback,
    GPPOBetaCallback,
    REPOCallback,
)
from lit_entropy.callbacks.base import FAR_PATIENCE, ProgressConfig, far_from
from lit_entropy.train import lab_controller_advice
from tests.helpers import compose_train, small_rollout_batch

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]
CONTROLLERS = [ADAPOCallback, AdaptiveEntropyBonusCallback, REPOCallback, EntroPICCallback, EntrocraftCallback,
               GPPOBetaCallback]

DEFAULT_BAND = [  # (h_low, h_high, centre) per iteration of the default run, computed before the grammar change
    (0.45, 0.55, 0.5),
    (0.4461538461538462, 0.5461538461538462, 0.49615384615384617),
    (0.4423076923076923, 0.5423076923076924, 0.49230769230769234),
    (0.43846153846153846, 0.5384615384615385, 0.4884615384615385),
    (0.4346153846153846, 0.5346153846153846, 0.4846153846153846),
    (0.4307692307692308, 0.5307692307692308, 0.4807692307692308),
    (0.4269230769230769, 0.5269230769230769, 0.4769230769230769),
    (0.4230769230769231, 0.5230769230769231, 0.47307692307692306),
    (0.41923076923076924, 0.5192307692307693, 0.46923076923076923),
    (0.4153846153846154, 0.5153846153846154, 0.4653846153846154),
    (0.4115384615384615, 0.5115384615384616, 0.46153846153846156),
    (0.4076923076923077, 0.5076923076923078, 0.45769230769230773),
    (0.40384615384615385, 0.5038461538461538, 0.45384615384615384),
    (0.4, 0.5, 0.45),
    (0.39615384615384613, 0.49615384615384617, 0.4461538461538461),
    (0.3923076923076923, 0.49230769230769234, 0.4423076923076923),
    (0.38846153846153847, 0.4884615384615385, 0.43846153846153846),
    (0.38461538461538464, 0.48461538461538467, 0.4346153846153846),
    (0.38076923076923075, 0.4807692307692308, 0.4307692307692308),
    (0.3769230769230769, 0.47692307692307695, 0.42692307692307696),
    (0.3730769230769231, 0.4730769230769231, 0.42307692307692313),
    (0.36923076923076925, 0.4692307692307693, 0.4192307692307693),
    (0.36538461538461536, 0.4653846153846154, 0.41538461538461535),
    (0.36153846153846153, 0.46153846153846156, 0.4115384615384615),
    (0.3576923076923077, 0.45769230769230773, 0.4076923076923077),
    (0.3538461538461538, 0.4538461538461539, 0.40384615384615385),
    (0.35, 0.45000000000000007, 0.4),
    (0.34615384615384615, 0.4461538461538462, 0.3961538461538462),
    (0.3423076923076923, 0.44230769230769235, 0.39230769230769236),
    (0.3384615384615385, 0.43846153846153846, 0.38846153846153847),
    (0.3346153846153846, 0.4346153846153846, 0.3846153846153846),
    (0.33076923076923076, 0.4307692307692308, 0.38076923076923075),
    (0.3269230769230769, 0.42692307692307696, 0.3769230769230769),
    (0.32307692307692304, 0.42307692307692313, 0.3730769230769231),
    (0.3192307692307692, 0.4192307692307693, 0.36923076923076925),
    (0.3153846153846154, 0.4153846153846154, 0.3653846153846154),
    (0.31153846153846154, 0.4115384615384615, 0.36153846153846153),
    (0.3076923076923077, 0.4076923076923077, 0.3576923076923077),
    (0.3038461538461539, 0.40384615384615385, 0.35384615384615387),
    (0.3, 0.4, 0.35),
]


def drive(cb, iterations: int, max_epochs: int) -> list[tuple[float, float, float]]:
    seen = []
    for it in range(iterations):
        batch = small_rollout_batch(0.5, [1.0, -1.0, 0.5, -0.5], [1.0, 0.0, 1.0, 0.0], 2)
        batch.token_advantages = batch.advantages[:, None].expand_as(batch.input_ids).clone()
        cb.on_rollout_batch(SimpleNamespace(current_epoch=it, max_epochs=max_epochs), None, batch)
        m = batch.metrics
        seen.append((m["control/band_low"], m["control/band_high"], m["control/target_entropy"]))
    return seen


def test_default_run_band_is_bit_for_bit_unchanged():
    cfg = compose_train(OUT)
    assert cfg.trainer.max_epochs == len(DEFAULT_BAND)
    cb = instantiate(cfg.callbacks.entropy)
    assert drive(cb, len(DEFAULT_BAND), cfg.trainer.max_epochs) == DEFAULT_BAND  # exact floats


# ---- one grammar: a band is a schedule of [h_low, h_high] pairs ----------------------------------
def test_band_and_target_share_the_schedule_grammar():
    band = EntrocraftCallback(band={"kind": "linear", "start": [0.6, 0.7], "end": [0.4, 0.5]}).band
    low, high = ADAPOCallback(target={"kind": "linear", "start": 0.6, "end": 0.4}).target, \
        ADAPOCallback(target={"kind": "linear", "start": 0.7, "end": 0.5}).target
    for p in (0.0, 0.3, 1.0):
        assert band(p) == (low(p), high(p))  # edge by edge, the target grammar's floats
    assert EntrocraftCallback(band=[0.4, 0.5]).band(0.9) == (0.4, 0.5)


def test_cli_band_overrides_compose():
    cfg = compose_train(["callbacks.entropy.band.kind=piecewise", "callbacks.entropy.band.points=[[0,0.5,0.6],[1,0.3,0.4]]",
                         "callbacks.entropy.progress.unit=samples", "callbacks.entropy.progress.total_samples=64", *OUT])
    cb = instantiate(cfg.callbacks.entropy)
    assert cb.band(0.5) == pytest.approx((0.4, 0.5))  # the default's start/end are left over and unused
    assert cb.progress_config == ProgressConfig(unit="samples", total_samples=64)


# ---- the progress node ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls", CONTROLLERS)
def test_progress_node_is_parsed_once_in_the_base_class(cls):
    cb = cls(progress={"unit": "samples", "total_samples": 10})
    assert cb.progress_config == ProgressConfig("samples", 10)
    cb.samples_seen = 5
    assert cb.progress(SimpleNamespace(current_epoch=7, max_epochs=9)) == 0.5
    assert cls().progress(SimpleNamespace(current_epoch=2, max_epochs=9)) == 0.25
    assert cls().progress_config == ProgressConfig()


# ---- errors name the config key ------------------------------------------------------------------
COMMON_ERRORS = [
    ({"progress": {"unit": "tokens"}}, "progress.unit"),
    ({"progress": {"unit": "samples"}}, "progress.total_samples"),
    ({"progress": {"units": "samples"}}, "progress"),
    ({"clamp_patience": 0}, "clamp_patience"),
]
OWN_ERRORS = [
    (ADAPOCallback, {"target": "last"}, "target"),
    (ADAPOCallback, {"target": {"kind": "linear", "start": 0.5}}, "target"),
    (ADAPOCallback, {"delta": 0.0}, "delta"),
    (ADAPOCallback, {"eps_high_init": 0.5}, "eps_high_init"),
    (AdaptiveEntropyBonusCallback, {"target": -1.0}, "target"),
    (AdaptiveEntropyBonusCallback, {"coef_max": 0.0}, "coef_max"),
    (REPOCallback, {"variant": "x"}, "variant"),
    (REPOCallback, {"lam_init": 1.0}, "lam_init"),
    (REPOCallback, {"logp_floor": 0.0}, "logp_floor"),
    (EntroPICCallback, {"kp": -1.0}, "kp"),
    (EntroPICCallback, {"anti_windup": "bogus"}, "anti_windup"),
    (EntrocraftCallback, {"band": [0.7, 0.6]}, "band"),
    (EntrocraftCallback, {"band": {"kind": "piecewise"}}, "band"),
    (EntrocraftCallback, {"mode": "bogus"}, "mode"),
    (EntrocraftCallback, {"gamma": 0.0}, "gamma"),
    (EntrocraftCallback, {"renormalise": "group"}, "renormalise"),
    (GPPOBetaCallback, {"drive": "x"}, "drive"),
]


@pytest.mark.parametrize(
    "cls,kwargs,key",
    [(cls, kwargs, key) for cls in CONTROLLERS for kwargs, key in COMMON_ERRORS] + OWN_ERRORS,
)
def test_every_error_names_its_config_key(cls, kwargs, key):
    with pytest.raises(ValueError, match=rf"^callbacks\.entropy\.{re.escape(key)}: "):
        cls(**kwargs)


def test_fit_start_errors_name_target_or_band():
    module = SimpleNamespace(model=SimpleNamespace(config=SimpleNamespace(vocab_size=2)))
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.target: reaches 0\.800 nats, above log"):
        ADAPOCallback(target={"kind": "piecewise", "points": [[0, 0.1], [0.5, 0.8], [1, 0.1]]}).on_fit_start(
            None, module)
    with pytest.raises(ValueError, match=r"^callbacks\.entropy\.band: reaches 0\.700 nats, above log"):
        EntrocraftCallback(band=[0.6, 0.7]).on_fit_start(None, module)


# ---- the keys renamed before 0.1.0 are refused by name (their one-release shims are gone) ----------
@pytest.mark.parametrize("cls", CONTROLLERS)
def test_an_old_key_is_refused_naming_it_and_the_controller(cls):
    with pytest.raises(TypeError, match=rf"^{cls.__name__}\(\) got unexpected keyword argument\(s\) \['progress_unit'\]"):
        cls(progress_unit="samples")


def test_an_old_key_on_the_command_line_is_refused_by_name():
    with pytest.raises(Exception, match="band_start"):
        compose_train(["callbacks.entropy.band_start=[0.5,0.6]", *OUT])


def test_state_dict_keys():
    cb = EntrocraftCallback(band=[0.4, 0.5])
    assert set(cb.state_dict()) == {"first_entropy", "samples_seen", "clamp_run", "clamp_warned", "far_run",
                                    "far_warned", "last", "generator"}
    old = {k: v for k, v in cb.state_dict().items() if not k.startswith("far_")}  # a checkpoint before 2026-12-05
    EntrocraftCallback(band=[0.4, 0.5]).load_state_dict(old)


def test_far_from_is_outside_by_more_than_the_width_or_half_the_centre():
    assert not far_from(0.5, 0.45, 0.55) and not far_from(0.2, 0.45, 0.55)  # margin max(0.1, 0.25) = 0.25
    assert far_from(0.19, 0.45, 0.55) and far_from(0.81, 0.45, 0.55)
    assert not far_from(0.44, 0.3, 0.3) and far_from(0.46, 0.3, 0.3) and far_from(0.14, 0.3, 0.3)  # a target: half of it either side
    assert far_from(0.72, 0.30, 0.40)  # a custom task at 0.72 nats under the lab's end band (the case)


def test_a_run_far_from_its_band_for_ten_iterations_warns_once_and_the_count_resumes(caplog):
    cb = EntrocraftCallback(band=[0.30, 0.40], mode="hard")
    seen = []
    for i in range(FAR_PATIENCE + 5):
        batch = small_rollout_batch(0.72 if i != 3 else 0.35, [1.0, -1.0])  # one iteration inside: the count restarts
        with caplog.at_level("WARNING", logger="lit_entropy.callbacks.base"):
            cb.on_rollout_batch(SimpleNamespace(current_epoch=i, max_epochs=40), SimpleNamespace(), batch)
        seen.append(sum("far from its band" in r.getMessage() for r in caplog.records))
    assert seen.index(1) == 3 + FAR_PATIENCE  # ten far iterations after the one inside
    assert seen[-1] == 1 and "band [0.3, 0.4]" in caplog.text and "0.72 nats" in caplog.text
    other = EntrocraftCallback(band=[0.30, 0.40], mode="hard")
    other.load_state_dict(cb.state_dict())
    assert (other.far_run, other.far_warned) == (cb.far_run, True)


@pytest.mark.parametrize("choices, overrides, warns", [
    ({"callbacks/entropy": "entrocraft_hard", "data": "reach_target"}, [], True),  # one's own preset
    ({"callbacks/entropy": "entrocraft", "data": "jsonl"}, ["callbacks/entropy=entrocraft"], True),
    ({"callbacks/entropy": "entrocraft_hard", "data": "reach_target"}, ["callbacks.entropy.band.end=[0.6,0.7]"], False),
    ({"callbacks/entropy": "entrocraft_hard", "data": "countdown"}, [], False),  # the lab itself
    ({"callbacks/entropy": "adapo", "data": "jsonl"}, [], False),  # target "first": the run's own entropy
    ({}, [], False),  # composed in code: no choices known
])
def test_the_lab_band_on_another_task_is_named_at_start_up(choices, overrides, warns):
    advice = lab_controller_advice(choices, overrides)
    assert bool(advice) == warns
    if warns:
        assert f"callbacks/entropy={choices['callbacks/entropy']}" in advice and f"data={choices['data']}" in advice
        assert "callbacks/entropy=none" in advice


@pytest.mark.parametrize("data", ["jsonl", "gsm8k", "math500", "arithmetic", "arithmetic_easy"])
def test_the_shipped_tasks_other_than_the_lab_start_without_a_controller(data):
    extra = ["data.prompts.path=unused.jsonl"] if data == "jsonl" else []
    assert "_target_" not in compose_train([f"data={data}", *extra, *OUT]).callbacks.entropy
    picked = compose_train([f"data={data}", *extra, "callbacks/entropy=repo_r", *OUT]).callbacks.entropy
    assert picked._target_.endswith("REPOCallback")  # the command line still picks one
    assert compose_train(OUT).callbacks.entropy._target_.endswith("EntrocraftCallback")  # the lab keeps its own
    from hydra import compose, initialize_config_dir

    from tests.helpers import CONF

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # the evaluation composes them too
        assert compose(config_name="evaluate", overrides=[f"data={data}", *extra]).data._target_
