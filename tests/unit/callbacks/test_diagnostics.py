"""EntropyDiagnosticsCallback on real RolloutBatch objects: metrics, dH_actual bookkeeping, state, histogram."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_entropy.callbacks.base import EntropyController
from lit_entropy.callbacks.diagnostics import HISTOGRAM_TAG, EntropyDiagnosticsCallback
from lit_entropy.diagnostics.discriminator import token_scores
from lit_entropy.diagnostics.entropy_dynamics import cov_logp_adv, dh_pred, disc_centered_mean
from lit_entropy.rollout.batch import RolloutBatch

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "diagnostics"

METRICS = (
    "diag/cov_logp_adv",
    "diag/entropy_pos_adv",
    "diag/entropy_neg_adv",
    "diag/disc_centered_mean",
    "diag/dH_pred",
    "diag/dH_actual",
    "diag/loglik_pos",
    "diag/loglik_neg",
    "diag/entropy_q10",
    "diag/entropy_q50",
    "diag/entropy_q90",
    "diag/entropy_q99",
)


def make_batch(
    seed: int = 0, B: int = 6, L: int = 9, V: int = 13, entropy: float | None = None
) -> RolloutBatch:
    """A batch as the module leaves it after the pre-update pass (with scores) and the advantages."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, V, (B, L), generator=gen)
    lengths = torch.randint(2, L - 2, (B,), generator=gen)
    resp = (torch.arange(L)[None] >= 2) & (torch.arange(L)[None] < 2 + lengths[:, None])
    logits = 2 * torch.randn(B, L, V, generator=gen)
    logp_all = torch.log_softmax(logits, -1)
    old_logp = logp_all.gather(-1, input_ids[..., None]).squeeze(-1)
    ent = -(logp_all.exp() * logp_all).sum(-1)
    S, N = token_scores(logits, input_ids)
    garbage = torch.full((B, L), float("nan"))
    rewards = torch.randint(0, 2, (B,), generator=gen).float()
    batch = RolloutBatch(
        input_ids=input_ids,
        attention_mask=torch.ones(B, L, dtype=torch.bool),
        response_mask=resp,
        rewards=rewards,
        group_index=torch.arange(B) // 2,
        group_size=2,
        sampler_logp=torch.where(resp, old_logp, 0.0),
    )
    batch.old_logp = torch.where(resp, old_logp, garbage)
    batch.entropy = torch.where(resp, ent, garbage)
    batch.disc_s, batch.disc_n = torch.where(resp, S, garbage), torch.where(resp, N, garbage)
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0])[:B]
    batch.token_advantages = batch.advantages[:, None].expand_as(input_ids).clone()
    h = float(ent[resp].mean()) if entropy is None else entropy
    batch.metrics["rollout/entropy"] = h
    return batch


class FakeExperiment:
    def __init__(self) -> None:
        self.calls: list[tuple[str, torch.Tensor, int]] = []

    def add_histogram(self, tag, values, global_step=None):
        self.calls.append((tag, values, global_step))


def trainer_at(epoch: int, experiment=None):
    loggers = [SimpleNamespace(experiment=experiment)] if experiment is not None else []
    return SimpleNamespace(current_epoch=epoch, loggers=loggers, logger=loggers[0] if loggers else None)


def test_is_a_plain_callback_that_drives_no_knob_and_turns_scores_on():
    cb = EntropyDiagnosticsCallback()
    assert isinstance(cb, pl.Callback) and not isinstance(cb, EntropyController)
    assert cb.knobs == ()
    module = SimpleNamespace(want_scores=False)
    cb.setup(trainer_at(0), module, "fit")
    assert module.want_scores is True


def test_writes_every_metric_finite_from_the_second_iteration():
    cb = EntropyDiagnosticsCallback()
    first = make_batch(0)
    cb.on_rollout_batch(trainer_at(0), None, first)
    assert set(METRICS) - set(first.metrics) == {"diag/dH_actual"}  # nothing to compare with yet
    second = make_batch(1)
    cb.on_rollout_batch(trainer_at(1), None, second)
    for name in METRICS:
        assert name in second.metrics, name
        assert isinstance(second.metrics[name], float) and math.isfinite(second.metrics[name]), name
    q = [second.metrics[f"diag/entropy_q{p}"] for p in (10, 50, 90, 99)]
    assert q == sorted(q)


def test_metrics_match_the_pure_functions_and_use_the_loss_advantages():
    batch = make_batch(2)
    # A controller (e.g. REPO) reshaped the token advantages: the diagnostics must follow them.
    batch.token_advantages = batch.token_advantages * torch.linspace(0.5, 1.5, batch.input_ids.shape[1])
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(0), None, batch)
    resp = batch.response_mask
    m = batch.metrics
    assert m["diag/cov_logp_adv"] == pytest.approx(
        float(cov_logp_adv(batch.old_logp, batch.token_advantages, resp))
    )
    assert m["diag/dH_pred"] == pytest.approx(
        float(dh_pred(batch.disc_s, batch.disc_n, batch.token_advantages, resp))
    )
    assert m["diag/dH_pred"] != pytest.approx(
        float(dh_pred(batch.disc_s, batch.disc_n, batch.advantages, resp))
    )
    assert m["diag/disc_centered_mean"] == pytest.approx(
        float(disc_centered_mean(batch.disc_s, batch.disc_n, resp))
    )
    pos_rows = batch.advantages > 0
    expected_pos = batch.entropy[resp & pos_rows[:, None]].mean()
    assert m["diag/entropy_pos_adv"] == pytest.approx(float(expected_pos))


