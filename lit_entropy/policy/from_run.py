"""A finished run's policy: its checkpoint's weights, read weights-only, in the model its run config names. What
the evaluation (``scripts/evaluate.py``) and the export (``scripts/export.py``) both load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from lit_entropy.policy.models import PolicyBundle, TinyLabPolicy, WarmStart
from lit_entropy.utils.checkpointing import TRUST_OPTION, load_checkpoint


def find_run_config(ckpt: Path) -> Path | None:
    """The run's ``.hydra/config.yaml``: beside ``checkpoints/`` (or beside the checkpoint itself)."""
    for folder in (ckpt.resolve().parent.parent, ckpt.resolve().parent):
        candidate = folder / ".hydra" / "config.yaml"
        if candidate.is_file():
            return candidate
    return None


def checkpoint_policy_weights(ckpt: Path, trust: bool = False, trust_option: str = TRUST_OPTION
                              ) -> dict[str, torch.Tensor]:
    """The policy's tensors (the ``model.<key>`` entries of a Lightning checkpoint's state dict, prefix removed),
    loaded weights-only (:func:`lit_entropy.utils.checkpointing.load_checkpoint`; ``trust``: fully)."""
    blob = load_checkpoint(ckpt, trust=trust, trust_option=trust_option)
    state = blob.get("state_dict", blob) if isinstance(blob, dict) else None
    if not isinstance(state, dict):
        raise ValueError(f"{ckpt}: no state_dict in the checkpoint")
    weights = {k[len("model."):]: v for k, v in state.items() if isinstance(k, str) and k.startswith("model.")}
    if not weights:
        raise ValueError(f"{ckpt}: no 'model.*' keys in the state dict (found e.g. {list(state)[:3]})")
    return weights


def load_checkpoint_weights(model: torch.nn.Module, ckpt: Path, weights: dict[str, torch.Tensor] | None = None,
                            trust: bool = False) -> None:
    """Load the policy tensors of checkpoint ``ckpt`` (``weights``, where already read) into ``model``."""
    if weights is None:
        weights = checkpoint_policy_weights(ckpt, trust)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = getattr(getattr(model, "config", None), "tie_word_embeddings", False)
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{ckpt} does not match the model: missing {missing[:5]}, unexpected {unexpected[:5]}"
                         " (set model= to the run's model, or keep .hydra/config.yaml beside checkpoints/)")
    if tied and hasattr(model, "tie_weights"):
        model.tie_weights()


def build_policy(cfg: DictConfig, model_overridden: bool, scratch: Path, trust_option: str = TRUST_OPTION,
                 prompts: Any = None) -> tuple[PolicyBundle, str]:
    """The policy bundle and a one-line description of where its weights come from.

    The checkpoint (``cfg.ckpt_path``) is read first, weights-only (``cfg.trust_checkpoint``: fully), so a file
    that is refused costs no model build. ``prompts`` (a prompt source), where given, is checked against a model
    that reads only some prompts (the lab's character model) before anything is built, as training does."""
    ckpt = Path(cfg.ckpt_path) if cfg.ckpt_path else None
    weights = (checkpoint_policy_weights(ckpt, bool(cfg.get("trust_checkpoint", False)), trust_option)
               if ckpt is not None else None)
    run_cfg = OmegaConf.load(p) if ckpt and not model_overridden and (p := find_run_config(ckpt)) else None
    spec: Any = instantiate((run_cfg or cfg).model)
    what = f"{type(spec).__name__} from the run config" if run_cfg else f"{type(spec).__name__} (model group)"
    if isinstance(spec, TinyLabPolicy):
        if prompts is not None:
            spec.check_prompts(prompts, int(cfg.rollout.max_new_tokens))
        spec.cache_dir = str(cfg.paths.cache_dir)
        if ckpt is not None:  # the checkpoint brings the weights: the architecture only, outside the cache
            ws = spec.warmstart
            spec.warmstart = WarmStart(steps=0, batch_size=ws.batch_size, lr=ws.lr, seed=ws.seed)
            spec.cache_dir = str(scratch)
        else:
            what += f", {spec.warmstart.steps} warm-start steps"
    bundle = spec.build()
    if ckpt is not None:
        load_checkpoint_weights(bundle.model, ckpt, weights)
        what += f" + weights of {ckpt}"
    bundle.model.eval()
    return bundle, what
