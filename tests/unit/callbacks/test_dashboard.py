"""The run's TensorBoard dashboard (lit_entropy.callbacks.dashboard): its HParams row and its custom-scalars layout.

The hyperparameters are the group choices, the swept keys, the command line's scalar keys and the controller's
settings, not the resolved tree; the layout's regexes pick the tags they name and no others; a real run's event
file declares headline metrics that the run does log (the evaluation's pass@k included), ``summary/*`` follow
the running best and lowest, and the layout is written. That a resumed run carries the running values on is the
exact-resume tests' (every scalar and every callback state equal to an uninterrupted run's).
"""

from __future__ import annotations

import math
import re
from types import SimpleNamespace

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from tensorboard.plugins.hparams import plugin_data_pb2

from lit_entropy.callbacks.dashboard import (
    KNOB_TAGS,
    LAYOUT,
    headline_tags,
    run_hparams,
    varied_keys,
    write_hparams,
)
from lit_entropy.callbacks.evaluation import PeriodicEvalCallback
from tests.helpers import compose_train

CHOICES = {"algo": "grpo", "callbacks/entropy": "entrocraft_hard", "callbacks": "default", "model": "tiny_countdown",
           "paths": "default", "logger": "tensorboard", "hydra/launcher": "basic", "experiment": None,
           "precision": "fp32", "module": "policy"}


def test_the_hparams_are_choices_swept_keys_overrides_and_controller_settings():
    overrides = ["optim.lr=3e-4", "callbacks.entropy.gamma=5", "algo=grpo", "+data.prompts.seed_offset=7",
                 "hydra.run.dir=x"]
    cfg = compose_train(["optim.lr=3e-4", "callbacks.entropy.gamma=5"])
    hp = run_hparams(cfg, CHOICES, overrides)
    assert hp["algo"] == "grpo" and hp["callbacks/entropy"] == "entrocraft_hard" and hp["precision"] == "fp32"
    assert not {"paths", "logger", "hydra/launcher", "experiment", "callbacks", "module"} & set(hp)
    assert hp["optim.lr"] == pytest.approx(3e-4) and hp["seed"] == 0 and hp["batch.group_size"] == 8
    assert hp["callbacks.entropy.gamma"] == 5 and hp["controller.gamma"] == 5  # the override and the setting
    assert not any(k.startswith("hydra") for k in hp)
    assert all(isinstance(v, bool | int | float | str) for v in hp.values())
    assert len(hp) < 60  # the table's columns, not the resolved tree


def test_without_hydra_the_algo_and_controller_come_from_the_config():
    hp = run_hparams(compose_train(["algo=dapo", "callbacks/entropy=none"]))
    assert hp["algo"] == "dapo" and hp["callbacks/entropy"] == "none"
    hp = run_hparams(compose_train(["callbacks/entropy=adapo"]))
    assert hp["callbacks/entropy"] == "ADAPOCallback"


