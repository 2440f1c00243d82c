"""Shared-prompt passes (lit_entropy.policy.prefix) give the whole-row passes' values and gradients."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.module import PolicyModule
from lit_entropy.policy import passes, prefix
from lit_entropy.policy.models import PolicyBundle, TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.batch import BatchConfig
from lit_entropy.rollout.hf_engine import HFEngine
from tests.helpers import step_gradient

G, P, L = 4, 5, 16  # completions per prompt, prompts, columns


def make_module(share: bool, micro_batch_size: int = 7, **algo) -> PolicyModule:
    tok = CharTokenizer.for_countdown()
    arch = TinyArch(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=64)
    model = build_tiny_qwen2(tok.vocab_size, arch, tok, seed=3)
    return PolicyModule(PolicyBundle(model, tok, ""), algo=AlgoConfig(**algo),
                        batch=BatchConfig(micro_batch_size=micro_batch_size),
                        share_prompts=share)


def grouped_rows(vocab: int, pad: int, seed: int = 0, prompts: int = P, group: int = G, width: int = L,
                 longer: int = 0) -> dict[str, torch.Tensor]:
    """``prompts`` prompts of 2–6 (+ ``longer``) tokens, ``group`` right-padded completions each of 1–8 tokens."""
    g = torch.Generator().manual_seed(seed)
    B = group * prompts
    ids = torch.full((B, width), pad)
    attn = torch.zeros(B, width, dtype=torch.bool)
    resp = torch.zeros(B, width, dtype=torch.bool)
    for k in range(prompts):
        p = 2 + k % 5 + longer
        prompt = torch.randint(4, vocab, (p,), generator=g)
        for j in range(group):
            i = k * group + j
            n = int(torch.randint(1, 9, (1,), generator=g))
            ids[i, :p] = prompt
            ids[i, p:p + n] = torch.randint(4, vocab, (n,), generator=g)
            attn[i, :p + n] = True
            resp[i, p:p + n] = True
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp,
            "group_index": torch.arange(prompts).repeat_interleave(group)}


def test_layout_of_grouped_rows():
    rows = grouped_rows(20, 0)
    lay = prefix.prompt_layout(rows["input_ids"], rows["attention_mask"], rows["response_mask"], rows["group_index"])
    assert lay is not None and lay.num_prompts == P and lay.worthwhile()
    assert torch.equal(lay.prompt_len, torch.tensor([2 + k % 5 for k in range(P)]).repeat_interleave(G))
    assert torch.equal(lay.response_len, rows["response_mask"].sum(-1))
    assert torch.equal(lay.prompt_rows, torch.arange(0, G * P, G))
    assert torch.equal(lay.prompt_id, rows["group_index"])


@pytest.mark.parametrize("damage", ["prompt_differs", "gap_in_response", "empty_response", "left_padded", "no_groups"])
def test_layout_refuses_rows_it_cannot_share(damage):
    rows = grouped_rows(20, 0)
    ids, attn, resp, group = rows["input_ids"], rows["attention_mask"], rows["response_mask"], rows["group_index"]
    if damage == "prompt_differs":
        ids[1, 0] = ids[0, 0] + 1
    elif damage == "gap_in_response":  # row 0: prompt of 2, then response, prompt-like token, response
        resp[0], attn[0] = False, False
        resp[0, [2, 4]] = True
        attn[0, :5] = True
    elif damage == "empty_response":
        resp[0] = False
        attn[0, 2:] = False
    elif damage == "left_padded":
        ids, attn, resp = ids.roll(1, 1), attn.roll(1, 1), resp.roll(1, 1)
    else:
        group = None
    assert prefix.prompt_layout(ids, attn, resp, group) is None


def test_to_rows_places_values_on_the_response_only():
    rows = grouped_rows(20, 0)
    lay = prefix.prompt_layout(rows["input_ids"], rows["attention_mask"], rows["response_mask"], rows["group_index"])
    idx = torch.arange(G * P)
    vals = torch.arange(1.0, 1 + G * P * 8).view(G * P, 8)
    out = prefix.to_rows(vals, lay, idx, L)
    assert torch.equal(out != 0, rows["response_mask"])
    first = out[idx, lay.prompt_len]
    assert torch.equal(first, vals[:, 0])


@pytest.mark.parametrize("topk", [0, 3])
def test_no_grad_pass_matches_whole_rows(topk):
    shared, whole = make_module(True), make_module(False)
    rows = grouped_rows(shared.tokenizer.vocab_size, shared.tokenizer.pad_id)
    on_prompts, whole_rows = shared.row_passes(rows), whole.row_passes(rows)
    assert isinstance(on_prompts, passes.SharedPrompts) and isinstance(whole_rows, passes.WholeRows)
    a = on_prompts.no_grad(with_entropy=True, with_scores=True, topk=topk).planes()
    b = whole_rows.no_grad(with_entropy=True, with_scores=True, topk=topk).planes()
    assert list(a) == list(b) and len(a) == 4 + (topk + 1 if topk else 0)
    resp = rows["response_mask"]
    for x, y in zip(a.values(), b.values(), strict=True):
        assert torch.allclose(x[resp], y[resp], atol=1e-5), (x[resp] - y[resp]).abs().max()
        assert (x[~resp] == 0).all()


def one_step_gradient(module: PolicyModule, rows: dict[str, torch.Tensor]) -> tuple[float, list[torch.Tensor]]:
    """Loss and gradients of the module's real ``training_step`` on ``rows`` with made-up old log-probs."""
    g = torch.Generator().manual_seed(1)
    B = rows["input_ids"].shape[0]
    with torch.no_grad():
        logp, ent = module.token_stats(rows["input_ids"], rows["attention_mask"])
    resp = rows["response_mask"]
    adv = torch.randn(B, generator=g)
    mb = {**rows, "old_logp": torch.where(resp, logp + 0.05 * torch.randn(logp.shape, generator=g), 0.0),
          "entropy": ent, "token_advantages": adv[:, None].expand_as(logp).clone(), "advantages": adv}
    return step_gradient(module, mb)


