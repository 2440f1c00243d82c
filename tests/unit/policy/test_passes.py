"""lit_entropy.policy.passes: which implementation runs a minibatch's rows, and the micro-batches it hands out."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.policy import passes
from tests.unit.policy.test_prefix import G, L, P, grouped_rows, make_module


def rows_and_module(share: bool = True, micro_batch_size: int = 7):
    module = make_module(share, micro_batch_size=micro_batch_size)
    return module, grouped_rows(module.tokenizer.vocab_size, module.tokenizer.pad_id)


@pytest.mark.parametrize("case", ["shared", "share_off", "one_row_per_prompt", "no_response_mask", "no_cache"])
def test_for_rows_shares_prompts_only_where_it_works_and_saves(case):
    module, rows = rows_and_module(share=case != "share_off")
    if case == "one_row_per_prompt":
        rows["group_index"] = torch.arange(G * P)
    elif case == "no_response_mask":
        del rows["response_mask"]
    elif case == "no_cache":  # a forward that takes no past_key_values
        module.model.forward = lambda input_ids, attention_mask=None, **kw: None
    chosen = module.row_passes(rows)
    assert isinstance(chosen, passes.SharedPrompts if case == "shared" else passes.WholeRows)


@pytest.mark.parametrize("share", [True, False])
def test_update_micro_batches_cover_every_row_longest_first_cut_to_their_longest_row(share):
    module, rows = rows_and_module(share, micro_batch_size=3)
    plan = module.row_passes(rows)
    lengths = rows["attention_mask"].sum(-1)
    order_by = rows["response_mask"].sum(-1) if share else lengths
    seen = []
    for mb in plan.micro_batches():
        assert not mb.padding and len(mb.rows) <= 3
        assert mb.width == int(lengths[mb.rows].max())
        assert mb.logp.shape == mb.ent.shape == (len(mb.rows), mb.width) and mb.logp.requires_grad
        assert torch.equal(mb.fields["input_ids"], rows["input_ids"][mb.rows, :mb.width])
        seen += mb.rows.tolist()
    assert sorted(seen) == list(range(G * P))
    assert torch.equal(order_by[seen], order_by.sort(descending=True, stable=True).values)


def test_whole_rows_finish_nothing_and_passes_without_gradient_restore_train_mode():
    module, rows = rows_and_module(share=False)
    plan = module.row_passes(rows)
    calls = []
    plan.finish_backward(calls.append, 1.0)
    assert calls == []
    module.model.train()
    out = plan.no_grad()
    logp, ent = out.logp, out.entropy
    assert module.model.training and not logp.requires_grad
    assert out.disc_s is out.disc_n is out.full_entropy is out.topk_logp is out.is_top1 is None
    assert logp.shape == ent.shape == (G * P, L)


def test_shared_prompts_finish_backward_runs_the_prompt_pass_backward_once_per_chunk():
    module, rows = rows_and_module(share=True, micro_batch_size=1)
    plan = module.row_passes(rows)
    chunks = plan.prompt_chunks()
    assert len(chunks) > 1
    for mb in plan.micro_batches():
        mb.logp.sum().backward()
    surrogates = []
    plan.finish_backward(lambda s: surrogates.append(s) or s.backward(), 1.0)
    assert len(surrogates) == len(chunks)