def test_a_sweeps_axis_is_marked_as_differing_so_tensorboard_shows_it_first(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    sweep = ["debug=smoke", "callbacks/entropy=entrocraft_hard,adapo", "optim.lr=1e-4", "seed=range(3)"]
    assert varied_keys(["debug=smoke", "callbacks/entropy=adapo", "optim.lr=1e-4", "seed=1"], sweep) == [
        "callbacks/entropy", "seed"]
    assert varied_keys(["algo=dapo", "+x.y=2", "hydra.run.dir=d"]) == ["algo", "x.y"]  # outside a multirun
    writer = SummaryWriter(str(tmp_path))
    write_hparams(writer, {"algo": "grpo", "callbacks/entropy": "adapo", "seed": 1}, ["rollout/accuracy"],
                  ["callbacks/entropy", "seed"])
    writer.close()
    events = EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    content = events.SummaryMetadata("_hparams_/experiment").plugin_data.content
    infos = plugin_data_pb2.HParamsPluginData.FromString(content).experiment.hparam_infos
    assert {i.name: i.differs for i in infos} == {"algo": False, "callbacks/entropy": True, "seed": True}
    assert "rollout/accuracy" not in events.Tags()["scalars"]  # declared, no value written


def _chart(title: str) -> list[str]:
    for charts in LAYOUT.values():
        if title in charts:
            return charts[title][1]
    raise KeyError(title)


@pytest.mark.parametrize("title, picks, leaves", [
    ("entropy and its band or target", ["rollout/entropy", "control/band_low", "control/band_high",
                                        "control/target_entropy"], ["rollout/entropy_full", "control/band_error"]),
    ("the controller's knob", [f"control/{k}" for k in KNOB_TAGS], ["control/band_low", "control/pic_error"]),
    ("accuracy and reward", ["rollout/accuracy", "rollout/reward_mean"], ["eval/accuracy"]),
    ("evaluation pass@k", ["eval/pass@8", "eval/held_out/greedy/pass@1", "eval/transfer/sampled/pass@64"],
     ["eval/mean@8", "eval/held_out/sampled/accuracy"]),
    ("clip fractions (optimizer step)", ["train/clipfrac_low", "train/clipfrac_high"], ["train/loss"]),
    ("sampler/trainer mismatch", ["rollout_corr/kl", "rollout_corr/k3_kl"], ["rollout_corr/frac_masked"]),
])
def test_each_chart_picks_its_tags_and_no_others(title, picks, leaves):
    def drawn(tag: str) -> bool:  # TensorBoard's custom-scalars plugin: re.match of each regex
        return any(re.match(regex, tag) for regex in _chart(title))

    assert all(drawn(t) for t in picks), [t for t in picks if not drawn(t)]
    assert not any(drawn(t) for t in leaves), [t for t in leaves if drawn(t)]


def test_the_evaluation_names_the_pass_at_k_it_logs():
    splits = SimpleNamespace(prompts=SimpleNamespace(eval_splits=lambda n, seed=0: {"held_out": [], "transfer": []}))
    cb = PeriodicEvalCallback(n=8, ks=(1, 8), final_n=64, final_ks=(1, 8, 64))
    cb.evaluate_from(splits)
    assert cb.headline_tags() == [
        "eval/held_out/greedy/pass@1", "eval/held_out/sampled/pass@1", "eval/held_out/sampled/pass@8",
        "eval/held_out/sampled/pass@64", "eval/transfer/greedy/pass@1", "eval/transfer/sampled/pass@1",
        "eval/transfer/sampled/pass@8", "eval/transfer/sampled/pass@64"]
    plain = PeriodicEvalCallback(n=4, ks=(1, 4), greedy=False)
    assert plain.headline_tags() == ["eval/pass@1", "eval/pass@4"]  # no source yet: no splits known
    plain.evaluate_from(SimpleNamespace(prompts=object()))
    assert plain.headline_tags() == ["eval/pass@1", "eval/pass@4"]
    assert headline_tags(["eval/pass@4"])[-1] == "eval/pass@4"
    named = PeriodicEvalCallback(num_problems={"held_out": 4, "tuning": 0, "retention": 2}, n=4, ks=(1, 4))
    named.evaluate_from(splits)
    assert named.headline_tags() == [
        "eval/held_out/greedy/pass@1", "eval/held_out/sampled/pass@1", "eval/held_out/sampled/pass@4",
        "eval/retention/greedy/pass@1", "eval/retention/sampled/pass@1", "eval/retention/sampled/pass@4"]


@pytest.mark.integration
def test_a_run_declares_its_headline_metrics_logs_them_and_writes_the_layout(tmp_path, harness):
    run = harness.fit(["rollout=hf", "trainer.max_epochs=3", "callbacks/eval=periodic",
                       "callbacks.eval.every_n_iterations=2", "callbacks.eval.num_problems=4", "callbacks.eval.n=4",
                       "callbacks.eval.ks=[1,4]"], tmp_path)
    events = EventAccumulator(str(run.run_dir / "tensorboard"), size_guidance={"tensors": 0, "scalars": 0})
    events.Reload()
    content = events.SummaryMetadata("_hparams_/experiment").plugin_data.content
    experiment = plugin_data_pb2.HParamsPluginData.FromString(content).experiment
    declared = [m.name.tag for m in experiment.metric_infos]
    assert declared == headline_tags(["eval/pass@1", "eval/pass@4"])
    missing = [t for t in declared if t not in run.scalars]
    assert not missing, f"declared as HParams metrics but never logged: {missing}"
    hparams = {h.name for h in experiment.hparam_infos}
    assert {"algo", "callbacks/entropy", "seed", "optim.lr", "rollout.temperature"} <= hparams
    for tag, source, combine in (("summary/accuracy_best", "rollout/accuracy", max),
                                 ("summary/entropy_min", "rollout/entropy", min)):
        values = [v for _, v in run.scalars[source]]
        running = [combine(values[: i + 1]) for i in range(len(values))]
        assert [s for s, _ in run.scalars[tag]] == [s for s, _ in run.scalars[source]] == [1, 2, 3]
        assert all(math.isclose(a, b, rel_tol=1e-6) for (_, a), b in zip(run.scalars[tag], running, strict=True))
    layout = layout_pb2.Layout()
    layout.ParseFromString(events.Tensors("custom_scalars__config__")[0].tensor_proto.string_val[0])
    titles = {chart.title for category in layout.category for chart in category.chart}
    assert titles == {title for charts in LAYOUT.values() for title in charts}
