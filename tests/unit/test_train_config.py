"""The real Hydra config: every group composes and instantiates; bad keys and values fail by name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException, InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_entropy.algo import AlgoConfig
from lit_entropy.train import instantiate_callbacks
from tests.helpers import CONF, compose_train

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_default_composition_has_every_group():
    cfg = compose_train(OUT)
    for key in ("model", "data", "rollout", "reward", "batch", "algo", "correction", "optim", "module", "callbacks", "trainer",
                "logger", "paths"):
        assert key in cfg, key
    assert cfg.callbacks.entropy._target_.endswith("EntrocraftCallback")
    assert cfg.callbacks.entropy.mode == "hard" and cfg.callbacks.entropy.nsr_reward_offset == 1.0
    assert cfg.trainer.reload_dataloaders_every_n_epochs == 1
    assert cfg.trainer.precision == "32-true" and cfg.rollout.engine.dtype == "float32"


@pytest.mark.parametrize("group", ["algo", "correction", "optim", "rollout", "reward", "batch", "data", "model", "module", "precision",
                                   "trainer", "logger", "debug", "experiment", "callbacks/entropy",
                                   "callbacks/diagnostics", "callbacks/eval", "callbacks/law", "callbacks/stop"])
def test_every_option_composes(group):
    names = options(group)
    assert names, f"no options in conf/{group}"
    for name in names:
        cfg = compose_train([f"{group}={name}", *OUT])
        assert isinstance(OmegaConf.to_container(cfg, resolve=True), dict)  # every interpolation resolves


def test_callbacks_entropy_attach_and_detach():
    on = instantiate_callbacks(compose_train(["callbacks/entropy=entrocraft", *OUT]).callbacks)
    off = instantiate_callbacks(compose_train(["callbacks/entropy=none", *OUT]).callbacks)
    names_on = {type(c).__name__ for c in on}
    names_off = {type(c).__name__ for c in off}
    assert "EntrocraftCallback" in names_on and "EntrocraftCallback" not in names_off
    assert names_on - names_off == {"EntrocraftCallback"}


def test_entrocraft_hard_is_entrocraft_with_two_keys_changed():
    hard = OmegaConf.to_container(compose_train(["callbacks/entropy=entrocraft_hard", *OUT]).callbacks.entropy)
    paper = OmegaConf.to_container(compose_train(["callbacks/entropy=entrocraft", *OUT]).callbacks.entropy)
    assert paper["mode"] == "paper" and hard["mode"] == "hard" and hard["nsr_reward_offset"] == 1.0
    assert {k for k in paper if paper[k] != hard[k]} == {"mode", "nsr_reward_offset"}
    moved = compose_train(["callbacks/entropy=entrocraft_hard", "callbacks.entropy.band.start=[0.5,0.6]", *OUT])
    assert list(moved.callbacks.entropy.band.start) == [0.5, 0.6]


def test_smoke_overlay_shrinks_the_run():
    cfg = compose_train(["debug=smoke", *OUT])
    assert cfg.trainer.max_epochs <= 3 and cfg.batch.prompts_per_iter <= 8


def test_instantiate_pieces_without_engines():
    cfg = compose_train(OUT)
    algo = instantiate(cfg.algo)
    assert isinstance(algo, AlgoConfig) and algo.eps_low == 0.2
    instantiate(cfg.optim)
    instantiate(cfg.data.prompts).sample(3, iteration=0)


def test_unknown_key_names_itself():
    with pytest.raises(ConfigCompositionException, match="algo.eps_hgih"):
        compose_train(["algo.eps_hgih=0.3", *OUT])


def test_unknown_group_option_names_itself():
    with pytest.raises(ConfigCompositionException, match="bogus"):
        compose_train(["callbacks/entropy=bogus", *OUT])


def test_bad_value_names_itself():
    cfg = compose_train(["algo.eps_low=1.5", *OUT])
    with pytest.raises(InstantiationException, match="eps_low"):
        instantiate(cfg.algo)
    cfg = compose_train(["data.prompts.task.num_numbers=40", *OUT])
    with pytest.raises(InstantiationException, match="num_numbers"):
        instantiate(cfg.data.prompts)


def test_unknown_key_inside_a_config_file_names_itself(tmp_path: Path):
    cfg = compose_train(OUT)
    cfg.algo = OmegaConf.merge(OmegaConf.create({}), cfg.algo)
    OmegaConf.set_struct(cfg, False)
    cfg.algo.epsilon = 0.3
    with pytest.raises(InstantiationException, match="epsilon"):
        instantiate(cfg.algo)


@pytest.fixture(scope="module")
def controller_nodes() -> dict[str, object]:
    """Each controller's ``callbacks`` node, composed by Hydra once (with the default algo); ``None``: the default
    config's."""
    return {None: compose_train(OUT).callbacks,
            **{c: compose_train([f"callbacks/entropy={c}", *OUT]).callbacks for c in options("callbacks/entropy")}}


def test_a_controller_file_composes_into_its_own_node_only():
    """What lets the pairs below be formed without composing each: no controller file is global or names
    another group in its defaults (its defaults list may name files of its own group)."""
    for f in sorted((CONF / "callbacks" / "entropy").glob("*.yaml")):
        text = f.read_text()
        assert "@package" not in text, f
        defaults = OmegaConf.create(text).get("defaults") or []
        assert all(isinstance(d, str) and "/" not in d and ":" not in d for d in defaults), (f, defaults)


