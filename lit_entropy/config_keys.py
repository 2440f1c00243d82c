"""Config keys that moved, and the command-line rewrite that keeps the old spellings working for a release.

The groups hold one kind of object each: sampling moved from ``data`` to ``rollout``, scoring to ``reward``,
batching from ``data`` and ``algo`` to ``batch``, and the engine's own options under ``rollout.engine``.
An override typed with an old key is rewritten to the new one with a warning naming both.
"""

from __future__ import annotations

import warnings

_ENGINE_KEYS = ("dtype", "kv_cache_gib", "gpu_memory_utilization", "enforce_eager", "max_num_seqs",
                "max_num_batched_tokens", "show_progress", "extra_engine_args", "prompts_per_chunk", "share_prefill")

RENAMED: dict[str, str] = {
    **{f"data.{k}": f"rollout.{k}" for k in ("temperature", "top_p", "max_new_tokens", "stop")},
    "data.reward_mode": "reward.mode",
    "data.reward_timeout_s": "reward.timeout_s",
    "data.reward_workers": "reward.workers",
    **{f"data.{k}": f"reward.{k}" for k in ("correct_threshold", "overlong_buffer", "overlong_penalty")},
    **{f"data.{k}": f"batch.{k}" for k in ("prompts_per_iter", "group_size")},
    **{f"algo.{k}": f"batch.{k}" for k in ("num_minibatches", "ppo_epochs", "micro_batch_size", "dynamic_sampling",
                                           "max_sampling_rounds")},
    **{f"rollout.{k}": f"rollout.engine.{k}" for k in _ENGINE_KEYS},
    # scripts/evaluate.py: sampling and scoring come from the rollout and reward groups, as in training
    **{f"eval.{k}": f"rollout.{k}" for k in ("temperature", "top_p", "max_new_tokens")},
    "eval.reward_workers": "reward.workers",
    "eval.reward_timeout_s": "reward.timeout_s",
}
"""Old key -> new key (a key below an old key moves with it, e.g. ``rollout.extra_engine_args.x``)."""


def renamed(key: str) -> str | None:
    """The new spelling of ``key`` when it (or a key above it) was renamed, else None."""
    for old, new in RENAMED.items():
        if key == old or key.startswith(old + "."):
            return new + key[len(old):]
    return None


def upgrade_overrides(overrides: list[str]) -> list[str]:
    """``overrides`` with renamed keys rewritten, each rewrite announced with a ``FutureWarning``."""
    out = []
    for arg in overrides:
        head, sep, value = arg.partition("=")
        prefix = head[: len(head) - len(head.lstrip("+~"))]
        new = renamed(head[len(prefix):]) if sep and not arg.startswith("-") else None
        if new is None:
            out.append(arg)
            continue
        warnings.warn(f"config key {head[len(prefix):]} is now {new}; the old spelling will stop working in the "
                      "next release", FutureWarning, stacklevel=2)
        out.append(f"{prefix}{new}={value}")
    return out
