"""STARECallback (lit_entropy/callbacks/stare.py): the gate, what it writes into the batch, its state, its config
errors and the loss it refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.stare import STARECallback
from lit_entropy.objectives.stare import stare_weights
from lit_entropy.train import check_controllers_and_algo
from tests.unit.callbacks.test_repo import random_batch, trainer_at

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy" / "stare.yaml"


def step(cb: STARECallback, entropy: float, seed: int = 0, keep: torch.Tensor | None = None):
    batch = random_batch(seed)
    if keep is not None:
        batch.keep = keep
    before = batch.token_advantages.clone()
    batch.metrics["rollout/entropy"] = entropy
    cb.on_rollout_batch(trainer_at(0), None, batch)
    return batch, before


def test_gate_open_under_the_target_reweights_exactly_the_critical_tokens():
    cb = STARECallback(target=0.3, variant="c2", top_frac=0.2, w=1.5, m=0.5)
    batch, before = step(cb, entropy=0.29)
    mask = batch.response_mask
    want, l_plus, l_minus = stare_weights(before, batch.old_logp, mask, 0.2, 1.5, 0.5, "c2")
    assert torch.equal(batch.token_advantages, before * want)
    assert batch.metrics["control/stare_gate"] == 1.0
    acted = int((l_plus | l_minus).sum())
    assert acted > 0 and batch.metrics["control/stare_reweighted_frac"] == pytest.approx(acted / int(mask.sum()))
    cut = float((-batch.old_logp)[l_plus].min())
    assert batch.metrics["control/stare_surprisal_cut"] == pytest.approx(cut)
    # every picked positive token is at least as surprising as every unpicked positive one
    pos = mask & (before > 0)
    assert float((-batch.old_logp)[pos & ~l_plus].max()) <= cut


def test_gate_shut_at_or_above_the_target_changes_nothing():
    cb = STARECallback(target=0.3)
    for h in (0.3, 0.5):
        batch, before = step(cb, entropy=h)
        assert torch.equal(batch.token_advantages, before)
        assert batch.metrics["control/stare_gate"] == 0.0 and batch.metrics["control/stare_reweighted_frac"] == 0.0


def test_rejected_rows_are_never_picked():
    keep = torch.tensor([True, False] * 6)
    cb = STARECallback(target=1.0, top_frac=1.0, w=2.0, variant="o1")
    batch, before = step(cb, entropy=0.1, keep=keep)
    assert torch.equal(batch.token_advantages[~keep], before[~keep])
    assert not torch.equal(batch.token_advantages[keep], before[keep])


def test_adaptive_weights_move_and_survive_the_state_dict():
    cb = STARECallback(target=0.3, adaptive=True, alpha=0.05, variant="c2")
    for i in range(3):
        step(cb, entropy=0.1, seed=i)
    assert (cb.w, cb.m) == (pytest.approx(1.25), pytest.approx(0.75))
    state = cb.state_dict()
    other = STARECallback(target=0.3, adaptive=True, alpha=0.05, variant="c2")
    other.load_state_dict(state)
    assert (other.w, other.m, other.gate) == (cb.w, cb.m, cb.gate)
    a, _ = step(cb, entropy=0.1, seed=9)
    b, _ = step(other, entropy=0.1, seed=9)
    assert torch.equal(a.token_advantages, b.token_advantages) and a.metrics == b.metrics


def test_the_yaml_instantiates_the_papers_defaults():
    cb = instantiate(yaml.safe_load(CONF.read_text()))
    assert isinstance(cb, STARECallback)
    assert (cb.target(0.0), cb.variant, cb.top_frac, cb.w, cb.m, cb.adaptive) == (0.3, "o1", 0.1, 1.1, 0.9, False)


@pytest.mark.parametrize("kwargs, key", [
    ({"variant": "x"}, "variant"), ({"top_frac": 0.0}, "top_frac"), ({"w": 0.9}, "w"), ({"w": 2.0, "adaptive": True}, "w"),
    ({"m": 1.2}, "m"), ({"m": 0.4, "adaptive": True}, "m"), ({"alpha": -1.0}, "alpha"),
])
def test_bad_values_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=rf"callbacks\.entropy\.{key}:"):
        STARECallback(**kwargs)


def test_unknown_key_is_refused():
    with pytest.raises(TypeError, match="STARECallback.*quantile"):
        STARECallback(quantile=0.1)


def test_refused_with_a_per_sequence_loss_at_start_up():
    class Algo:
        loss, name = "gspo", "gspo"

    with pytest.raises(ValueError, match="STARECallback reweights per-token advantages.*gspo"):
        check_controllers_and_algo([STARECallback()], Algo())
    Algo.loss = "ppo"
    check_controllers_and_algo([STARECallback()], Algo())  # accepted