@pytest.mark.parametrize("preset", options("algo"))
def test_every_algo_preset_instantiates_with_every_controller(preset, controller_nodes):
    """Every algo × controller pair instantiates. The preset is composed by Hydra once; each controller's node
    (composed once) takes the place of the default's, interpolations resolving against the pair, which is what
    composing the pair gives when neither file reaches into the other's node (the test above; a preset that sets
    ``callbacks`` itself is composed with each controller)."""
    cfg = compose_train([f"algo={preset}", *OUT])
    algo = instantiate(cfg.algo)
    assert algo.name == preset
    default = controller_nodes[None]
    for controller, node in controller_nodes.items():
        if controller is None:
            continue
        if cfg.callbacks != default:  # the preset reaches into callbacks: compose the pair
            pair = compose_train([f"algo={preset}", f"callbacks/entropy={controller}", *OUT])
        else:
            pair = cfg.copy()
            pair.callbacks = node.copy()
        assert instantiate(pair.algo).name == preset
        instantiate_callbacks(pair.callbacks)


def test_runs_started_in_the_same_second_get_their_own_folders():
    import subprocess
    import sys

    from tests.helpers import ROOT

    code = ("import sys; sys.path.insert(0, {root!r})\n"
            "from hydra import compose, initialize_config_dir\n"
            "with initialize_config_dir(config_dir={conf!r}, version_base='1.3'):\n"
            "    cfg = compose(config_name='train', return_hydra_config=True)\n"
            "print(cfg.hydra.run.dir)\n").format(root=str(ROOT), conf=str(ROOT / "conf"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)]
    dirs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(d and "/runs/" in d for d in dirs), dirs
    assert len(set(dirs)) == 3, dirs
    assert len({d.rsplit("_", 1)[0] for d in dirs}) <= 2  # started within the same second (or two)


@pytest.mark.parametrize("override,key", [("rollout.engine.kv_cache_gib=0", "rollout.engine.kv_cache_gib"),
                                          ("data=jsonl", "outside its alphabet"),  # the char model, word problems
                                          ("optim.lr=inf", "optim.lr"),
                                          ("reward.workers=0", "reward.workers")])
def test_bad_values_fail_before_the_warm_start(tmp_path, monkeypatch, capsys, override, key):
    """``lit-entropy-train`` (in-process, as its console command runs it) stops on a bad value with the value's key
    in its message, before it builds a warm start: the shipped start refused, an empty cache, and no warm start
    written."""
    import json
    import sys

    from hydra.core.global_hydra import GlobalHydra

    from lit_entropy.cli import train as train_cli
    from tests.harness import process_state

    overrides = [override]
    if override == "data=jsonl":  # GSM8K-like questions: capitals, '$', '?' are not in the lab's alphabet
        questions = tmp_path / "questions.jsonl"
        rows = [{"question": "Janet has 16 eggs and eats 3. How many are left?", "answer": "13"},
                {"question": "A book costs $12. What do 3 books cost?", "answer": "36"}]
        questions.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        overrides.append(f"data.prompts.path={questions}")
    cache = tmp_path / "cache"  # empty, and the shipped warm start refused: a warm start would have to be built first
    monkeypatch.setattr(sys, "argv", ["lit-entropy-train"])
    try:
        with process_state(), pytest.raises(SystemExit) as stop:  # what the start-up sets goes back after
            train_cli.main([*overrides, "model.shipped=false", f"paths.cache_dir={cache}", f"paths.log_dir={tmp_path}",
                            f"hydra.run.dir={tmp_path / 'run'}"])
    finally:
        GlobalHydra.instance().clear()
    printed = capsys.readouterr()
    assert stop.value.code not in (0, None)
    assert key in printed.err + printed.out
    assert not (cache / "warmstart").exists() and "Warm start done" not in printed.err + printed.out


def test_values_are_checked_with_their_config_keys():
    from lit_entropy.algo import OptimConfig
    from lit_entropy.rewards.config import RewardConfig
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.batch import BatchConfig
    from lit_entropy.rollout.sampler import Sampler
    from lit_entropy.rollout.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="optim.lr"):
        OptimConfig(lr=float("inf"))
    with pytest.raises(ValueError, match="reward.workers"):
        RewardConfig(workers=0)
    with pytest.raises(ValueError, match="reward.timeout_s"):
        RewardConfig(timeout_s=float("nan"))
    with pytest.raises(ValueError, match="batch.group_size"):
        BatchConfig(group_size=1)
    with pytest.raises(ValueError, match="rollout.top_p"):
        SamplingConfig(top_p=0.0)
    with pytest.raises(ValueError, match="reward.overlong_buffer"):
        Sampler(None, SamplingConfig(max_new_tokens=8), RewardConfig(overlong_buffer=9))
    with pytest.raises(ValueError, match="rollout.engine.kv_cache_gib"):
        VLLMEngine.validate(kv_cache_gib=-1)
    with pytest.raises(ValueError, match="rollout.engine.dtype"):
        VLLMEngine.validate(dtype="float8")


def test_a_target_that_does_not_import_names_its_key_module_and_the_path_fix():
    from lit_entropy.train import fit

    cfg = compose_train(["debug=smoke", "data.prompts._target_=no_such_task_module.MyPrompts", *OUT])
    with pytest.raises(ImportError, match="data.prompts._target_=no_such_task_module.MyPrompts") as err:
        fit(cfg)
    assert "No module named 'no_such_task_module'" in str(err.value) and "PYTHONPATH" in str(err.value)


def test_lightnings_own_checkpoint_is_off_when_ours_is_removed():
    """``~callbacks.checkpoint``: no checkpoint at all, not Lightning's default one (a whole pickle every epoch)."""
    from lit_entropy.callbacks.checkpoint import IterationCheckpoint
    from lit_entropy.train import lightning_checkpointing

    assert lightning_checkpointing([]) == {"enable_checkpointing": False}
    assert lightning_checkpointing([IterationCheckpoint(dirpath="unused")]) == {}
