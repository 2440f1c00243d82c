"""The config tree: one kind of object per group, one source of defaults, old keys that still work."""

from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path

import pytest
import yaml

from tests.helpers import CONF, compose_train

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]


def load_target(path: str):
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def target_nodes(node, where: str):
    """(key path, node) of every mapping with a ``_target_`` in a parsed YAML file."""
    if isinstance(node, dict):
        if "_target_" in node:
            yield where, node
        for key, child in node.items():
            yield from target_nodes(child, f"{where}.{key}" if where else str(key))


def is_derived(path: Path, text: dict) -> bool:
    """A preset that starts from another option of its group (``defaults: [grpo]``) states what differs."""
    return any(isinstance(d, str) and d.split("@")[0] in {p.stem for p in path.parent.glob("*.yaml")}
               for d in (text.get("defaults") or []))


def shipped_yaml() -> list[Path]:
    return sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", shipped_yaml(), ids=lambda p: str(p.relative_to(CONF)))
def test_yaml_values_agree_with_dataclass_defaults(path: Path):
    """Where a base YAML file builds a dataclass, every value it states is that field's default: the
    dataclass is the one source of defaults and the YAML shows them (derived presets state what differs)."""
    text = yaml.safe_load(path.read_text()) or {}
    if is_derived(path, text):
        return
    for where, node in target_nodes(text, ""):
        cls = load_target(node["_target_"])
        if not dataclasses.is_dataclass(cls):
            continue
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(cls)
                    if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING}
        for key, value in node.items():
            if key.startswith("_") or key not in defaults or isinstance(value, dict) or isinstance(value, str) and ("${" in value or value == "???"):
                continue
            want = defaults[key]
            want = list(want) if isinstance(want, tuple) else want
            assert value == want, f"{path.relative_to(CONF)}:{where}.{key} = {value!r}, {cls.__name__} says {want!r}"


def test_sampling_keys_agree_with_sampling_config():
    from lit_entropy.rollout.base import SamplingConfig

    fields = {f.name: f.default for f in dataclasses.fields(SamplingConfig)}
    for path in sorted((CONF / "rollout").glob("*.yaml")):
        node = yaml.safe_load(path.read_text())
        assert set(node) - {"engine"} == set(fields), path.name
        for key, default in fields.items():
            assert node[key] == (list(default) if isinstance(default, tuple) else default), (path.name, key)


def test_groups_hold_one_kind_of_object():
    cfg = compose_train(OUT)
    assert set(cfg.rollout) == {"engine", "temperature", "top_p", "top_k", "max_new_tokens", "stop", "sync_every",
                                "temperature_error", "max_staleness", "staleness_policy", "engine_cores", "greedy"}
    assert "temperature" not in cfg.data and "reward_mode" not in cfg.data and "prompts_per_iter" not in cfg.data
    assert "micro_batch_size" not in cfg.algo and "dynamic_sampling" not in cfg.algo
    assert cfg.module.temperature == cfg.rollout.temperature
    assert (cfg.module.top_p, cfg.module.top_k) == (cfg.rollout.top_p, cfg.rollout.top_k)  # the trainer replays them
    dapo = compose_train(["algo=dapo", *OUT])
    assert dapo.batch.dynamic_sampling and dapo.algo.name == "dapo" and dapo.algo.eps_high == 0.28
    math = compose_train(["data=math500", "rollout=hf", *OUT])
    assert math.rollout.max_new_tokens == 512 and math.batch.prompts_per_iter == 64 and math.reward.timeout_s == 10
