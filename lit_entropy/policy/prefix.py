"""Shared-prompt forward passes: each distinct prompt runs once, its completions attend to its cache.

A GRPO batch holds G completions per prompt. A whole-row forward computes every prompt G times; here the
distinct prompts run once (left-padded, so each one's last token sits in the last column), their keys and
values are kept, and each completion runs alone on top of its prompt's cache. On the Countdown lab
(prompts ~10 tokens, completions ~7, G = 8) that is about half the tokens of the whole-row pass.

The values are the whole-row pass's up to float rounding (the prompt runs with a padding mask and in other
company): log-probs agree to ~1e-5 nats. Every pass of a run uses this path, so the PPO ratio compares
like with like.

Gradients: the update computes its minibatch's prompt cache once with gradient, hands the micro-batches
detached copies (:meth:`PromptCache.detached`) that collect the gradient of every micro-batch's loss, and
then back-propagates the prompt pass once (:meth:`PromptCache.surrogate`): the chain rule, without running
the prompt pass's backward per micro-batch. Where the prompts hold more tokens than a micro-batch, the
cache is computed without gradient and the prompt pass is recomputed with gradient chunk by chunk for
that backward, so memory stays bounded by a micro-batch.

Rows must look like ``[prompt][response][padding]`` (what the rollout builds); :func:`prompt_layout`
checks this and that a group's rows share their prompt token for token, and returns ``None`` otherwise,
so the caller falls back to whole rows. :mod:`lit_entropy.policy.passes` makes that choice and runs both kinds of
rows behind one interface.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PromptLayout:
    """Where each row's prompt and response lie, and which distinct prompt it continues."""

    prompt_len: Tensor
    """[B] int64 prompt tokens of each row (its response starts at this column)."""
    response_len: Tensor
    """[B] int64 response tokens of each row (>= 1)."""
    prompt_id: Tensor
    """[B] int64 index of the row's prompt in ``prompt_rows``."""
    prompt_rows: Tensor
    """[P] int64 one row holding each distinct prompt."""

    @property
    def num_prompts(self) -> int:
        return int(self.prompt_rows.numel())

    def worthwhile(self) -> bool:
        """At least two rows per distinct prompt on average; below that the mask costs more than it saves."""
        return 2 * self.num_prompts <= int(self.prompt_len.numel())


