"""``lit_entropy.train.check_knob_owners``: two controllers driving one knob are refused at start-up, naming both."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hydra.utils import instantiate

from lit_entropy.train import check_knob_owners, instantiate_callbacks
from tests.helpers import compose_train


def test_a_fixed_entropy_bonus_and_the_adaptive_bonus_are_refused_naming_both():
    cfg = compose_train(["debug=smoke", "algo=entropy_bonus", "callbacks/entropy=adaptive_bonus",
                         "paths.output_dir=unused"])
    with pytest.raises(ValueError, match="entropy_coef") as err:
        check_knob_owners(instantiate_callbacks(cfg.callbacks), instantiate(cfg.algo))
    assert "AdaptiveEntropyBonusCallback" in str(err.value) and "algo=entropy_bonus" in str(err.value)


def test_two_callbacks_on_one_knob_are_refused_naming_both():
    first = SimpleNamespace(knobs=("eps_high",))
    second = type("OtherController", (), {"knobs": ("eps_high",)})()
    with pytest.raises(ValueError, match="'eps_high' is driven by both SimpleNamespace and OtherController"):
        check_knob_owners([first, second])


def test_distinct_knobs_and_a_zero_bonus_pass():
    algo = SimpleNamespace(name="grpo", entropy_coef=0.0)
    check_knob_owners([SimpleNamespace(knobs=("entropy_coef",)), SimpleNamespace(knobs=("eps_high",)),
                       SimpleNamespace()], algo)
    cfg = compose_train(["debug=smoke", "callbacks/entropy=adaptive_bonus", "paths.output_dir=unused"])
    check_knob_owners(instantiate_callbacks(cfg.callbacks), instantiate(cfg.algo))  # grpo: no fixed bonus


def test_build_refuses_the_conflict_before_the_warm_start(monkeypatch):
    """What the command line does (``scripts/train.py`` calls ``build``): the refusal comes before the policy
    is built (no warm start) and before the engine starts."""
    from lit_entropy import train

    cfg = compose_train(["debug=smoke", "algo=entropy_bonus", "callbacks/entropy=adaptive_bonus",
                         "paths.output_dir=unused", "rollout=hf"])
    monkeypatch.setattr(type(instantiate(cfg.model)), "build", lambda self: pytest.fail("policy built"))
    with pytest.raises(ValueError, match="entropy_coef.*AdaptiveEntropyBonusCallback"):
        train.build(cfg)