def test_falls_back_to_sequence_advantages_and_ignores_rejected_rows_for_loss_metrics():
    batch = make_batch(3)
    batch.token_advantages = None
    batch.keep = torch.tensor([True, True, True, True, False, False])
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(0), None, batch)
    kept = batch.response_mask & batch.keep[:, None]
    assert batch.metrics["diag/dH_pred"] == pytest.approx(
        float(dh_pred(batch.disc_s, batch.disc_n, batch.advantages, kept))
    )
    # The quantiles describe the whole sampled batch.
    all_ent = batch.entropy[batch.response_mask]
    assert batch.metrics["diag/entropy_q50"] == pytest.approx(float(torch.quantile(all_ent, 0.5)))


def test_dh_actual_is_this_iteration_minus_the_previous_one():
    cb = EntropyDiagnosticsCallback()
    seen = []
    for epoch, h in enumerate((0.9, 0.7, 0.75)):
        batch = make_batch(epoch, entropy=h)
        cb.on_rollout_batch(trainer_at(epoch), None, batch)
        seen.append(batch.metrics.get("diag/dH_actual"))
    assert seen[0] is None
    assert seen[1:] == [pytest.approx(0.7 - 0.9), pytest.approx(0.75 - 0.7)]
    # A second batch for the same iteration (a re-collection) is compared with the same previous entropy.
    again = make_batch(5, entropy=0.6)
    cb.on_rollout_batch(trainer_at(2), None, again)
    assert again.metrics["diag/dH_actual"] == pytest.approx(0.6 - 0.7)


def test_state_dict_round_trip_continues_the_dh_actual_series():
    a = EntropyDiagnosticsCallback()
    a.on_rollout_batch(trainer_at(0), None, make_batch(0, entropy=0.8))
    state = a.state_dict()
    assert state["last_entropy"] == pytest.approx(0.8)
    b = EntropyDiagnosticsCallback()
    b.load_state_dict(state)
    resumed = make_batch(1, entropy=0.5)
    b.on_rollout_batch(trainer_at(1), None, resumed)
    straight = make_batch(1, entropy=0.5)
    a.on_rollout_batch(trainer_at(1), None, straight)
    assert resumed.metrics["diag/dH_actual"] == pytest.approx(-0.3)
    assert resumed.metrics == straight.metrics
    assert b.state_dict() == a.state_dict()


def test_histogram_goes_to_loggers_that_support_it():
    exp = FakeExperiment()
    batch = make_batch(0)
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(3, exp), None, batch)
    assert len(exp.calls) == 1
    tag, values, step = exp.calls[0]
    assert tag == HISTOGRAM_TAG and step == 4  # Lightning epoch 3 is iteration 4: the step of its scalars
    torch.testing.assert_close(values, batch.entropy[batch.response_mask])
    # No logger, or one without add_histogram (CSV): skipped silently; histogram=False: never.
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(0), None, make_batch(0))
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(0, SimpleNamespace()), None, make_batch(0))
    quiet = FakeExperiment()
    EntropyDiagnosticsCallback(histogram=False).on_rollout_batch(trainer_at(0, quiet), None, make_batch(0))
    assert quiet.calls == []
    capped = FakeExperiment()
    EntropyDiagnosticsCallback(max_histogram_values=3).on_rollout_batch(
        trainer_at(0, capped), None, make_batch(0)
    )
    assert capped.calls[0][1].numel() == 3


def test_histogram_written_to_a_real_tensorboard_file(tmp_path):
    tb = pytest.importorskip("torch.utils.tensorboard")
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    writer = tb.SummaryWriter(log_dir=str(tmp_path))
    try:
        EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(2, writer), None, make_batch(0))
    finally:
        writer.close()
    acc = accumulator.EventAccumulator(str(tmp_path))
    acc.Reload()
    assert HISTOGRAM_TAG in acc.Tags()["histograms"]
    assert [e.step for e in acc.Histograms(HISTOGRAM_TAG)] == [3]  # epoch 2 = iteration 3


def test_missing_scores_skip_only_the_score_metrics():
    batch = make_batch(0)
    batch.disc_s = batch.disc_n = None
    EntropyDiagnosticsCallback().on_rollout_batch(trainer_at(0), None, batch)
    assert "diag/dH_pred" not in batch.metrics and "diag/disc_centered_mean" not in batch.metrics
    assert math.isfinite(batch.metrics["diag/cov_logp_adv"])


def test_yaml_instantiates_and_none_is_empty():
    cb = instantiate(OmegaConf.load(CONF / "entropy.yaml"))
    assert isinstance(cb, EntropyDiagnosticsCallback)
    assert cb.quantiles == (0.1, 0.5, 0.9, 0.99) and cb.histogram
    assert not OmegaConf.load(CONF / "none.yaml")
    with pytest.raises(ValueError, match="quantiles"):
        EntropyDiagnosticsCallback(quantiles=(0.5, 2.0))
