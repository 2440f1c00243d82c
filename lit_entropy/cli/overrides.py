"""Command-line overrides checked before Hydra composes them, so that a mistake gets a message that says the fix.

Hydra answers an unknown key with "To append to your config use +algo.eps_hihg=0.28": advice that cannot work for
a key of an object built from a ``_target_`` class (``algo``, ``batch``, ``optim``, a controller, …), whose class
then refuses the extra argument with a ``TypeError``. And it answers a missing option with the file the group was
composed from (``In 'callbacks/default': Could not find …``), which the user never opened. :func:`check` runs
first and names, for an unknown key, the nearest keys of the same node and, for a TRL or verl name, our key from
the mapping of docs/from_trl_verl.md (:data:`FOREIGN`); for an unknown option, the group typed and its options.
Anything it cannot judge (a parse error, a ``+``/``~`` override, a ``hydra.*`` key, a user's config folder on
``hydra.searchpath``) is left to Hydra.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FOREIGN: dict[str, str] = {
    # TRL's GRPOConfig / TrainingArguments and verl's keys (their last part) → ours
    "num_generations": "batch.group_size",
    "train_batch_size": "batch.prompts_per_iter",
    "generation_batch_size": "batch.prompts_per_iter",
    "per_device_train_batch_size": "batch.micro_batch_size",
    "ppo_micro_batch_size_per_gpu": "batch.micro_batch_size",
    "ppo_mini_batch_size": "batch.num_minibatches",
    "ppo_max_token_len_per_gpu": "batch.micro_batch_tokens",
    "num_iterations": "batch.ppo_epochs",
    "max_steps": "trainer.max_epochs",
    "num_train_epochs": "trainer.max_epochs",
    "total_epochs": "trainer.max_epochs",
    "total_training_steps": "trainer.max_epochs",
    "max_completion_length": "rollout.max_new_tokens",
    "max_response_length": "rollout.max_new_tokens",
    "vllm_gpu_memory_utilization": "rollout.engine.gpu_memory_utilization",
    "gpu_memory_utilization": "rollout.engine.gpu_memory_utilization",
    "epsilon": "algo.eps_low",
    "epsilon_high": "algo.eps_high",
    "clip_ratio": "algo.eps_low",
    "clip_ratio_low": "algo.eps_low",
    "clip_ratio_high": "algo.eps_high",
    "clip_ratio_c": "algo.dual_clip",
    "beta": "algo.kl_coef",
    "kl_loss_coef": "algo.kl_coef",
    "kl_loss_type": "algo.kl_kind",
    "entropy_coeff": "algo.entropy_coef",
    "loss_agg_mode": "algo.loss_agg",
    "loss_type": "algo.loss_agg",
    "mask_truncated_completions": "batch.mask_truncated_completions",
    "learning_rate": "optim.lr",
    "lr_warmup_steps": "optim.warmup_steps",
    "grad_clip": "optim.max_grad_norm",
    "adam_epsilon": "optim.eps",
}
"""TRL's and verl's names (the last part of their keys) and the key that holds the same setting here."""


class OverrideError(SystemExit):
    """An override that cannot compose; its message names the fix (raised as ``SystemExit``: printed, exit 1)."""


def _plain(arg: str) -> bool:
    return "=" in arg and not arg.startswith("-")


def check(args: Sequence[str], config_dir: Path, config_name: str) -> None:
    """Raise :class:`OverrideError` for the first unknown option or key among ``args`` (a command line of Hydra
    overrides and flags); return when every one it can judge exists."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = [a for a in args if _plain(a)]
    if not items or any(a.lstrip("+~").startswith("hydra.searchpath") for a in items):
        return
    try:
        parsed = OverridesParser.create().parse_overrides(items)
    except Exception:  # Hydra's own message says what does not parse
        return
    groups, keys = [], []
    for item, override in zip(items, parsed, strict=True):
        name = override.key_or_group
        if override.is_add() or override.is_delete() or override.is_force_add() or "@" in name \
                or name.startswith("hydra") or override.package is not None:
            continue
        if (config_dir / name).is_dir():
            values = list(override.sweep_string_iterator()) if override.is_sweep_override() else [override.value()]
            for value in values:  # a list of options (logger=[tensorboard,csv]) checks each
                for option in value if isinstance(value, list) else [value]:
                    _check_option(config_dir, name, option)
            groups.append(item if not override.is_sweep_override() else f"{name}={values[0]}")
        else:
            keys.append((item, name))
    if not keys:
        return
    try:
        with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
            cfg = compose(config_name=config_name, overrides=groups)
    except Exception:
        return
    for item, key in keys:
        if not has_key(cfg, key):
            raise OverrideError(unknown_key_message(cfg, key, item))


def has_key(cfg: Any, key: str) -> bool:
    """Whether the dotted ``key`` is in ``cfg``, a mandatory value (``???``, such as ``data.prompts.path`` of
    ``data=jsonl``) included."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    parent, _, name = key.rpartition(".")
    node = OmegaConf.select(cfg, parent, default=None, throw_on_missing=False) if parent else cfg
    if isinstance(node, DictConfig):
        return name in node.keys()
    if isinstance(node, ListConfig):
        return name.isdigit() and int(name) < len(node)
    return False


def _check_option(config_dir: Path, group: str, value: Any) -> None:
    options = sorted(p.stem for p in (config_dir / group).glob("*.yaml"))
    if value is None or str(value) in ("null", "None") or str(value) in options:
        return
    close = difflib.get_close_matches(str(value), options, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(f'{group}={c}' for c in close)}?" if close else ""
    raise OverrideError(f"{group}={value}: the group {group} has no option {value!r}.{hint} "
                        f"Its options: {', '.join(options)}.")


def unknown_key_message(cfg: Any, key: str, item: str) -> str:
    """What to say about ``key`` (absent from the composed ``cfg``; ``item`` is the override as typed)."""
    from omegaconf import DictConfig, OmegaConf

    parts = key.split(".")
    depth = len(parts) - 1
    while depth > 0 and not isinstance(OmegaConf.select(cfg, ".".join(parts[:depth]), default=None), DictConfig):
        depth -= 1
    parent = ".".join(parts[:depth])
    node = OmegaConf.select(cfg, parent) if parent else cfg
    name = parts[depth]
    where = f"{parent} has no key {name!r}" if parent else f"the config has no top-level key {name!r}"
    message = [f"{item}: unknown key {key!r} ({where})."]
    siblings = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(name, siblings, n=3, cutoff=0.6)
    if close:
        message.append("Did you mean " + " or ".join(".".join([*parts[:depth], c]) for c in close) + "?")
    ours = FOREIGN.get(parts[-1])
    if ours and ours != key:
        message.append(f"{parts[-1]!r} is a TRL/verl name; here the setting is {ours} (docs/from_trl_verl.md).")
    if isinstance(node, DictConfig) and "_target_" in node:
        message.append(f"{parent or 'it'} is built from {node['_target_']}, which takes only the keys it has.")
    elif depth > 0 and not close:  # a free-form node (algo.loss_args, …), and no near key that was meant instead
        message.append(f"To add a key of your own to {parent}, write +{key}=...")
    message.append("(--cfg job prints the composed config with every key.)")
    return " ".join(message)
