"""LoRA adapters through peft: only the adapters train; the rollout engine gets merged full weights.

``model.lora: {r, alpha, dropout, target_modules}`` wraps the policy in a ``peft`` ``PeftModel`` after it
is built. The weight sync hands the engine the base model's names with ``W + ΔW`` (ΔW = B·A·alpha/r)
computed on the side, so the trainer's weights are never merged in place (no merge/unmerge round-off
drift). The KL reference is the same model with its adapters disabled: no second copy of the weights.

The default targets, peft's ``"all-linear"``, are every linear (and GPT-2 ``Conv1D``) layer but the output
head, whatever the family names them: Llama-style ``q_proj``…``down_proj``, Phi-3's fused ``qkv_proj`` and
``gate_up_proj``, GPT-2's ``c_attn``/``c_fc``/``c_proj``, GPT-NeoX's ``query_key_value``/``dense*``, and
(through peft's parameter wrappers) the fused experts and router of Mixture-of-Experts models. On
Llama-style models it is the same set of layers as the former explicit list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

ALL_LINEAR = "all-linear"


@dataclass
class LoRAConfig:
    """Low-rank adapters on the linear layers named in ``target_modules``."""

    r: int = 8
    """Rank of each adapter."""
    alpha: float = 16.0
    """Scale: the update is ``B·A·alpha/r``."""
    dropout: float = 0.0
    """Dropout on the adapter's input during training (0 keeps the first ratio exactly 1)."""
    target_modules: str | list[str] = ALL_LINEAR
    """Module names (suffixes) that get adapters, or ``"all-linear"`` (every linear layer but the output head,
    on every family)."""

    def __post_init__(self) -> None:
        if not isinstance(self.target_modules, str):
            self.target_modules = list(self.target_modules)
        if self.r < 1:
            raise ValueError(f"model.lora.r={self.r} must be >= 1")
        if not self.alpha > 0:
            raise ValueError(f"model.lora.alpha={self.alpha} must be > 0")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.lora.dropout={self.dropout} must be in [0, 1)")
        if not self.target_modules:
            raise ValueError("model.lora.target_modules is empty")


def as_lora_config(value: Any) -> LoRAConfig | None:
    """``None``, a :class:`LoRAConfig`, or a mapping of its fields (what Hydra hands over)."""
    if value is None or isinstance(value, LoRAConfig):
        return value
    unknown = set(value) - set(LoRAConfig.__dataclass_fields__)
    if unknown:
        raise ValueError(f"model.lora: unknown keys {sorted(unknown)}; known: {sorted(LoRAConfig.__dataclass_fields__)}")
    return LoRAConfig(**dict(value))


def apply_lora(model: torch.nn.Module, cfg: LoRAConfig) -> torch.nn.Module:
    """Wrap ``model`` with fresh adapters (B = 0, so the wrapped model computes exactly the base model)."""
    from peft import LoraConfig, get_peft_model

    names = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
    missing = [] if isinstance(cfg.target_modules, str) else [t for t in cfg.target_modules if t not in names]
    if missing:
        raise ValueError(f"model.lora.target_modules: {missing} are not modules of this model")
    peft_cfg = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                          target_modules=cfg.target_modules, bias="none")
    return get_peft_model(model, peft_cfg)


def is_peft(model: torch.nn.Module) -> bool:
    return hasattr(model, "disable_adapter") and hasattr(model, "get_base_model")


def base_name(name: str) -> str:
    """``name`` in the unwrapped model: peft's ``.base_layer`` segments (nested for wrapped parameters) removed."""
    return re.sub(r"\.base_layer(?=\.|$)", "", name)


@torch.no_grad()
def merged_state_items(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The base model's ``(name, tensor)`` pairs with each adapter's ΔW added: what an engine loads."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    deltas: dict[str, torch.Tensor] = {}
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            active = [a for a in module.active_adapters if a in module.lora_A]
            if active:  # a layer's weight, or the parameter a wrapper (MoE experts, routers) adapts
                target = f"{base_name(name)}.{getattr(module, 'parameter_name', 'weight')}"
                deltas[target] = sum(module.get_delta_weight(a) for a in active)
    items = []
    for key, tensor in base.state_dict().items():
        if ".lora_" in key:
            continue
        name = base_name(key)
        items.append((name, tensor + deltas[name] if name in deltas else tensor))
    return items
