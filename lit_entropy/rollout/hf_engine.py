"""Hugging Face ``generate`` as the rollout engine: needs nothing but transformers.

It samples from the trainer's own module (no copy, so weight sync is free) in chunks of prompts, and
reports the sampler's log-probs from the generation scores: the processed ones, after temperature, top-k and
top-p, renormalised over the kept tokens (as vLLM's ``processed_logprobs``), with the kept-set size per token
when the sampling truncates (:mod:`lit_entropy.policy.replay`).

Chunks sit at multiples of ``prompts_per_chunk`` in the iteration's global prompt order and each is
seeded by ``(seed, chunk index)``, so when every rank's block of prompts is a multiple of
``prompts_per_chunk`` W ranks sample exactly what one rank samples (``generate`` draws for the whole
chunk at once, so a chunk cut differently samples differently). Under FSDP2 the live module is sharded
and its forward is a collective that ranks generating different prompts cannot share: the engine then
keeps a full, unsharded copy of the weights, refreshed at every sync; so does ``copy_weights`` (the testbed's
``rollout.sync_every > 1``: the copy lags the trainer between syncs).

``dtype`` is the precision the samples are computed in, as the trainer computes its forward: under
``precision=bf16`` or ``fp16`` (fp32 weights, autocast in the trainer) generation runs under the same autocast,
so the sampler's log-probs come from the kernels the trainer's do. ``HFEngine.dtype`` reports it, and the
sampler warns when it is not the trainer's.
"""

from __future__ import annotations

import contextlib
import copy
import random

import torch

from lit_entropy.policy import model_support, prefix
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.utils import dist


class HFEngine(RolloutEngine):
    DTYPES = ("float32", "bfloat16", "float16")

    def __init__(self, model_path: str, eos_id: int, pad_id: int, prompts_per_chunk: int = 64,
                 share_prefill: bool = True, copy_weights: bool = False, dtype: str = "float32", **_: object) -> None:
        """``dtype``: ``float32``, ``bfloat16`` or ``float16``, the dtype generation computes in (autocast over
        fp32 weights; weights already in a lower dtype compute in theirs).
        ``share_prefill``: run each prompt's prefill once and copy its cache to its ``n`` samples (HF models
        whose forward takes a cache, on chunks no longer than any layer's attention window; others prefill every row).
        ``copy_weights``: sample from a copy of the weights taken at each sync instead of the live module."""
        if dtype not in self.DTYPES:
            raise ValueError(f"rollout.engine.dtype={dtype!r} must be one of {', '.join(self.DTYPES)} for the HF engine")
        self.dtype = dtype
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.prompts_per_chunk = prompts_per_chunk
        self.share_prefill = share_prefill
        self.copy_weights = copy_weights
        self.model: torch.nn.Module | None = None

    def sync_weights(self, model: torch.nn.Module) -> None:
        sharded = any(dist.is_dtensor(p) for p in model.parameters())
        if not sharded and not self.copy_weights:
            self.model = model  # generates with the live module
            return
        if not sharded:
            if self.model is None or self.model is model:
                self.model = copy.deepcopy(model)
            else:
                self.model.load_state_dict(model.state_dict())
            return
        state = dict(dist.full_state_items(model))  # collective: every rank syncs at the same time
        if self.model is None or self.model is model:
            from transformers import AutoModelForCausalLM

            replica = AutoModelForCausalLM.from_config(model.config)
            self.model = replica.to(device=next(iter(state.values())).device, dtype=next(iter(state.values())).dtype)
        self.model.load_state_dict(state)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], n: int, sampling: SamplingConfig, seed: int, first_index: int = 0
    ) -> list[list[Generation]]:
        if self.model is None:
            raise RuntimeError("HFEngine.generate called before sync_weights(model)")
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        try:
            with self.autocast(model):
                return self._generate_chunks(model, prompts, n, sampling, seed, first_index, device)
        finally:
            model.train(was_training)

    def autocast(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        """Autocast to :attr:`dtype` when the weights are wider (the trainer's mixed precision); else nothing."""
        param = next(model.parameters())
        want = getattr(torch, self.dtype)
        if torch.finfo(want).bits >= torch.finfo(param.dtype).bits:
            return contextlib.nullcontext()
        return torch.autocast(param.device.type, dtype=want)

    def _generate_chunks(self, model, prompts, n, sampling, seed, first_index, device) -> list[list[Generation]]:
        C = self.prompts_per_chunk
        result: list[list[Generation]] = []
        start = 0
        while start < len(prompts):
            g = first_index + start  # global index: chunks sit at multiples of C in the global order
            stop = min(len(prompts), start + C - g % C)
            chunk_seed = random.Random(f"{seed}:{g // C}:{g % C}").randrange(2**62)
            gen = torch.Generator(device="cpu").manual_seed(chunk_seed)
            result.extend(self._generate_chunk(model, prompts[start:stop], n, sampling, gen, device))
            start = stop
        return result

    def _generate_chunk(self, model, chunk, n, sampling, gen, device) -> list[list[Generation]]:
        width = max(len(p) for p in chunk)
        # Left-pad so every row's next token sits at the same position.
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in chunk], device=device)
        attn = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
        share = (n > 1 and width > 1 and self.share_prefill and prefix.supports_prompt_cache(model)
                 and model_support.allow_shared_prompts(model, width + sampling.max_new_tokens, "shared prefill"))
        past = self._shared_prefill(model, ids, attn, n) if share else None
        ids, attn = ids.repeat_interleave(n, 0), attn.repeat_interleave(n, 0)
        from transformers import (
            LogitsProcessorList,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        # generate() appends its own warpers AFTER a caller's processors, so the warpers are ours here (the same
        # classes in generate's order) and the stats come last: they see the distribution tokens are drawn from.
        t, k, p = sampling.engine_temperature, sampling.top_k or 0, sampling.top_p
        if sampling.greedy:  # argmax of the raw logits; the stats report the model's temperature-1 log-probs
            t, k, p = 1.0, 0, 1.0
        stats = SampledStats(with_kept=p < 1 or bool(k))
        warpers = ([TemperatureLogitsWarper(t)] if t != 1.0 else []) + ([TopKLogitsWarper(k)] if k else []) \
            + ([TopPLogitsWarper(p)] if p < 1.0 else [])
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device]):
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
            out = model.generate(
                input_ids=ids,
                attention_mask=attn,
                do_sample=not sampling.greedy,
                temperature=1.0,
                top_p=1.0,
                top_k=0,
                max_new_tokens=sampling.max_new_tokens,
                eos_token_id=self.eos_id,
                pad_token_id=self.pad_id,
                logits_processor=LogitsProcessorList([*warpers, stats]),
                return_dict_in_generate=True,
                past_key_values=past,
            )
        new = out.sequences[:, width:]
        chosen, entropy, kept = stats.finish(new)
        gens = []
        for i, (toks, lps) in enumerate(zip(new.tolist(), chosen, strict=True)):  # one conversion each
            length = toks.index(self.eos_id) + 1 if self.eos_id in toks else len(toks)
            gens.append(Generation(token_ids=toks[:length], logprobs=lps[:length],
                                   truncated=self.eos_id not in toks[:length],
                                   kept=kept[i][:length] if kept is not None else None,
                                   entropy=entropy[i][:length]))
        return [gens[k * n : (k + 1) * n] for k in range(len(chunk))]

    @staticmethod
    def _shared_prefill(model, ids: torch.Tensor, attn: torch.Tensor, n: int):
        """The prompts' cache (all but the last column), computed once per prompt and repeated for its ``n``
        samples: ``generate`` then prefills only the last column instead of every prompt ``n`` times."""
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                    use_cache=True, logits_to_keep=1)
        keys, values = prefix.cache_tensors(out.past_key_values)
        return prefix.build_cache(prefix.model_config(model), [k.repeat_interleave(n, 0) for k in keys],
                                  [v.repeat_interleave(n, 0) for v in values])


