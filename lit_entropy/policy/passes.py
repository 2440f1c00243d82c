"""Forward passes over a minibatch's rows, whole or on shared prompts, behind one interface.

:func:`for_rows` looks at the rows and picks how they run:

* :class:`SharedPrompts` when ``share_prompts`` is on, the model takes a key/value cache, and the rows
  are groups of completions of one prompt each (:func:`lit_entropy.policy.prefix.prompt_layout`) with at least
  two rows per prompt: each distinct prompt runs once and its completions run on its cache;
* :class:`WholeRows` otherwise: every row runs as one sequence.

Either way the caller sees the same two passes:

* the update's pass, with gradient::

      for mb in rows.micro_batches():      # rows, padding, fields, logp, ent
          backward(loss(mb))
      rows.finish_backward(backward, loss_scale)

  ``finish_backward`` is a no-op for whole rows; for shared prompts it back-propagates the prompt pass
  once, with the gradient every micro-batch left on the prompts' cache (:mod:`lit_entropy.policy.prefix`).
* passes without gradient (the pre-update pass, the reference model's, Clip-Cov's current log-probs):
  ``rows.no_grad(model, with_entropy=..., with_scores=..., topk=...)``, in eval mode and the trainer's
  precision context, returns a :class:`TokenStats` of full ``[B, L]`` CPU tensors aligned with
  ``input_ids``, zero where nothing was computed, None for what was not asked for.

Micro-batches take ``micro_batch_size`` rows, longest first (the whole row, or its response on shared
prompts), each cut to its longest row, so little compute goes to padding; with a token budget
(``micro_batch_tokens``) they take as many rows as fit in it, so short rows run in larger matmuls. On W ranks the micro-batches, which
do not depend on W, are dealt out to the ranks (:func:`lit_entropy.utils.dist.micro_batches`): every rank
runs the same number, a zero-weight ``padding`` one where it has run out, since FSDP2's forward and DDP's
backward are collectives. Passes without gradient all-gather their rows, so every rank gets what one rank
computes, bitwise.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from lit_entropy.diagnostics.discriminator import token_logprobs_entropy_and_scores, token_scores
from lit_entropy.diagnostics.entropy import align_to_input, shift_for_causal_lm, token_logprobs_and_entropy
from lit_entropy.diagnostics.topk import topk_logprobs
from lit_entropy.policy import model_support, prefix, replay
from lit_entropy.utils import dist


@dataclass
class TokenStats:
    """One pass's fp32 per-token statistics, each [B, L] (the top-K log-probs [B, L, K]) and aligned like the
    pass's rows; None where the pass was not asked for it."""

    logp: Tensor
    entropy: Tensor | None = None
    """The entropy (of the sampler's truncated distribution when it truncates); with ``with_entropy``."""
    disc_s: Tensor | None = None
    """The discriminator score S (:func:`lit_entropy.diagnostics.discriminator.token_scores`); with ``with_scores``."""
    disc_n: Tensor | None = None
    """Its on-policy baseline N; with ``with_scores``."""
    full_entropy: Tensor | None = None
    """The untruncated softmax's entropy; with ``with_full_entropy``."""
    topk_logp: Tensor | None = None
    """[B, L, K] log-probs of the top-K candidates (with gradient in the update); with ``topk`` = K > 0."""
    is_top1: Tensor | None = None
    """[B, L] bool: the target is the top-1 candidate; with ``topk`` > 0."""

    def planes(self) -> dict[str, Tensor]:
        """The [B, L] tensors computed, by field name (the top-K log-probs as ``topk_logp.<k>``, one per k)."""
        out: dict[str, Tensor] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            if f.name == "topk_logp":
                out.update({f"topk_logp.{k}": t for k, t in enumerate(v.unbind(-1))})
            else:
                out[f.name] = v.float() if f.name == "is_top1" else v
        return out

    @classmethod
    def from_planes(cls, planes: Mapping[str, Tensor]) -> TokenStats:
        """The inverse of :meth:`planes`."""
        top = [planes[k] for k in sorted((k for k in planes if k.startswith("topk_logp.")),
                                         key=lambda k: int(k.split(".")[1]))]
        values = {k: v for k, v in planes.items() if not k.startswith("topk_logp.")}
        if "is_top1" in values:
            values["is_top1"] = values["is_top1"].bool()
        return cls(**values, topk_logp=torch.stack(top, dim=-1) if top else None)

    def map(self, fn: Callable[[Tensor], Tensor]) -> TokenStats:
        """``fn`` applied to each [B, L] plane (the top-K log-probs one k at a time)."""
        return TokenStats.from_planes({k: fn(v) for k, v in self.planes().items()})

    @property
    def topk(self) -> tuple[Tensor, Tensor] | None:
        """``(top-K log-probs [B, L, K], target is top-1 [B, L] bool)``, or None without them."""
        return (self.topk_logp, self.is_top1) if self.topk_logp is not None else None


