"""Rollout filters (lit_entropy/rollout/filters.py): which completions each flags, the loss mask they clear and the
``rollout/filtered_*`` counts they always report, and their config keys."""

from __future__ import annotations

import math

import pytest
import torch
from hydra.utils import instantiate

from lit_entropy.iteration import prepare_update
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from lit_entropy.rollout.filters import (
    GibberishFilter,
    RepetitionFilter,
    apply_filters,
    gibberish_rows,
    repetition_rows,
)
from tests.helpers import compose_train

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]


def rows_of(responses: list[list[int]], prompt_len: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, L] ids (prompt token 1, then the response) and the response mask."""
    width = prompt_len + max(len(r) for r in responses)
    ids = torch.zeros(len(responses), width, dtype=torch.long)
    mask = torch.zeros(len(responses), width, dtype=torch.bool)
    for i, r in enumerate(responses):
        ids[i, :prompt_len] = 1
        ids[i, prompt_len:prompt_len + len(r)] = torch.tensor(r)
        mask[i, prompt_len:prompt_len + len(r)] = True
    return ids, mask


def test_repetition_by_hand():
    loop = [5, 6, 7] * 6  # 18 tokens, 16 trigrams, 3 unique: 13/16 repeated
    varied = list(range(10, 28))
    half = list(range(10, 19)) + [10, 11, 12, 13, 14, 15, 16, 17, 18]  # 16 trigrams, 9 unique (7/16 repeated)
    short = [5, 5]
    ids, mask = rows_of([loop, varied, half, short])
    assert repetition_rows(ids, mask, ngram=3, max_frac=0.5).tolist() == [True, False, False, False]
    assert repetition_rows(ids, mask, ngram=3, max_frac=7 / 16).tolist() == [True, False, True, False]


def test_gibberish_by_hand():
    vocab = 100  # threshold −log(100) − 2 = −6.605
    ids, mask = rows_of([[10, 11, 12], [10, 11, 12], [3, 11, 12]])
    logp = torch.full(ids.shape, -1.0)
    logp[1, 3] = -7.0  # below the threshold: flagged
    logp[2, 2] = -9.0  # below, but token id 3 <= token_id_threshold 5: not flagged
    logp[:, :2] = -50.0  # prompt positions never count
    assert gibberish_rows(ids, logp, mask, vocab, 2.0, token_id_threshold=5).tolist() == [False, True, False]
    assert gibberish_rows(ids, logp, mask, vocab, 2.0).tolist() == [False, True, True]
    assert gibberish_rows(ids, logp, mask, vocab, 2.0, min_tokens=2).tolist() == [False, False, False]
    assert -math.log(vocab) - 2.0 > -7.0


def batch_of(ids: torch.Tensor, mask: torch.Tensor, logp: torch.Tensor) -> RolloutBatch:
    b = ids.shape[0]
    return RolloutBatch(input_ids=ids, attention_mask=ids > 0, response_mask=mask, rewards=torch.zeros(b),
                        group_index=torch.arange(b) // 2, group_size=2, sampler_logp=logp)


class _Model:
    class config:  # noqa: N801 - a model's config attribute
        vocab_size = 100


def test_apply_filters_clears_the_flagged_rows_and_reports_every_count():
    ids, mask = rows_of([[5, 6] * 6, list(range(10, 22)), list(range(30, 42)), list(range(50, 62))])
    logp = torch.where(mask, -1.0, 0.0)
    logp[2, 5] = -8.0
    batch = batch_of(ids, mask, logp)
    batch.loss_mask = mask.clone()
    batch.loss_mask[3, 2] = False  # a token an earlier rule removed stays removed
    cfg = BatchConfig(group_size=2, filter_repetition={"ngram": 4, "max_frac": 0.5},
                      filter_gibberish={"logprob_offset": 2.0})
    metrics = apply_filters(batch, cfg, _Model())
    assert metrics == {"rollout/filtered_repetition": 1.0, "rollout/filtered_gibberish": 1.0,
                       "rollout/filtered_total": 2.0}
    assert batch.loss_mask.any(dim=1).tolist() == [False, True, False, True]
    assert batch.loss_mask[3].sum() == mask[3].sum() - 1


def test_filters_report_zeros_and_are_silent_only_when_off():
    ids, mask = rows_of([list(range(10, 22))] * 2)
    batch = batch_of(ids, mask, torch.where(mask, -1.0, 0.0))
    assert apply_filters(batch, BatchConfig(group_size=2), _Model()) == {} and batch.loss_mask is None
    metrics = apply_filters(batch, BatchConfig(group_size=2, filter_repetition={}), _Model())
    assert metrics == {"rollout/filtered_repetition": 0.0, "rollout/filtered_total": 0.0}
    assert torch.equal(batch.loss_mask, mask)


def test_config_keys_parse_and_refuse_by_name():
    cfg = instantiate(compose_train(["batch.filter_repetition={ngram:4,max_frac:0.6}",
                                     "batch.filter_gibberish={logprob_offset:3.0}", *OUT]).batch)
    assert cfg.filter_repetition == RepetitionFilter(ngram=4, max_frac=0.6)
    assert cfg.filter_gibberish == GibberishFilter(logprob_offset=3.0)
    default = instantiate(compose_train(OUT).batch)
    assert default.filter_repetition is None and default.filter_gibberish is None
    with pytest.raises(ValueError, match=r"batch.filter_repetition \['window'\]: unknown"):
        BatchConfig(filter_repetition={"window": 3})
    with pytest.raises(ValueError, match="batch.filter_repetition.max_frac"):
        BatchConfig(filter_repetition={"max_frac": 0})
    with pytest.raises(ValueError, match="batch.filter_gibberish.min_tokens"):
        BatchConfig(filter_gibberish={"min_tokens": 0})


def test_the_module_filters_in_its_pre_update_pass_and_the_update_skips_the_rows():
    from lit_entropy.objectives.rollout_correction import CorrectionConfig
    from tests.unit.test_iteration_correction import make_module, make_rollout, preset, take_steps

    module = make_module(preset("algo", "grpo"), CorrectionConfig(), filter_repetition={"ngram": 1, "max_frac": 0.2})
    batch = make_rollout(module)
    prepare_update(module, batch)
    resp = batch.response_mask
    repeats = [1.0 - len(set(r[m].tolist())) / int(m.sum()) >= 0.2 for r, m in zip(batch.input_ids, resp, strict=True)]
    flagged = ~batch.loss_mask.any(dim=1)
    assert flagged.tolist() == repeats
    assert batch.metrics["rollout/filtered_repetition"] == batch.metrics["rollout/filtered_total"] == sum(repeats)
    assert all(math.isfinite(v) for v in take_steps(module, batch))