class SampledStats:
    """Per generated token, the log-prob and entropy of the distribution it was drawn from, without keeping every
    step's scores (``output_scores`` holds steps × rows × vocabulary floats: 2 GB for 64 rows × 160 steps of a
    49k vocabulary). Run last in ``generate``'s processor list, it sees the processed logits (after temperature,
    top-k, top-p; -inf outside the kept set), i.e. the sampling distribution, renormalised by the log-softmax;
    the token drawn at step t arrives as the last input id of step t + 1, so only one step's log-probs are kept.
    ``generate`` must not add warpers of its own after it (the engine passes temperature 1, top-k 0, top-p 1)."""

    def __init__(self, with_kept: bool = False) -> None:
        self.with_kept = with_kept
        self.prev: torch.Tensor | None = None
        self.logp: list[torch.Tensor] = []
        self.entropy: list[torch.Tensor] = []
        self.kept: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.logp.append(self.prev.gather(-1, input_ids[:, -1:]).squeeze(-1))
        logp = torch.log_softmax(scores.float(), dim=-1)
        self.entropy.append(torch.special.entr(logp.exp()).sum(-1))  # 0·log 0 = 0
        if self.with_kept:
            self.kept.append(torch.isfinite(scores).sum(-1))
        self.prev = logp
        return scores

    def finish(self, new: torch.Tensor) -> tuple[list, list, list | None]:
        """Per row lists of the chosen tokens' log-probs, the entropies and (top-p/top-k) the kept-set sizes."""
        if self.prev is not None and len(self.logp) < new.shape[1]:
            self.logp.append(self.prev.gather(-1, new[:, -1:]).squeeze(-1))
        self.prev = None
        chosen = torch.stack(self.logp, 1).tolist()
        entropy = torch.stack(self.entropy, 1).tolist()
        return chosen, entropy, torch.stack(self.kept, 1).tolist() if self.with_kept else None