@dataclass
class Forward:
    """The policy and how a pass turns its logits into per-token statistics."""

    model: torch.nn.Module
    micro_batch_size: int
    temperature: float = 1.0
    logit_chunk_size: int = 2048
    precision: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    """The trainer's precision context (autocast for bf16/fp16), entered by the passes without gradient."""
    device: torch.device | str = "cpu"
    top_p: float = 1.0
    """The sampler's nucleus; < 1 replays its truncation (:mod:`lit_entropy.policy.replay`)."""
    top_k: int | None = 0
    """The sampler's top-k; > 0 replays its truncation."""
    vocab_kernels: str = "auto"
    """How the vocabulary-wide statistics run: ``compiled``, ``eager`` or ``auto``
    (:mod:`lit_entropy.diagnostics.vocab_kernels`)."""
    micro_batch_tokens: int = 0
    """A token budget per micro-batch (``batch.micro_batch_tokens``): > 0 fills micro-batches with up to
    ``micro_batch_size`` rows by tokens (:func:`lit_entropy.utils.dist.cut`)."""

    def micro_batches(self, lengths: Tensor) -> Iterator[tuple[Tensor, bool, int | None]]:
        """This rank's micro-batches of rows of ``lengths`` (:func:`lit_entropy.utils.dist.micro_batches`)."""
        return dist.micro_batches(len(lengths), self.micro_batch_size, lengths, tokens=self.micro_batch_tokens)

    @property
    def replays(self) -> bool:
        """Whether the sampler truncates, so every pass scores the renormalised kept set."""
        return replay.active(self.top_p, self.top_k)

    def stats(self, shifted: Tensor, targets: Tensor, place: Callable[[Tensor], Tensor], with_entropy: bool = True,
              with_scores: bool = False, kept: Tensor | None = None, with_full_entropy: bool = False,
              topk: int = 0) -> TokenStats:
        """fp32 statistics of shifted logits, each ``place``d: log-probs, and those asked for (entropy, S and N,
        the untruncated entropy, the top-``topk`` candidates' log-probs and whether the target is the top-1).
        With top-p / top-k sampling all of them but ``full_entropy`` are those of the sampler's truncated
        distribution (``kept``: its kept-set size per target, 0 where unknown)."""
        chunk, full = self.logit_chunk_size, shifted
        if self.replays:
            shifted = replay.truncate_logits(shifted, targets, self.temperature, self.top_p, self.top_k, kept, chunk)
        if with_scores and not torch.is_grad_enabled():  # one softmax per chunk for all four (same log p and H)
            logp, ent, disc_s, disc_n = token_logprobs_entropy_and_scores(shifted, targets, self.temperature, chunk,
                                                                           self.vocab_kernels)
            out = TokenStats(logp, ent if with_entropy else None, disc_s, disc_n)
        else:
            logp, ent = token_logprobs_and_entropy(shifted, targets, temperature=self.temperature, chunk_size=chunk,
                                                   with_entropy=with_entropy, kernels=self.vocab_kernels)
            out = TokenStats(logp, ent)
            if with_scores:
                out.disc_s, out.disc_n = token_scores(shifted.detach(), targets, temperature=self.temperature,
                                                      chunk_size=chunk, kernels=self.vocab_kernels)
        if with_full_entropy:
            out.full_entropy = ent if full is shifted else token_logprobs_and_entropy(
                full.detach(), targets, temperature=self.temperature, chunk_size=chunk, kernels=self.vocab_kernels)[1]
        if topk > 0:
            out.topk_logp, out.is_top1 = topk_logprobs(shifted, targets, topk, temperature=self.temperature,
                                                       chunk_size=chunk)
        return out.map(place)

    def token_stats(self, model: torch.nn.Module, input_ids: Tensor, attention_mask: Tensor, with_entropy: bool = True,
                    with_scores: bool = False, kept: Tensor | None = None, with_full_entropy: bool = False,
                    topk: int = 0) -> TokenStats:
        """:meth:`stats` of whole rows, aligned with ``input_ids``: over the full
        vocabulary, or the sampler's kept set with top-p / top-k (``kept``: its size, aligned with ``input_ids``)."""
        # Right-padded rows need no attention mask: causal attention already keeps every real token from
        # seeing the padding after it, and without a mask the attention kernel runs its causal fast path
        # (a third less forward time on the lab). Outputs at padding positions are never used.
        right_padded = bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())
        mask = None if right_padded else attention_mask.long()
        logits = model(input_ids=input_ids, attention_mask=mask).logits
        shifted, targets = shift_for_causal_lm(logits, input_ids)
        kept = kept[:, 1:] if kept is not None else None
        return self.stats(shifted, targets, align_to_input, with_entropy, with_scores, kept, with_full_entropy, topk)

    def response_stats(self, model: torch.nn.Module, cache: prefix.PromptCache, layout: prefix.PromptLayout,
                       input_ids: Tensor, rows: Tensor, response_width: int, width: int, with_entropy: bool = True,
                       with_scores: bool = False, kept: Tensor | None = None, with_full_entropy: bool = False,
                       topk: int = 0) -> TokenStats:
        """:meth:`token_stats` of ``rows`` run on their prompts' ``cache``, [len(rows), width], zero off the response
        (``kept``: [B, L] aligned with ``input_ids``, as there)."""
        shifted, targets = prefix.response_logits(model, cache, input_ids, layout, rows, response_width)
        if kept is not None:
            kept = prefix.response_values(kept, layout, rows, response_width)
        return self.stats(shifted, targets, lambda v: prefix.to_rows(v, layout, rows, width), with_entropy,
                          with_scores, kept, with_full_entropy, topk)


