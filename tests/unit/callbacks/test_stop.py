"""StopWhenDiverged: the streak rule, its state, its config; a real run that it stops and evaluates at the stop."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.stop import StopWhenDiverged, diverged_streak
from tests.helpers import CONF
from tests.unit.callbacks.test_entropy_law import make_batch


def test_the_streak_counts_iterations_meeting_both_conditions_and_resets():
    assert diverged_streak(0, 4.5, 0.0, 4.4, 0.0) == 1
    assert diverged_streak(3, 4.5, 0.0, 4.4, 0.0) == 4
    assert diverged_streak(3, 4.4, 0.0, 4.4, 0.0) == 0  # at the limit: not above it
    assert diverged_streak(3, 9.0, 0.02, 4.4, 0.0) == 0  # one problem solved: not diverged
    assert diverged_streak(3, 9.0, 0.02, 4.4, 0.05) == 4


def feed(cb: StopWhenDiverged, entropies: list[float], accuracy: float = 0.0) -> list[dict[str, float]]:
    out = []
    for it, h in enumerate(entropies):
        batch = make_batch({"rollout/entropy": h, "rollout/accuracy": accuracy})
        cb.on_rollout_batch(SimpleNamespace(current_epoch=it), SimpleNamespace(), batch)
        out.append(batch.metrics)
    return out


def test_the_limit_is_factor_times_the_first_iteration_and_the_stop_comes_after_patience_iterations():
    cb = StopWhenDiverged(factor=2.0, patience=3)
    metrics = feed(cb, [2.0, 3.9, 4.1, 4.2, 3.0, 4.5, 5.0, 6.0])
    assert cb.entropy_above == pytest.approx(4.0)
    assert [m["stop/streak"] for m in metrics] == [0, 0, 1, 2, 0, 1, 2, 3]
    assert [i for i, m in enumerate(metrics) if "stop/diverged" in m] == [7]


def trainer_at(epoch: int, batches: int = 2) -> SimpleNamespace:
    strategy = SimpleNamespace(reduce_boolean_decision=lambda decision, all=True: decision)
    return SimpleNamespace(current_epoch=epoch, num_training_batches=batches, strategy=strategy, should_stop=False)


def test_should_stop_is_set_after_the_last_optimizer_step_of_the_iteration_only():
    cb = StopWhenDiverged(factor=2.0, patience=1)
    feed(cb, [1.0, 2.5])
    trainer = trainer_at(1)
    cb.on_train_batch_end(trainer, SimpleNamespace(), None, None, batch_idx=0)
    assert not trainer.should_stop  # the iteration's first minibatch: its update is not finished
    cb.on_train_batch_end(trainer, SimpleNamespace(), None, None, batch_idx=1)
    assert trainer.should_stop and cb.stopped_at == 2


def test_state_round_trips_and_a_resumed_run_counts_on():
    cb = StopWhenDiverged(factor=2.0, patience=3)
    feed(cb, [2.0, 4.5, 4.6])
    again = StopWhenDiverged(factor=2.0, patience=3)
    again.load_state_dict(cb.state_dict())
    assert again.reference == 2.0 and again.streak == 2
    assert "stop/diverged" in feed(again, [4.7])[0]


@pytest.mark.parametrize("kwargs, key", [({"factor": 0.0}, "factor"), ({"factor": float("nan")}, "factor"),
                                         ({"accuracy_at_most": 1.5}, "accuracy_at_most"),
                                         ({"patience": 0}, "patience"), ({"patience": 2.5}, "patience")])
def test_bad_values_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"callbacks\.stop\.{key}="):
        StopWhenDiverged(**kwargs)


def test_the_yaml_instantiates_the_codes_defaults():
    node = yaml.safe_load((CONF / "callbacks" / "stop" / "diverged.yaml").read_text())
    cb = instantiate(node)
    default = StopWhenDiverged()
    assert (cb.factor, cb.accuracy_at_most, cb.patience) == (default.factor, default.accuracy_at_most, default.patience)


@pytest.mark.integration
def test_a_real_run_stops_at_the_rule_and_runs_its_final_evaluation_there(tmp_path, harness):
    """Both conditions hold from the first iteration (factor 0.5, any accuracy): with patience 2 the run of 3
    iterations stops after the 2nd, and its last evaluation (8 samples, pass@8) is there."""
    result = harness.fit(["rollout=hf", "callbacks/stop=diverged", "callbacks.stop.factor=0.5",
                          "callbacks.stop.accuracy_at_most=1.0", "callbacks.stop.patience=2",
                          "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=10",
                          "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                          "callbacks.eval.final_n=8", "callbacks.eval.final_ks=[1,4,8]"], tmp_path)
    scalars = result.scalars
    assert result.cfg.trainer.max_epochs == 3
    assert [s for s, _ in scalars["rollout/entropy"]] == [1, 2]
    assert [v for _, v in scalars["stop/streak"]] == [1.0, 2.0]
    assert [s for s, _ in scalars["stop/diverged"]] == [2]
    assert [s for s, _ in scalars["eval/pass@8"]] == [2]
    assert result.callback("StopWhenDiverged").stopped_at == 2
