"""AEPOCallback (lit_entropy/callbacks/aepo.py): the switch, the counts held to a transcription of the authors' code,
the eligible rows, the draw the iteration serves for it and the replacement of the batch's rows (with a policy whose
pre-update pass is a closed form), its config errors. The real draw and update on the lab:
tests/integration/test_controllers.py; its exact resume: tests/integration/test_controller_resume.py."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks import aepo
from lit_entropy.callbacks.aepo import (
    REINFORCE_ROWS,
    AEPOCallback,
    aepo_prompts,
    aepo_rows,
    aepo_temperature,
    eligible_rows,
)
from lit_entropy.iteration import DrawRequest, draw, draw_refusals
from tests.unit.rollout.test_batch import two_batches

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy" / "aepo.yaml"


def test_the_switch():
    assert aepo_temperature(0.4, 0.5, 1.2, 0.8) == 1.2
    assert aepo_temperature(0.5, 0.5, 1.2, 0.8) == 1.2  # at the target: the high temperature (the code's <=)
    assert aepo_temperature(0.6, 0.5, 1.2, 0.8) == 0.8


# The authors' rule, transcribed as plain Python from github.com/597358816/AEPO at b353a05,
# verl/trainer/ray_trainer.py (the `alg == "AEPO"` branch of fit()):
#   791  gen_batch_bak = gen_batch_bak[:len(gen_batch_bak) // 4]
#   802  entropy_controller = _select_by_advantage(batch_bak, threshold = 0.05, absolute=False)
#   804  if entropy <= entropy_base:
#   805      sample_num = min(self.config.trainer.reinforce_sample_num, len(entropy_controller))
#   806  elif entropy > entropy_base:
#   807      sample_num = min(self.config.trainer.reinforce_sample_num, len(entropy_controller)) // 2
#   808  entropy_batch = DataProto.concat([entropy_controller[:sample_num], batch[sample_num:]])
def authors_prompts(prompts):
    return prompts // 4  # line 791: len(gen_batch_bak) is the iteration's number of prompts


def authors_sample_num(entropy, entropy_base, reinforce_sample_num, selected):
    if entropy <= entropy_base:
        return min(reinforce_sample_num, selected)
    elif entropy > entropy_base:
        return min(reinforce_sample_num, selected) // 2


def test_the_rows_count_is_the_authors_60_rows_3_eligible():
    assert authors_sample_num(0.6, 0.5, 60, 3) == 1  # the cap, then the halving: not min(3, 60 // 2) = 3
    assert aepo_rows(3, 60, above=True) == 1
    assert aepo_rows(3, 60, above=False) == 3
    assert aepo_rows(1, 60, above=True) == 0  # a single eligible sample above the target: no row (the code's 1 // 2)
    assert aepo_rows(100, 60, above=True) == 30


def test_the_rows_count_matches_the_authors_rule_over_random_cases():
    rng = random.Random(0)
    for _ in range(5000):
        rows, eligible = rng.randint(1, 200), rng.randint(0, 300)
        entropy, target = rng.choice([0.3, 0.5, 0.7]), 0.5
        assert aepo_rows(eligible, rows, above=entropy > target) == authors_sample_num(entropy, target, rows, eligible)


def test_the_prompt_count_rounds_down_as_the_authors_code():
    assert [aepo_prompts(0.25, p) for p in (0, 1, 3, 4, 7, 8, 32, 33, 512)] == [0, 0, 0, 1, 1, 2, 8, 8, 128]
    for p in range(0, 5000):
        assert aepo_prompts(0.25, p) == authors_prompts(p)
    rng = random.Random(1)
    for _ in range(5000):  # other fractions k/m: ⌊k·P/m⌋ in integers, whatever rounding k/m·P suffers
        m = rng.randint(1, 20)
        k, p = rng.randint(1, m), rng.randint(0, 10_000)
        assert aepo_prompts(k / m, p) == k * p // m, (k, m, p)


class FakeExtra:
    """A scored extra draw of ``rows`` rows (its rewards are replaced by the eligible rows the test patches in)."""

    def __init__(self, rows):
        self.rewards, self.group_size, self.batch_size = torch.zeros(rows), 4, rows


def test_the_request_chooses_as_many_rows_as_the_authors_code(monkeypatch):
    """The callback's whole count, end to end, against the transcription: random batch sizes, row fractions,
    prompts, eligible samples and entropies, the code's 60 rows of 2,560 with 3 eligible among them. The callback
    asks for the draw (temperature, prompts) and chooses its rows; it touches neither the data nor the module."""
    rng = random.Random(2)
    cases = [(2560, REINFORCE_ROWS, 512, 3, 0.7)]  # the code's setting: 60 rows allowed, 3 eligible, above target
    cases += [(rng.choice([8, 64, 256, 2560]), rng.choice([REINFORCE_ROWS, 0.09375, 0.25, 1.0]), rng.randint(4, 600),
               rng.randint(0, 80), rng.choice([0.3, 0.5, 0.7])) for _ in range(300)]
    for batch_rows, rows_frac, prompts, eligible, entropy in cases:
        monkeypatch.setattr(aepo, "eligible_rows", lambda rewards, g, t, k=eligible: torch.arange(k))
        trainer = SimpleNamespace(current_epoch=0, max_epochs=10)
        module = SimpleNamespace(batch_cfg=SimpleNamespace(prompts_per_iter=prompts))
        batch = SimpleNamespace(batch_size=batch_rows, metrics={"rollout/entropy": entropy})
        cb = AEPOCallback(target=0.5, rows_frac=rows_frac)
        request = cb.on_rollout_batch(trainer, module, batch)
        assert (request.temperature, request.prompts, request.label) == (1.2 if entropy <= 0.5 else 0.8,
                                                                         authors_prompts(prompts), "aepo")
        chosen = request.choose(FakeExtra(4 * max(1, eligible)))
        want = authors_sample_num(entropy, 0.5, max(1, round(rows_frac * batch_rows)), eligible)
        assert chosen.numel() == want == round(batch.metrics["control/aepo_rows_frac"] * batch_rows)
        assert batch.metrics["control/target_entropy"] == 0.5 and cb.last == {
            k: v for k, v in batch.metrics.items() if k.startswith("control/")}
    assert authors_sample_num(0.7, 0.5, round(REINFORCE_ROWS * 2560), 3) == 1


def test_eligible_rows_are_those_better_than_their_group_in_row_order():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])  # groups of 4: {1,0,1,1}, {0,0,1,0}
    assert eligible_rows(rewards, 4, 0.05).tolist() == [0, 2, 3, 6]
    assert eligible_rows(torch.ones(8), 4, 0.05).tolist() == []  # all-correct groups: nothing better than the group


class Policy:
    """A policy whose pre-update pass writes log-probs −0.5 and entropy 1.0 on the response (a closed form)."""

    tokenizer = SimpleNamespace(pad_id=0)

    def pre_update_pass(self, batch):
        batch.old_logp = torch.where(batch.response_mask, -0.5, 0.0)
        batch.entropy = torch.where(batch.response_mask, 1.0, 0.0)


class Source:
    """A rollout source whose extra draw is ``extra`` (and records what it was asked for)."""

    def __init__(self, extra):
        self.extra, self.asked = extra, []

    def sample_extra(self, tok, iteration, temperature, n, label, metrics):
        self.asked.append((iteration, temperature, n, label))
        return self.extra


def test_the_drawn_rows_get_advantage_one_on_policy_log_probs_and_no_correction():
    """The iteration serves AEPO's request (lit_entropy.iteration.draw): the chosen rows through the pre-update
    pass, then AEPO's ``prepare``, then in place of the batch's first rows."""
    main, extra = two_batches()
    main.old_logp = torch.where(main.response_mask, -1.0, 0.0)
    main.entropy = torch.where(main.response_mask, 2.0, 0.0)
    main.advantages = torch.tensor([0.5, -0.5, -0.5, 0.5])
    main.token_advantages = main.advantages[:, None] * main.response_mask
    main.is_weight = torch.where(main.response_mask, 0.7, 0.0)
    main.loss_mask = main.response_mask.clone()
    source = Source(extra)
    request = DrawRequest(1.2, 1, "aepo", choose=lambda drawn: torch.tensor([0, 1]), prepare=AEPOCallback.prepare)
    draw(source, Policy(), main, request, iteration=3)
    assert source.asked == [(3, 1.2, 1, "aepo")]
    resp = main.response_mask
    assert main.advantages.tolist() == [1.0, 1.0, -0.5, 0.5]
    assert torch.equal(main.token_advantages[:2], torch.where(resp[:2], 1.0, 0.0))
    assert torch.equal(main.old_logp[:2], torch.where(resp[:2], -0.5, 0.0))
    assert torch.equal(main.sampler_logp[:2], main.old_logp[:2])  # taken as on-policy
    assert torch.equal(main.is_weight[:2], torch.where(resp[:2], 1.0, 0.0))  # no mismatch weight
    assert torch.equal(main.is_weight[2:], torch.where(resp[2:], 0.7, 0.0))  # the other rows keep theirs
    assert main.group_index.tolist() == [0, 0, 1, 1]
    assert "time/aepo" in main.metrics


def test_no_chosen_row_leaves_the_batch_as_sampled():
    main, extra = two_batches()
    before = main.input_ids.clone()
    passes = []
    policy = SimpleNamespace(tokenizer=Policy.tokenizer, pre_update_pass=passes.append)
    draw(Source(extra), policy, main, DrawRequest(0.8, 1, "aepo", lambda drawn: torch.arange(0),
                                                  AEPOCallback.prepare), iteration=0)
    assert torch.equal(main.input_ids, before) and passes == []  # no pass on no rows


def test_the_yaml_instantiates_the_codes_defaults():
    cb = instantiate(yaml.safe_load(CONF.read_text()))
    assert isinstance(cb, AEPOCallback)
    assert (cb.target(0.0), cb.t_high, cb.t_low, cb.prompt_frac, cb.threshold) == (0.5, 1.2, 0.8, 0.25, 0.05)
    assert cb.rows_frac == REINFORCE_ROWS == 60 / 2560


@pytest.mark.parametrize("kwargs, key", [
    ({"t_low": 1.5}, "t_low"), ({"t_low": 0.0}, "t_low"), ({"prompt_frac": 0.0}, "prompt_frac"),
    ({"rows_frac": 1.5}, "rows_frac"), ({"threshold": float("nan")}, "threshold"),
])
def test_bad_values_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"callbacks\.entropy\.{key}:"):
        AEPOCallback(**kwargs)


def test_refused_with_an_overlapped_rollout():
    assert draw_refusals([AEPOCallback()], max_staleness=1) == ["AEPOCallback"]
    assert draw_refusals([AEPOCallback()], max_staleness=0) == []


def test_refused_when_the_prompt_share_rounds_to_no_prompt():
    module = SimpleNamespace(batch_cfg=SimpleNamespace(prompts_per_iter=3))
    with pytest.raises(ValueError, match=r"callbacks\.entropy\.prompt_frac: 0.25 of batch.prompts_per_iter=3"):
        AEPOCallback().on_fit_start(SimpleNamespace(), module)
    module.batch_cfg.prompts_per_iter = 4  # ⌊4/4⌋ = 1 prompt: accepted
    AEPOCallback().on_fit_start(SimpleNamespace(), module)