def prompt_layout(input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor,
                  group_index: Tensor | None) -> PromptLayout | None:
    """The layout of right-padded ``[prompt][response][padding]`` rows, or None where rows differ from it.

    Rows with the same ``group_index`` must hold the same prompt, token for token.
    """
    if group_index is None or input_ids.dim() != 2 or input_ids.shape[0] == 0:
        return None
    resp = response_mask.bool()
    response_len = resp.sum(-1)
    if bool((response_len == 0).any()):
        return None
    prompt_len = resp.long().argmax(-1)  # first response column
    cols = torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    end = (prompt_len + response_len)[:, None]
    contiguous = torch.equal(resp, (cols >= prompt_len[:, None]) & (cols < end))
    if not contiguous or not torch.equal(attention_mask.bool(), cols < end) or bool((prompt_len < 1).any()):
        return None
    groups, prompt_id = torch.unique(group_index, return_inverse=True)
    first = torch.full((groups.numel(),), input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    first = first.scatter_reduce(0, prompt_id, torch.arange(input_ids.shape[0], device=input_ids.device), "amin")
    rep = first[prompt_id]
    masked = torch.where(cols < prompt_len[:, None], input_ids, -1)
    if not torch.equal(prompt_len, prompt_len[rep]) or not torch.equal(masked, masked[rep]):
        return None
    return PromptLayout(prompt_len.long(), response_len.long(), prompt_id, first)


def supports_prompt_cache(model: torch.nn.Module) -> bool:
    """A Hugging Face causal LM whose forward takes ``past_key_values``, ``position_ids`` and ``logits_to_keep``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    try:
        params = inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False
    return all(k in params for k in ("past_key_values", "position_ids", "logits_to_keep"))


def build_cache(config, keys: list[Tensor], values: list[Tensor]) -> object:
    """A transformers ``DynamicCache`` holding per-layer ``keys`` and ``values`` [B, kv_heads, T, head_dim]."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:  # transformers < 5
        cache = DynamicCache()
    for i, (k, v) in enumerate(zip(keys, values, strict=True)):
        cache.update(k, v, i)
    return cache


def cache_tensors(cache) -> tuple[list[Tensor], list[Tensor]]:
    """Per-layer keys and values of a transformers ``DynamicCache``."""
    if hasattr(cache, "layers"):
        return [layer.keys for layer in cache.layers], [layer.values for layer in cache.layers]
    return list(cache.key_cache), list(cache.value_cache)  # transformers < 5


def model_config(model: torch.nn.Module):
    return (model.get_base_model() if hasattr(model, "get_base_model") else model).config


@dataclass
class PromptCache:
    """Keys, values and last-position logits of some prompts, each left-padded to ``mask``'s width."""

    keys: list[Tensor]
    """Per layer [P, kv_heads, Lp, head_dim]."""
    values: list[Tensor]
    """Per layer [P, kv_heads, Lp, head_dim]."""
    last_logits: Tensor
    """[P, V] logits at each prompt's last token: the prediction of its response's first token."""
    mask: Tensor
    """[P, Lp] int64, 1 on prompt tokens (left padding is 0)."""

    def tensors(self) -> list[Tensor]:
        return [*self.keys, *self.values, self.last_logits]

    def detached(self) -> PromptCache:
        """A copy whose tensors are leaves that collect gradients (for :meth:`surrogate`)."""
        leaves = [t.detach().requires_grad_(t.is_floating_point()) for t in self.tensors()]
        n = len(self.keys)
        return PromptCache(leaves[:n], leaves[n : 2 * n], leaves[-1], self.mask)

    def surrogate(self, detached: PromptCache, scale: float = 1.0, rows: slice = slice(None)) -> Tensor:
        """A scalar whose gradient is the prompt pass's share of the step gradient: Σ ⟨tensor, its gradient⟩.

        The gradients are those ``detached`` collected, its prompts ``rows`` (this cache's prompts),
        divided by ``scale`` (a loss scaler's factor, which the backward of the surrogate applies again).
        """
        total = torch.zeros((), device=self.last_logits.device, dtype=torch.float32)
        for t, leaf in zip(self.tensors(), detached.tensors(), strict=True):
            if t.requires_grad:
                grad = leaf.grad[rows] if leaf.grad is not None else torch.zeros_like(t)
                total = total + (t.float() * (grad.float() / scale)).sum()
        return total


def left_padded_prompts(input_ids: Tensor, layout: PromptLayout, prompts: Tensor,
                        width: int | None = None) -> tuple[Tensor, Tensor]:
    """Token ids and mask [len(prompts), width] of ``prompts`` (indices into ``layout.prompt_rows``), left-padded."""
    rows = layout.prompt_rows[prompts]
    plen = layout.prompt_len[rows]
    width = int(plen.max()) if width is None else width
    cols = torch.arange(width, device=input_ids.device)[None] - (width - plen)[:, None]
    mask = cols >= 0
    ids = input_ids[rows].gather(1, cols.clamp(min=0))
    return torch.where(mask, ids, 0), mask.long()


def encode_prompts(model: torch.nn.Module, input_ids: Tensor, layout: PromptLayout, prompts: Tensor,
                   width: int | None = None) -> PromptCache:
    """One forward over ``prompts`` (left-padded to ``width``), keeping their keys, values and last logits."""
    ids, mask = left_padded_prompts(input_ids, layout, prompts, width)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1)
    keys, values = cache_tensors(out.past_key_values)
    return PromptCache(keys, values, out.logits[:, -1], mask)


