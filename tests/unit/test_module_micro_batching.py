"""Length-sorted, trimmed micro-batches give the results of one untrimmed batch (up to summation order)."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.module import PolicyModule
from lit_entropy.policy.models import PolicyBundle, TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.rollout.batch import BatchConfig
from tests.helpers import step_gradient

B, L = 10, 14


def make_module(micro_batch_size: int, **algo) -> PolicyModule:
    tok = CharTokenizer.for_countdown()
    arch = TinyArch(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=64)
    model = build_tiny_qwen2(tok.vocab_size, arch, tok, seed=3)
    return PolicyModule(PolicyBundle(model, tok, ""), algo=AlgoConfig(**algo),
                        batch=BatchConfig(micro_batch_size=micro_batch_size))


def make_minibatch(module: PolicyModule, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of different lengths: prompt 3–5 tokens, response 1 to L - prompt tokens."""
    g = torch.Generator().manual_seed(seed)
    V = module.tokenizer.vocab_size
    ids = torch.full((B, L), module.tokenizer.pad_id)
    attn = torch.zeros(B, L, dtype=torch.bool)
    resp = torch.zeros(B, L, dtype=torch.bool)
    for i in range(B):
        p = 3 + i % 3
        n = int(torch.randint(p + 1, L + 1, (1,), generator=g))
        ids[i, :n] = torch.randint(4, V, (n,), generator=g)
        attn[i, :n] = True
        resp[i, p:n] = True
    with torch.no_grad():
        logp, ent = module.token_stats(ids, attn)
    adv = torch.randn(B, generator=g)
    return {
        "input_ids": ids, "attention_mask": attn, "response_mask": resp,
        "old_logp": torch.where(resp, logp + 0.05 * torch.randn(B, L, generator=g), 0.0),
        "entropy": ent, "token_advantages": adv[:, None].expand(B, L).clone(), "advantages": adv,
    }


def test_no_grad_pass_matches_one_full_batch_on_every_used_position():
    module = make_module(micro_batch_size=3)
    mb = make_minibatch(module)
    with torch.no_grad():
        full_logp, full_ent = module.token_stats(mb["input_ids"], mb["attention_mask"])
    out = module.row_passes(mb).no_grad(with_entropy=True)
    logp, ent = out.logp, out.entropy
    used = mb["attention_mask"]
    assert torch.allclose(logp[used], full_logp[used], atol=1e-6)
    assert torch.allclose(ent[used], full_ent[used], atol=1e-6)
    assert logp.shape == ent.shape == (B, L)


def gradient_of_one_step(micro_batch_size: int, **algo) -> tuple[float, list[torch.Tensor]]:
    """Run the module's real ``training_step`` with the optimizer step replaced by a gradient capture."""
    module = make_module(micro_batch_size, **algo)
    return step_gradient(module, make_minibatch(module))


@pytest.mark.parametrize("algo", [{}, {"loss_agg": "seq-mean-token-mean"}, {"entropy_coef": 0.01}])
def test_update_with_sorted_trimmed_micro_batches_matches_one_micro_batch(algo):
    ref_loss, ref = gradient_of_one_step(B, **algo)
    for size in (1, 3, 4):
        loss, grads = gradient_of_one_step(size, **algo)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        assert len(grads) == len(ref)
        for a, b in zip(grads, ref, strict=True):
            assert torch.allclose(a, b, atol=1e-6)


def test_micro_batches_run_longest_first_and_are_cut_to_their_longest_row():
    module = make_module(micro_batch_size=3)
    mb = make_minibatch(module)
    shapes: list[tuple[int, int]] = []
    forward = module.model.forward
    module.model.forward = lambda input_ids, **kw: shapes.append(tuple(input_ids.shape)) or forward(input_ids, **kw)
    module.row_passes(mb).no_grad(with_entropy=True)
    lengths = sorted(mb["attention_mask"].sum(-1).tolist(), reverse=True)
    assert shapes == [(3, lengths[0]), (3, lengths[3]), (3, lengths[6]), (1, lengths[9])]


def test_right_padded_rows_skip_the_attention_mask_with_the_same_results():
    module = make_module(micro_batch_size=B)
    mb = make_minibatch(module)
    ids, attn = mb["input_ids"], mb["attention_mask"]
    with torch.no_grad():
        logits = module.model(input_ids=ids, attention_mask=attn.long()).logits  # the masked reference
        ref = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        logp, _ = module.token_stats(ids, attn)
    used = attn[:, 1:]
    assert torch.allclose(logp[:, 1:][used], ref[used], atol=1e-5)
    left_padded = torch.flip(attn, dims=[1])  # not right-padded: the mask must be passed on
    calls = []
    forward = module.model.forward
    module.model.forward = lambda **kw: calls.append(kw["attention_mask"]) or forward(**kw)
    module.token_stats(ids, attn)
    module.token_stats(ids, left_padded)
    assert calls[0] is None and calls[1] is not None
