"""The assembled objective: selection over the whole minibatch, micro-batch invariance end to end."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.diagnostics.entropy import align_to_input, shift_for_causal_lm, token_logprobs_and_entropy
from lit_entropy.objectives.losses import LOSSES
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens

V, B, L = 11, 8, 7


def make_minibatch(seed: int = 0) -> tuple[dict, torch.nn.Module]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, V, (B, L), generator=g)
    resp = torch.zeros(B, L, dtype=torch.bool)
    for i in range(B):
        start = 2 + i % 3
        resp[i, start : L - (i % 2)] = True
    resp[3, :] = False
    resp[3, 4] = True  # a single-token response
    adv = torch.randn(B, generator=g)
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Embedding(V, 16), torch.nn.Linear(16, V))
    with torch.no_grad():
        logp, ent = logp_entropy(model, ids)
    mb = {
        "input_ids": ids,
        "response_mask": resp,
        "token_advantages": adv[:, None].expand(B, L).clone(),
        "old_logp": (logp + 0.05 * torch.randn(B, L, generator=g)).detach(),
        "entropy": ent.detach(),
        "disc_s": torch.randn(B, L, generator=g),
        "disc_n": torch.randn(B, L, generator=g),
        "ref_logp": (logp + 0.1 * torch.randn(B, L, generator=g)).detach(),
    }
    return mb, model


def logp_entropy(model, ids):
    logits = model(ids)
    shifted, targets = shift_for_causal_lm(logits, ids)
    logp, ent = token_logprobs_and_entropy(shifted, targets, chunk_size=5)
    return align_to_input(logp), align_to_input(ent)


def grads_for(algo: AlgoConfig, knobs: Knobs, splits: int) -> tuple[float, list[torch.Tensor]]:
    mb, model = make_minibatch()
    with torch.no_grad():
        current, _ = logp_entropy(model, mb["input_ids"])
    sel = select_tokens(algo, mb, knobs, current, torch.Generator().manual_seed(1))
    total = 0.0
    for rows in torch.tensor_split(torch.arange(B), splits):
        sl = slice(int(rows[0]), int(rows[-1]) + 1)
        part = {k: v[sl] for k, v in mb.items()}
        logp, ent = logp_entropy(model, part["input_ids"])
        loss, _ = micro_batch_loss(algo, knobs, part, sel.rows(sl), logp, ent)
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for p in model.parameters()]


ALGOS = {
    "grpo": AlgoConfig(),
    "dual_clip": AlgoConfig(dual_clip=3.0),
    "gspo": AlgoConfig(loss="gspo", eps_low=3e-4, eps_high=4e-4, loss_agg="seq-mean-token-mean"),
    "dr_grpo": AlgoConfig(advantage="dr_grpo", loss_agg="seq-mean-token-sum-norm", loss_norm_constant=16),
    "seq_sum": AlgoConfig(loss_agg="seq-mean-token-sum"),
    "clip_cov": AlgoConfig(selection="clip_cov", selection_args={"rho": 0.1, "bound_low": -1e9, "bound_high": 1e9}),
    "kl_cov": AlgoConfig(selection="kl_cov", selection_args={"k": 0.2}),
    "clip_b": AlgoConfig(selection="clip_b", selection_args={"mu": 0.5}),
    "clip_v": AlgoConfig(selection="clip_v", selection_args={"mu": 0.5, "max_frac": 0.2}),
    "forking": AlgoConfig(selection="forking"),
    "bonus_and_kl": AlgoConfig(entropy_coef=0.01, kl_coef=0.05),
}


@pytest.mark.parametrize("name", sorted(ALGOS))
def test_whole_objective_is_micro_batch_invariant(name):
    algo = ALGOS[name]
    knobs = Knobs(algo.eps_low, algo.eps_high, entropy_coef=algo.entropy_coef, kl_coef=algo.kl_coef)
    ref_loss, ref_grads = grads_for(algo, knobs, 1)
    for splits in (2, 4):
        loss, grads = grads_for(algo, knobs, splits)
        assert loss == pytest.approx(ref_loss, abs=1e-6)
        for a, b in zip(grads, ref_grads, strict=True):
            assert torch.allclose(a, b, atol=1e-6), name


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "clip_b", "clip_v", "forking"])
def test_selection_rules_touch_tokens_and_report_it(name):
    mb, model = make_minibatch()
    algo = ALGOS[name]
    with torch.no_grad():
        current, _ = logp_entropy(model, mb["input_ids"])
    sel = select_tokens(algo, mb, Knobs(0.2, 0.2), current)
    assert sel.frac is not None and 0 < sel.frac < 1
    assert not (sel.loss_mask & ~mb["response_mask"]).any()


def test_clip_cov_detaches_gradient_of_selected_tokens():
    algo = AlgoConfig(selection="clip_cov", selection_args={"rho": 0.2, "bound_low": -1e9, "bound_high": 1e9})
    mb, model = make_minibatch()
    knobs = Knobs(0.2, 0.2)
    logp, ent = logp_entropy(model, mb["input_ids"])
    sel = select_tokens(algo, mb, knobs, logp.detach())
    logp.retain_grad()
    loss, _ = micro_batch_loss(algo, knobs, mb, sel, logp, ent.detach())
    loss.backward()
    assert sel.detach.any()
    assert (logp.grad[sel.detach] == 0).all()
    assert (logp.grad[mb["response_mask"] & ~sel.detach] != 0).any()


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"loss": "gspo", "selection": "kl_cov"}, "pick one"),
        ({"loss": "gspo", "dual_clip": 3.0}, "dual_clip"),
        ({"selection": "clip_cov", "selection_args": {"rhoo": 1}}, "rhoo"),
        ({"selection_args": {"rho": 1}}, "selection is null"),
        ({"loss_agg": "seq-mean-token-sum-norm"}, "loss_norm_constant"),
        ({"advantage": "ppo2"}, "advantage"),
        ({"kl_kind": "k9"}, "kl_kind"),
    ],
)
def test_combinations_that_cannot_work_fail_at_start_up(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AlgoConfig(**kwargs)


def test_dynamic_sampling_and_a_baseline_free_estimator_fail_at_start_up():
    from lit_entropy.rollout.batch import BatchConfig
    from lit_entropy.train import check_batch_and_algo

    with pytest.raises(ValueError, match="batch.dynamic_sampling .* algo.advantage=w_reinforce"):
        check_batch_and_algo(BatchConfig(dynamic_sampling=True), AlgoConfig(advantage="w_reinforce"))
    check_batch_and_algo(BatchConfig(dynamic_sampling=True), AlgoConfig(advantage="grpo"))


def test_module_checkpoints_the_selection_generator():
    from types import SimpleNamespace

    from lit_entropy.module import PolicyModule

    module = PolicyModule(SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=None, path="unused"))
    torch.randint(0, 100, (3,), generator=module.selection_generator)
    checkpoint: dict = {}
    module.on_save_checkpoint(checkpoint)
    expected = torch.randint(0, 10**6, (5,), generator=module.selection_generator)
    fresh = PolicyModule(SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=None, path="unused"))
    fresh.on_load_checkpoint(checkpoint)
    assert torch.equal(torch.randint(0, 10**6, (5,), generator=fresh.selection_generator), expected)


def test_row_weight_scales_each_rows_loss():
    algo = AlgoConfig()
    knobs = Knobs(0.2, 0.2)
    mb, model = make_minibatch()
    logp, ent = logp_entropy(model, mb["input_ids"])
    sel = select_tokens(algo, mb, knobs)
    plain, _ = micro_batch_loss(algo, knobs, mb, sel, logp, ent.detach())
    weighted = dict(mb, row_weight=torch.full((B,), 3.0))
    tripled, _ = micro_batch_loss(algo, knobs, weighted, sel, logp, ent.detach())
    assert float(tripled) == pytest.approx(3 * float(plain), rel=1e-6)


def test_kl_cov_reads_no_clip_range_where_ppo_does():
    """KL-Cov's loss is the unclipped surrogate plus its penalty: a clip range changes neither its loss nor its
    gradient, and it reports no clipped token; on the same minibatch PPO's clip binds (so the check can fail)."""
    def run(algo: AlgoConfig) -> tuple[float, list[torch.Tensor], float]:
        knobs = Knobs(algo.eps_low, algo.eps_high)
        loss, grads = grads_for(algo, knobs, 1)
        mb, model = make_minibatch()
        logp, ent = logp_entropy(model, mb["input_ids"])
        sel = select_tokens(algo, mb, knobs, logp.detach(), torch.Generator().manual_seed(1))
        _, stats = micro_batch_loss(algo, knobs, mb, sel, logp, ent)
        return loss, grads, float(stats["clip_low"] + stats["clip_high"])

    for selection, moved in ((None, True), ("kl_cov", False)):
        args = {"selection": selection, "selection_args": {"k": 0.2} if selection else {}}
        wide, narrow = run(AlgoConfig(**args)), run(AlgoConfig(eps_low=0.02, eps_high=0.02, **args))
        same = wide[0] == pytest.approx(narrow[0], abs=1e-7) and all(
            torch.allclose(a, b, atol=1e-7) for a, b in zip(wide[1], narrow[1], strict=True))
        assert same != moved, selection
        assert (narrow[2] > 0) == moved, selection


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_each_loss_reads_the_clip_knobs_it_declares_and_no_other(name):
    """``PolicyLoss.clip_knobs`` is what :func:`lit_entropy.algo.unread_clip_advice` trusts: a knob a loss declares
    moves its loss or gradient when narrowed from 0.2 to 1e-4, and a knob it does not declare moves nothing."""
    for knob in ("eps_low", "eps_high"):
        runs = []
        for value in (0.2, 1e-4):
            algo = AlgoConfig(loss=name, **{knob: value})
            runs.append(grads_for(algo, Knobs(algo.eps_low, algo.eps_high), 1))
        (wide, wide_grads), (narrow, narrow_grads) = runs
        same = wide == pytest.approx(narrow, abs=1e-7) and all(
            torch.allclose(a, b, atol=1e-7) for a, b in zip(wide_grads, narrow_grads, strict=True))
        assert same != (knob in LOSSES[name].clip_knobs), (name, knob)
