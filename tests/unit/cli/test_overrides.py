"""Overrides checked before Hydra (lit_entropy.cli.overrides): an unknown key names its nearest keys and, for a TRL or
verl name, ours; an unknown option names the group typed and its options; advice to append a key is given only
where the node can take one; everything valid passes through to Hydra unchanged."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lit_entropy.cli import config_dir
from lit_entropy.cli.overrides import FOREIGN, OverrideError, check
from tests.helpers import compose_train

CONF = config_dir()


def refused(*args: str) -> str:
    with pytest.raises(OverrideError) as err:
        check(list(args), CONF, "train")
    assert err.value.code != 0
    return str(err.value)


def test_a_misspelt_key_names_the_nearest_and_no_append_advice_for_a_typed_object():
    message = refused("debug=smoke", "algo.eps_hihg=0.28")
    assert "algo.eps_hihg=0.28" in message and "Did you mean algo.eps_high?" in message
    assert "+algo" not in message and "AlgoConfig" in message


def test_a_trl_or_verl_name_gets_our_key():
    assert "batch.group_size" in refused("batch.num_generations=4")
    assert "optim.lr" in refused("optim.learning_rate=1e-5")
    assert "algo.eps_high" in refused("algo.clip_ratio_high=0.28")


def test_an_unknown_option_names_the_group_typed_and_its_options():
    message = refused("callbacks/eval=default")
    assert "callbacks/eval has no option 'default'" in message and "none, periodic" in message
    assert "callbacks/default" not in message  # not the file the user never opened
    assert "callbacks/entropy=adapo" in refused("-m", "callbacks/entropy=none,adapoo")  # each value of a sweep


def test_a_free_form_node_and_the_top_level_get_what_works():
    assert "+algo.loss_args.tau=..." in refused("algo.loss_args.tau=1")
    message = refused("seeed=3")
    assert "Did you mean seed?" in message and "+" not in message


def test_valid_overrides_pass_through_to_hydra():
    check(["-m", "debug=smoke", "algo=dapo,grpo", "algo.eps_high=0.3", "+algo.loss_args.tau=1", "~callbacks.progress",
           "hydra.run.dir=x", "model=hf", "model.name_or_path=some/dir", "experiment=real_lm", "seed=1,2",
           "callbacks/entropy=null", "--cfg", "job"], CONF, "train")
    check(["data=jsonl", "data.prompts.path=q.jsonl"], CONF, "train")  # a mandatory value (???) is a key too
    check(["logger=[tensorboard,csv]", "logger.csv.name=x"], CONF, "train")  # a list of options
    check(["logger=[]"], CONF, "train")
    assert "logger=wandb" in refused("logger=[tensorboard,wandbb]")
    check(["ckpt_path=x.ckpt", "eval.n=4", "data=math500"], CONF, "evaluate")
    with pytest.raises(OverrideError, match="eval.n"):
        check(["eval.nn=4"], CONF, "evaluate")


def test_every_key_the_mapping_names_exists():
    cfg = compose_train([])
    missing = object()
    absent = {name: ours for name, ours in FOREIGN.items()
              if OmegaConf.select(cfg, ours, default=missing, throw_on_missing=False) is missing}
    assert not absent, absent


def test_the_train_command_refuses_before_hydra(monkeypatch, capsys):
    from lit_entropy.cli import train as train_cli

    with pytest.raises(SystemExit, match="Did you mean algo.eps_high"):
        train_cli.main(["algo.eps_hihg=0.28"])
