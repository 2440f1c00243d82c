"""The trainer's two forward paths, built from :mod:`lit_entropy.policy.prefix` and the entropy kernel, and the
reference they must equal: each row run alone, without padding.

Rows may come on the CPU; every function runs them on the model's device (``LIT_ENTROPY_TEST_DEVICE``,
tests/models/families.py) and returns tensors there."""

from __future__ import annotations

import torch

from lit_entropy.diagnostics.entropy import align_to_input, shift_for_causal_lm, token_logprobs_and_entropy
from lit_entropy.policy import prefix

TEMPERATURE = 0.9


def _stats(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logp, ent = token_logprobs_and_entropy(logits.float(), targets, temperature=TEMPERATURE, chunk_size=64)
    return logp, ent


def device_of(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def on_model(model: torch.nn.Module, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``rows``' tensors on the model's device."""
    device = device_of(model)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in rows.items()}


def unpadded(model: torch.nn.Module, rows: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs and entropy [B, L] (input-aligned) of each row run alone on its real tokens."""
    rows = on_model(model, rows)
    ids, attn = rows["input_ids"], rows["attention_mask"]
    logp, ent = torch.zeros(ids.shape, device=ids.device), torch.zeros(ids.shape, device=ids.device)
    for i in range(ids.shape[0]):
        n = int(attn[i].sum())
        row = ids[i:i + 1, :n]
        shifted, targets = shift_for_causal_lm(model(input_ids=row).logits, row)
        lp, en = _stats(shifted, targets)
        logp[i, 1:n], ent[i, 1:n] = lp[0], en[0]
    return logp, ent


def whole_rows(model: torch.nn.Module, rows: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole-row pass: right-padded rows in one forward, no attention mask (what the trainer runs)."""
    ids = on_model(model, rows)["input_ids"]
    shifted, targets = shift_for_causal_lm(model(input_ids=ids).logits, ids)
    logp, ent = _stats(shifted, targets)
    return align_to_input(logp), align_to_input(ent)


def layout_of(rows: dict[str, torch.Tensor]) -> prefix.PromptLayout:
    layout = prefix.prompt_layout(rows["input_ids"], rows["attention_mask"], rows["response_mask"],
                                  rows["group_index"])
    assert layout is not None
    return layout


def shared_prompts(model: torch.nn.Module, rows: dict[str, torch.Tensor],
                   layout: prefix.PromptLayout | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The shared-prompt pass: each prompt encoded once, every response run on its prompt's cache."""
    rows = on_model(model, rows)
    ids = rows["input_ids"]
    layout = prefix.PromptLayout(*(t.to(ids.device) for t in vars(layout or layout_of(rows)).values()))
    cache = prefix.encode_prompts(model, ids, layout, torch.arange(layout.num_prompts, device=ids.device))
    every = torch.arange(ids.shape[0], device=ids.device)
    shifted, targets = prefix.response_logits(model, cache, ids, layout, every, int(layout.response_len.max()))
    logp, ent = _stats(shifted, targets)
    width = ids.shape[1]
    return prefix.to_rows(logp, layout, every, width), prefix.to_rows(ent, layout, every, width)


def policy_loss(logp: torch.Tensor, rows: dict[str, torch.Tensor]) -> torch.Tensor:
    """A fixed-advantage policy-gradient surrogate over the response tokens."""
    adv = torch.linspace(-1.0, 1.0, logp.shape[0], device=logp.device)[:, None]
    mask = rows["response_mask"].to(logp.device)
    return -(adv * logp * mask).sum() / mask.sum()


def gradient(model: torch.nn.Module, loss: torch.Tensor) -> torch.Tensor:
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params, allow_unused=True)
    return torch.cat([(g if g is not None else torch.zeros_like(p)).flatten() for g, p in zip(grads, params, strict=True)])


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float((a.detach() - b.detach().to(a.device)).abs()[mask.to(a.device)].max())


def sampler_mismatch(model: torch.nn.Module, prompts: list[list[int]], gens: list[list]) -> float:
    """Largest |sampler − trainer| log-prob over an engine's ``gens`` (the trainer runs each row alone)."""
    worst = 0.0
    with torch.no_grad():
        for prompt, group in zip(prompts, gens, strict=True):
            for gen in group:
                row = torch.tensor([prompt + gen.token_ids])
                ours = unpadded(model, {"input_ids": row, "attention_mask": torch.ones_like(row)})[0].cpu()
                worst = max(worst, float((ours[0, len(prompt):] - torch.tensor(gen.logprobs)).abs().max()))
    return worst


def package_passes(model: torch.nn.Module, rows: dict[str, torch.Tensor], share_prompts: bool, kernels: str,
                   tokens: int, micro_batch_size: int = 4) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The package's own passes (:mod:`lit_entropy.policy.passes`) with vocabulary ``kernels`` and a token budget: the
    pass without gradient's log-probs and entropy [B, L], and the gradient of :func:`policy_loss` accumulated over
    the update's micro-batches (with the shared-prompt pass's backward)."""
    from lit_entropy.policy import passes

    rows = on_model(model, rows)
    fwd = passes.Forward(model, micro_batch_size, TEMPERATURE, logit_chunk_size=64, device=device_of(model),
                         vocab_kernels=kernels, micro_batch_tokens=tokens)
    stats = passes.for_rows(fwd, rows, share_prompts).no_grad(with_entropy=True)
    adv = torch.linspace(-1.0, 1.0, rows["input_ids"].shape[0], device=device_of(model))[:, None]
    total = rows["response_mask"].sum()
    params = [p for p in model.parameters() if p.requires_grad]
    model.zero_grad(set_to_none=True)
    rp = passes.for_rows(fwd, rows, share_prompts)
    for mb in rp.micro_batches():
        mask = mb.fields["response_mask"]
        (-(adv[mb.rows.to(adv.device)] * mb.logp * mask).sum() / total).backward()
    rp.finish_backward(lambda loss: loss.backward())
    grad = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    model.zero_grad(set_to_none=True)
    return stats.logp.to(grad.device), stats.entropy.to(grad.device), grad