@dataclass
class MicroBatch:
    """One micro-batch of the update, its statistics computed with gradient."""

    rows: Tensor
    """Indices of its rows in the minibatch."""
    padding: bool
    """A filler on a rank that has run out of micro-batches: its loss goes in with zero weight."""
    fields: dict[str, Tensor]
    """Its rows of every minibatch tensor, [B, L] ones cut to the micro-batch's width."""
    logp: Tensor
    """[m, width] fp32 log-probs of the current policy."""
    ent: Tensor
    """[m, width] fp32 entropy."""
    topk: tuple[Tensor, Tensor] | None = None
    """With ``micro_batches(topk=K)``: (top-K log-probs [m, width, K] with gradient, target is top-1 [m, width]
    bool)."""

    @property
    def width(self) -> int:
        return int(self.fields["input_ids"].shape[1])


class RowPasses(abc.ABC):
    """A minibatch's rows and the passes over them (:class:`WholeRows` or :class:`SharedPrompts`)."""

    def __init__(self, fwd: Forward, fields: Mapping[str, Tensor]) -> None:
        self.fwd = fwd
        self.fields = dict(fields)
        self.input_ids = fields["input_ids"]
        self.lengths = fields["attention_mask"].sum(-1)

    @abc.abstractmethod
    def micro_batches(self, topk: int = 0) -> Iterator[MicroBatch]:
        """This rank's micro-batches of the update, with gradient, in the trainer's context (with ``topk`` > 0,
        their top-K candidates too)."""

    @abc.abstractmethod
    def finish_backward(self, backward: Callable[[Tensor], None], loss_scale: float = 1.0) -> None:
        """Back-propagate what the micro-batches' backwards left over; ``loss_scale`` is the factor ``backward``
        multiplies by (fp16's loss scaler), 1 otherwise."""

    @abc.abstractmethod
    def _eval_micro_batches(self, model: torch.nn.Module, with_entropy: bool, with_scores: bool,
                            with_full_entropy: bool = False, topk: int = 0
                            ) -> Iterator[tuple[Tensor, bool, TokenStats]]:
        """``(rows, padding, stats)`` of this rank's micro-batches in eval mode, without gradient."""

    @torch.no_grad()
    def no_grad(self, model: torch.nn.Module | None = None, with_entropy: bool = True, with_scores: bool = False,
                with_full_entropy: bool = False, topk: int = 0) -> TokenStats:
        """:meth:`Forward.stats` (those asked for) of every row, by ``model`` (the policy by default) in eval mode:
        full-shape CPU tensors, zero beyond what was computed, the same on every rank."""
        model = model or self.fwd.model
        was_training = model.training
        model.eval()
        parts: list[tuple[Tensor, list[Tensor]]] = []
        names: list[str] = []
        for rows, padding, out in self._eval_micro_batches(model, with_entropy, with_scores, with_full_entropy, topk):
            planes = out.planes()
            names = list(planes)  # the same on every micro-batch and rank: the same flags
            if not padding:
                parts.append((rows.cpu(), [v.cpu() for v in planes.values()]))
        model.train(was_training)
        full = dist.gather_scattered_rows(parts, tuple(self.input_ids.shape))
        return TokenStats.from_planes(dict(zip(names, full, strict=True)))