@pytest.mark.parametrize("algo", [{}, {"entropy_coef": 0.01}, {"loss_agg": "seq-mean-token-mean"},
                                  {"simko": {"k": 3, "alpha": 0.5, "quantile": 0.5}}])
def test_update_gradient_matches_whole_rows(algo):
    rows = grouped_rows(20, 0)
    ref_loss, ref = one_step_gradient(make_module(False, **algo), rows)
    for size in (1, 3, 7, G * P):
        module = make_module(True, micro_batch_size=size, **algo)
        chunks = module.row_passes(rows).prompt_chunks()
        assert (len(chunks) > 1) == (size == 1)  # size 1: prompts recomputed with gradient chunk by chunk
        loss, grads = one_step_gradient(module, rows)
        assert loss == pytest.approx(ref_loss, abs=1e-5)
        assert len(grads) == len(ref)
        for a, b in zip(grads, ref, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()


def test_update_gradient_is_reproducible_at_the_default_micro_batch_size():
    """A default-size micro-batch (128 shuffled rows, a prompt's completions spread over it) gives the same
    gradient bits every time. The completions' gradients reach their shared cache rows through a gather
    whose CPU backward, as ``t[index]``, summed them with atomic adds from racing threads once the gathered
    keys hold 32,768 elements or more (smaller micro-batches sum serially): two fresh runs then differed
    in the last bits from the first optimizer step on."""
    rows = grouped_rows(20, 0, prompts=32, group=8, width=24, longer=8)
    perm = torch.randperm(32 * 8, generator=torch.Generator().manual_seed(0))
    rows = {k: v[perm] for k, v in rows.items()}
    threads = torch.get_num_threads()
    torch.set_num_threads(max(2, threads))  # the race needs at least two intra-op threads
    try:
        runs = [one_step_gradient(make_module(True, micro_batch_size=128), rows) for _ in range(5)]
    finally:
        torch.set_num_threads(threads)
    module = make_module(True)
    layout = module.row_passes(rows).layout
    config = module.model.config
    gathered = 128 * config.num_key_value_heads * int(layout.prompt_len.max()) * config.head_dim
    assert gathered >= 32768  # the size at which the old gather's backward went parallel
    for loss, grads in runs[1:]:
        assert loss == runs[0][0]
        assert all(torch.equal(a, b) for a, b in zip(grads, runs[0][1], strict=True))


def test_surrogate_divides_out_a_loss_scale():
    module = make_module(True)
    rows = grouped_rows(module.tokenizer.vocab_size, module.tokenizer.pad_id)
    layout = module.row_passes(rows).layout
    cache = prefix.encode_prompts(module.model, rows["input_ids"], layout, torch.arange(layout.num_prompts))
    leaves = cache.detached()
    (leaves.last_logits.sum() * 8.0 + leaves.keys[0].sum() * 8.0).backward()
    a = cache.surrogate(leaves, scale=8.0)
    b = (cache.last_logits.sum() + cache.keys[0].sum()).float()
    assert torch.allclose(a, b, rtol=1e-6)


def test_hf_engine_shared_prefill_samples_what_full_prefill_samples():
    module = make_module(True)
    tok = module.tokenizer
    prompts = [[tok.bos_id, *range(4, 4 + n)] for n in (1, 3, 6, 2)]
    sampling = SamplingConfig(temperature=1.0, top_p=1.0, max_new_tokens=6)
    out = {}
    for share in (False, True):
        engine = HFEngine("", eos_id=tok.eos_id, pad_id=tok.pad_id, prompts_per_chunk=4, share_prefill=share)
        engine.sync_weights(module.model)
        out[share] = engine.generate(prompts, 5, sampling, seed=11)
    for ga, gb in zip(out[False], out[True], strict=True):
        for x, y in zip(ga, gb, strict=True):
            assert x.token_ids == y.token_ids and x.truncated == y.truncated
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)) < 1e-5
