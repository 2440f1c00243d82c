"""AEPOCallback (lit_entropy/callbacks/aepo.py): the switch, the eligible rows, the replacement of the batch's rows
(with a policy whose pre-update pass is a closed form), its config errors. The real draw and update on the lab:
tests/integration/test_controllers.py; its exact resume: tests/integration/test_controller_resume.py."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.aepo import REINFORCE_ROWS, AEPOCallback, aepo_choice, eligible_rows
from tests.unit.rollout.test_batch import two_batches

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy" / "aepo.yaml"


def test_the_switch():
    assert aepo_choice(0.4, 0.5, 1.2, 0.8, 6) == (1.2, 6)
    assert aepo_choice(0.5, 0.5, 1.2, 0.8, 6) == (1.2, 6)  # at the target: the high temperature (the code's <=)
    assert aepo_choice(0.6, 0.5, 1.2, 0.8, 7) == (0.8, 3)  # above: the low one, half the rows


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


def test_replace_gives_the_rows_advantage_one_on_policy_log_probs_and_no_correction():
    main, extra = two_batches()
    main.old_logp = torch.where(main.response_mask, -1.0, 0.0)
    main.entropy = torch.where(main.response_mask, 2.0, 0.0)
    main.advantages = torch.tensor([0.5, -0.5, -0.5, 0.5])
    main.token_advantages = main.advantages[:, None] * main.response_mask
    main.is_weight = torch.where(main.response_mask, 0.7, 0.0)
    main.loss_mask = main.response_mask.clone()
    AEPOCallback.replace(Policy(), main, extra.take(torch.tensor([0, 1])))
    resp = main.response_mask
    assert main.advantages.tolist() == [1.0, 1.0, -0.5, 0.5]
    assert torch.equal(main.token_advantages[:2], torch.where(resp[:2], 1.0, 0.0))
    assert torch.equal(main.old_logp[:2], torch.where(resp[:2], -0.5, 0.0))
    assert torch.equal(main.sampler_logp[:2], main.old_logp[:2])  # taken as on-policy
    assert torch.equal(main.is_weight[:2], torch.where(resp[:2], 1.0, 0.0))  # no mismatch weight
    assert torch.equal(main.is_weight[2:], torch.where(resp[2:], 0.7, 0.0))  # the other rows keep theirs
    assert main.group_index.tolist() == [0, 0, 1, 1]


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
    trainer = SimpleNamespace(datamodule=SimpleNamespace(sampler=SimpleNamespace(
        sampling=SimpleNamespace(max_staleness=1))))
    with pytest.raises(ValueError, match="max_staleness=1"):
        AEPOCallback().on_fit_start(trainer, SimpleNamespace())