class WholeRows(RowPasses):
    """Every row runs as one sequence."""

    def micro_batches(self, topk: int = 0) -> Iterator[MicroBatch]:
        for rows, padding, width in self.fwd.micro_batches(self.lengths):
            mb = dist.take_rows(self.fields, rows, width)
            out = self.fwd.token_stats(self.fwd.model, mb["input_ids"], mb["attention_mask"], with_entropy=True,
                                       kept=mb.get("sampler_kept"), topk=topk)
            yield MicroBatch(rows, padding, mb, out.logp, out.entropy, out.topk)

    def finish_backward(self, backward: Callable[[Tensor], None], loss_scale: float = 1.0) -> None:
        """Nothing: each micro-batch's backward went all the way."""

    def _eval_micro_batches(self, model, with_entropy, with_scores, with_full_entropy=False, topk=0):
        attention_mask, device = self.fields["attention_mask"], self.fwd.device
        kept = self.fields.get("sampler_kept")
        for rows, padding, width in self.fwd.micro_batches(self.lengths):
            with self.fwd.precision():  # the update's autocast: the first ratio is exactly 1
                out = self.fwd.token_stats(model, self.input_ids[rows, :width].to(device),
                                           attention_mask[rows, :width].to(device), with_entropy, with_scores,
                                           kept[rows, :width].to(device) if kept is not None else None,
                                           with_full_entropy, topk)
            yield rows, padding, out