def concat_caches(caches: list[PromptCache]) -> PromptCache:
    """Caches of consecutive prompt chunks (same ``mask`` width) as one."""
    if len(caches) == 1:
        return caches[0]
    cat = lambda ts: torch.cat(ts, 0)  # noqa: E731
    n = len(caches[0].keys)
    return PromptCache([cat([c.keys[i] for c in caches]) for i in range(n)],
                       [cat([c.values[i] for c in caches]) for i in range(n)],
                       cat([c.last_logits for c in caches]), cat([c.mask for c in caches]))


def repeat_rows(t: Tensor, index: Tensor) -> Tensor:
    """``t[index]`` (rows of ``t``, repeated where ``index`` repeats) with a reproducible gradient.

    A prompt's completions share its cache rows, so the backward sums several rows' gradients into one.
    On the CPU, ``t[index]``'s backward (``index_put_`` with accumulation) does that with atomic adds from
    all intra-op threads once the tensor has 32,768 elements or more (a default lab micro-batch gathers
    ~160,000): the order of the additions, hence the last bits of the gradient, changes from run to run.
    ``index_select``'s backward (``index_add_``) adds the rows one after another, the values
    ``torch.use_deterministic_algorithms(True)`` gives ``t[index]``. On CUDA ``t[index]`` stays: its
    backward sorts the indices and is deterministic, ``index_add_`` there uses atomics.
    """
    return t.index_select(0, index) if t.device.type == "cpu" else t[index]


def response_logits(model: torch.nn.Module, cache: PromptCache, input_ids: Tensor, layout: PromptLayout,
                    rows: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Shifted logits [m, width, V] of ``rows``' response tokens and their targets [m, width] (0 past a response).

    ``cache`` holds all of ``layout``'s prompts in order; ``width`` >= the rows' longest response. Column ``j``
    is the prediction of response token ``j`` (from the prompt's last position for ``j = 0``).
    """
    slot = layout.prompt_id[rows]
    plen, rlen = layout.prompt_len[rows], layout.response_len[rows]
    cols = torch.arange(width, device=input_ids.device)[None]
    targets = input_ids[rows].gather(1, (plen[:, None] + cols).clamp(max=input_ids.shape[1] - 1))
    mask = cols < rlen[:, None]
    targets = torch.where(mask, targets, 0)
    past = build_cache(model_config(model), [repeat_rows(k, slot) for k in cache.keys],
                       [repeat_rows(v, slot) for v in cache.values])
    attn = torch.cat([cache.mask[slot], mask.long()], 1)
    out = model(input_ids=targets, attention_mask=attn, position_ids=plen[:, None] + cols, past_key_values=past)
    last = repeat_rows(cache.last_logits, slot)
    shifted = torch.cat([last[:, None].to(out.logits.dtype), out.logits[:, :-1]], 1)
    return shifted, targets


def response_values(values: Tensor, layout: PromptLayout, rows: Tensor, width: int) -> Tensor:
    """Input-aligned ``values`` [B, L] of ``rows`` at their response columns, [m, width] (0 past a response)."""
    plen, rlen = layout.prompt_len[rows], layout.response_len[rows]
    cols = torch.arange(width, device=values.device)[None]
    out = values[rows].gather(1, (plen[:, None] + cols).clamp(max=values.shape[1] - 1))
    return torch.where(cols < rlen[:, None], out, 0)


def to_rows(values: Tensor, layout: PromptLayout, rows: Tensor, width: int) -> Tensor:
    """Response-aligned ``values`` [m, C] to input-aligned [m, width], zero off the response (differentiable)."""
    m, c = values.shape
    cols = torch.arange(c, device=values.device)[None]
    values = torch.where(cols < layout.response_len[rows][:, None], values, 0.0)
    out = values.new_zeros(m, width + c).scatter(1, layout.prompt_len[rows][:, None] + cols, values)
    return out[:, :width]
