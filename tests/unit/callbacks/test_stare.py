"""STARECallback (lit_entropy/callbacks/stare.py): the gate, the knobs it sets (rank: micro_batch) or what it writes
into the batch (rank: iteration), its state, its config errors and the loss it refuses."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from hydra.utils import instantiate

from lit_entropy.callbacks.stare import STARECallback
from lit_entropy.objectives.stare import stare_weights
from lit_entropy.train import check_controllers_and_algo
from tests.unit.callbacks.test_repo import trainer_at
from tests.unit.objectives.test_repo import random_batch

CONF = Path(__file__).resolve().parents[3] / "conf" / "callbacks" / "entropy" / "stare.yaml"


def step(cb: STARECallback, entropy: float, seed: int = 0, keep: torch.Tensor | None = None,
         module: SimpleNamespace | None = None):
    batch = random_batch(seed)
    if keep is not None:
        batch.keep = keep
    before = batch.token_advantages.clone()
    batch.metrics["rollout/entropy"] = entropy
    cb.on_rollout_batch(trainer_at(0), module, batch)
    return batch, before


def knobs(module: SimpleNamespace) -> tuple[float, float, float]:
    return module.stare_top_frac, module.stare_w, module.stare_m


@pytest.mark.parametrize("variant, open_knobs", [("o1", (0.2, 1.5, 1.0)), ("c2", (0.2, 1.5, 0.5))])
def test_micro_batch_rank_sets_the_knobs_and_leaves_the_batch_alone(variant, open_knobs):
    """The default rank: the loss weighs the tokens (objective tests); the controller only turns the knobs, 1 and 1
    while the gate is shut, ``stare_m`` 1 in o1 (the authors leave L- alone)."""
    cb = STARECallback(target=0.3, variant=variant, top_frac=0.2, w=1.5, m=0.5)
    assert cb.rank == "micro_batch" and cb.knobs == ("stare_top_frac", "stare_w", "stare_m")
    module = SimpleNamespace()
    batch, before = step(cb, entropy=0.29, module=module)
    assert knobs(module) == open_knobs
    assert torch.equal(batch.token_advantages, before)
    assert batch.metrics["control/stare_gate"] == 1.0 and "control/stare_reweighted_frac" not in batch.metrics
    batch, before = step(cb, entropy=0.31, module=module)
    assert knobs(module) == (0.2, 1.0, 1.0) and batch.metrics["control/stare_gate"] == 0.0
    assert (batch.metrics["control/stare_w"], batch.metrics["control/stare_m"]) == (1.5, 0.5)  # the settings


def test_iteration_rank_gate_open_under_the_target_reweights_exactly_the_critical_tokens():
    cb = STARECallback(target=0.3, variant="c2", top_frac=0.2, w=1.5, m=0.5, rank="iteration")
    assert cb.knobs == ("token_advantages",)
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


def test_iteration_rank_gate_shut_at_or_above_the_target_changes_nothing():
    cb = STARECallback(target=0.3, rank="iteration")
    for h in (0.3, 0.5):
        batch, before = step(cb, entropy=h)
        assert torch.equal(batch.token_advantages, before)
        assert batch.metrics["control/stare_gate"] == 0.0 and batch.metrics["control/stare_reweighted_frac"] == 0.0


def test_iteration_rank_never_picks_rejected_rows():
    keep = torch.tensor([True, False] * 6)
    cb = STARECallback(target=1.0, top_frac=1.0, w=2.0, variant="o1", rank="iteration")
    batch, before = step(cb, entropy=0.1, keep=keep)
    assert torch.equal(batch.token_advantages[~keep], before[~keep])
    assert not torch.equal(batch.token_advantages[keep], before[keep])


def test_adaptive_weights_move_and_survive_the_state_dict():
    cb = STARECallback(target=0.3, adaptive=True, alpha=0.05, variant="c2")
    for i in range(3):
        step(cb, entropy=0.1, seed=i, module=SimpleNamespace())
    assert (cb.w, cb.m) == (pytest.approx(1.25), pytest.approx(0.75))
    state = cb.state_dict()
    other = STARECallback(target=0.3, adaptive=True, alpha=0.05, variant="c2")
    other.load_state_dict(state)
    assert (other.w, other.m, other.gate) == (cb.w, cb.m, cb.gate)
    ours, theirs = SimpleNamespace(), SimpleNamespace()
    a, _ = step(cb, entropy=0.1, seed=9, module=ours)
    b, _ = step(other, entropy=0.1, seed=9, module=theirs)
    assert ours == theirs and a.metrics == b.metrics and knobs(ours) == (0.1, pytest.approx(1.3), pytest.approx(0.7))


def test_the_yaml_instantiates_the_papers_defaults():
    cb = instantiate(yaml.safe_load(CONF.read_text()))
    assert isinstance(cb, STARECallback)
    assert (cb.target(0.0), cb.variant, cb.top_frac, cb.w, cb.m, cb.adaptive) == (0.3, "o1", 0.1, 1.1, 0.9, False)
    assert cb.rank == "micro_batch"


@pytest.mark.parametrize("kwargs, key", [
    ({"variant": "x"}, "variant"), ({"top_frac": 0.0}, "top_frac"), ({"w": 0.9}, "w"), ({"w": 2.0, "adaptive": True}, "w"),
    ({"m": 1.2}, "m"), ({"m": 0.4, "adaptive": True}, "m"), ({"alpha": -1.0}, "alpha"), ({"rank": "batch"}, "rank"),
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


def test_the_authors_recipe_composes_with_the_controller():
    """``algo=stare_recipe callbacks/entropy=stare``: the authors' script's clip 0.2 / 0.28, dual clip 10, token-mean,
    no KL, dynamic sampling with up to 10 generation rounds, one optimizer step a batch; the controller at rank
    micro_batch."""
    from tests.helpers import compose_train

    cfg = compose_train(["algo=stare_recipe", "callbacks/entropy=stare", "paths.output_dir=unused"])
    algo, batch = cfg.algo, cfg.batch
    assert (algo.eps_low, algo.eps_high, algo.dual_clip, algo.loss_agg, algo.kl_coef) == (0.2, 0.28, 10.0,
                                                                                          "token-mean", 0.0)
    assert (batch.dynamic_sampling, 1 + batch.max_sampling_rounds, batch.num_minibatches) == (True, 10, 1)
    assert instantiate(cfg.callbacks.entropy).rank == "micro_batch"