class SharedPrompts(RowPasses):
    """Each distinct prompt runs once; the rows run their responses on its cache (:mod:`lit_entropy.policy.prefix`)."""

    def __init__(self, fwd: Forward, fields: Mapping[str, Tensor], layout: prefix.PromptLayout) -> None:
        super().__init__(fwd, fields)
        self.layout = layout
        self.prompt_width = int(layout.prompt_len.max())
        self._chunks: list[Tensor] = []
        self._prompts: prefix.PromptCache | None = None  # the update's prompt pass
        self._leaves: prefix.PromptCache | None = None  # its detached copy the micro-batches run on

    def prompt_chunks(self) -> list[Tensor]:
        """The update's prompt pass in chunks of at most one micro-batch's tokens (``micro_batch_size`` rows of
        the longest row's width), so its activations never exceed a micro-batch's. One chunk keeps its graph
        until :meth:`finish_backward`; several are encoded without gradient and recomputed one by one there."""
        step, width = self.fwd.micro_batch_size, int(self.lengths.max())
        per = max(1, step * width // max(1, self.prompt_width))
        return list(torch.arange(self.layout.num_prompts, device=self.fwd.device).split(per))

    def _encode(self, model: torch.nn.Module, input_ids: Tensor, layout: prefix.PromptLayout,
                prompts: Tensor) -> prefix.PromptCache:
        return prefix.encode_prompts(model, input_ids, layout, prompts, self.prompt_width)

    def micro_batches(self, topk: int = 0) -> Iterator[MicroBatch]:
        ids, layout = self.input_ids, self.layout
        self._chunks = self.prompt_chunks()
        with torch.set_grad_enabled(len(self._chunks) == 1):  # several chunks: recomputed with gradient later
            self._prompts = prefix.concat_caches([self._encode(self.fwd.model, ids, layout, c) for c in self._chunks])
        self._leaves = cache = self._prompts.detached()
        for rows, padding, width in self.fwd.micro_batches(layout.response_len):
            rows = rows.to(self.fwd.device)
            full = int(self.lengths[rows].max())
            mb = dist.take_rows(self.fields, rows, full)
            out = self.fwd.response_stats(self.fwd.model, cache, layout, ids, rows, width, full,
                                          kept=self.fields.get("sampler_kept"), topk=topk)
            yield MicroBatch(rows, padding, mb, out.logp, out.entropy, out.topk)

    def finish_backward(self, backward: Callable[[Tensor], None], loss_scale: float = 1.0) -> None:
        """The prompt pass's share of the gradient: one backward through the prompt pass (chunk by chunk,
        recomputed with gradient, when it was encoded in several)."""
        start = 0
        for c in self._chunks:
            part = self._prompts if len(self._chunks) == 1 else self._encode(self.fwd.model, self.input_ids,
                                                                             self.layout, c)
            surrogate = part.surrogate(self._leaves, loss_scale, rows=slice(start, start + len(c)))
            start += len(c)
            if surrogate.requires_grad:
                backward(surrogate)

    def _eval_micro_batches(self, model, with_entropy, with_scores, with_full_entropy=False, topk=0):
        device, step = self.fwd.device, self.fwd.micro_batch_size
        ids = self.input_ids.to(device)
        kept = self.fields.get("sampler_kept")
        kept = kept.to(device) if kept is not None else None
        layout = prefix.PromptLayout(*(t.to(device) for t in vars(self.layout).values()))
        total = layout.prompt_len + layout.response_len
        prompts = torch.arange(layout.num_prompts, device=device)
        with self.fwd.precision():
            cache = prefix.concat_caches([self._encode(model, ids, layout, c) for c in prompts.split(step)])
        for rows, padding, width in self.fwd.micro_batches(layout.response_len):
            with self.fwd.precision():  # the update's autocast: the first ratio is exactly 1
                rows = rows.to(device)
                out = self.fwd.response_stats(model, cache, layout, ids, rows, width, int(total[rows].max()),
                                              with_entropy, with_scores, kept, with_full_entropy, topk)
            yield rows, padding, out


def for_rows(fwd: Forward, fields: Mapping[str, Tensor], share_prompts: bool = True) -> RowPasses:
    """The passes over ``fields``' rows: on their shared prompts when ``share_prompts`` is on, the model takes a
    cache, the rows' layout allows it and saves work (two rows or more per prompt) and no layer's attention
    window is shorter than the batch's longest row (sliding-window models: the cached prompt would otherwise be
    seen whole where a row alone sees only its window); whole rows otherwise."""
    if share_prompts and fields.get("response_mask") is not None and prefix.supports_prompt_cache(fwd.model):
        layout = prefix.prompt_layout(fields["input_ids"], fields["attention_mask"], fields["response_mask"],
                                      fields.get("group_index"))
        if (layout is not None and layout.worthwhile()
                and model_support.allow_shared_prompts(fwd.model, model_support.longest_row(layout))):
            return SharedPrompts(fwd, fields, layout)
    return WholeRows(fwd, fields)
