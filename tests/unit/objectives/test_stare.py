"""STARE's pure parts (lit_entropy/objectives/stare.py): the surprisal quantile, the weights of the four quadrants,
the adaptive schedule, and that reweighting the advantages is reweighting the loss (the paper's code's form)."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.objectives.losses.ppo import clipped_surrogate
from lit_entropy.objectives.stare import adapt_weights, stare_weights, top_surprisal

ADV = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0], [-1.0, -1.0, -1.0, 0.0, 0.0]])
LOGP = torch.tensor([[-0.1, -2.0, -0.5, -3.0, -9.0], [-3.0, -0.2, -1.0, -7.0, float("nan")]])
MASK = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)


def test_top_surprisal_takes_the_ceiling_of_the_fraction_and_at_least_one():
    s = torch.tensor([[0.5, 3.0, 1.0, 2.0]])
    every = torch.ones(1, 4, dtype=torch.bool)
    assert top_surprisal(s, every, 0.5).tolist() == [[False, True, False, True]]  # ceil(2.0) = 2
    assert top_surprisal(s, every, 0.26).tolist() == [[False, True, False, True]]  # ceil(1.04) = 2
    assert top_surprisal(s, every, 0.01).tolist() == [[False, True, False, False]]  # at least 1
    assert not top_surprisal(s, torch.zeros(1, 4, dtype=torch.bool), 0.5).any()  # no candidate, none
    only = torch.tensor([[True, False, True, False]])
    assert top_surprisal(s, only, 1.0).tolist() == [[True, False, True, False]]  # never off the candidates
    with pytest.raises(ValueError, match="top_frac"):
        top_surprisal(s, every, 0.0)


def test_weights_by_hand_o1_and_c2():
    # A > 0 tokens (row 0, 4 in the mask), surprisals 0.1, 2, 0.5, 3: with P = 0.5, L+ = {2.0, 3.0}.
    # A < 0 tokens (row 1, 3 of them; the 4th has A = 0), surprisals 3, 0.2, 1: L- = ceil(1.5) = 2 -> {3, 1}.
    w, l_plus, l_minus = stare_weights(ADV, LOGP, MASK, 0.5, w=1.5, m=0.5, variant="c2")
    assert l_plus.tolist() == [[False, True, False, True, False], [False] * 5]
    assert l_minus.tolist() == [[False] * 5, [True, False, True, False, False]]
    assert w.tolist() == [[1.0, 1.5, 1.0, 1.5, 1.0], [0.5, 1.0, 0.5, 1.0, 1.0]]
    w1, _, l_minus1 = stare_weights(ADV, LOGP, MASK, 0.5, w=1.5, m=0.5, variant="o1")
    assert w1.tolist() == [[1.0, 1.5, 1.0, 1.5, 1.0], [1.0] * 5]  # o1 leaves L- alone
    assert torch.equal(l_minus1, l_minus)  # but still reports it
    assert not w.requires_grad and w.dtype == torch.float32


def test_zero_advantage_and_off_mask_tokens_are_never_picked():
    adv = torch.zeros(2, 5)
    w, l_plus, l_minus = stare_weights(adv, LOGP, MASK, 1.0, w=2.0, m=0.5, variant="c2")
    assert not l_plus.any() and not l_minus.any() and torch.equal(w, torch.ones(2, 5))


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="variant"):
        stare_weights(ADV, LOGP, MASK, 0.1, 1.1, 0.9, variant="o2")
    with pytest.raises(ValueError, match="> 0"):
        stare_weights(ADV, LOGP, MASK, 0.1, 1.1, 0.0)
    with pytest.raises(ValueError, match=r"\[B, L\]"):
        stare_weights(ADV[0], LOGP[0], MASK[0], 0.1, 1.1, 0.9)


def test_reweighted_advantage_is_the_reweighted_loss_value_and_gradient():
    """The paper's code multiplies PPO's per-token loss (dual clip included) by ω; the controller multiplies the
    advantage. With ω > 0 both are the same loss and the same gradient, clipped tokens included."""
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 7, generator=g) * 3
    logp = (old + (torch.rand(4, 7, generator=g) - 0.5)).requires_grad_(True)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5])[:, None].expand(4, 7)
    mask = torch.rand(4, 7, generator=g) > 0.2
    w, _, _ = stare_weights(adv, old, mask, 0.3, w=1.4, m=0.6, variant="c2")
    ours, _ = clipped_surrogate(logp, old, adv * w, 0.2, 0.28, 3.0, mask=mask)
    theirs, _ = clipped_surrogate(logp, old, adv, 0.2, 0.28, 3.0, mask=mask)
    theirs = theirs * w
    assert torch.allclose(ours, theirs, atol=1e-6)
    (g1,) = torch.autograd.grad(ours.sum(), logp)
    (g2,) = torch.autograd.grad(theirs.sum(), logp)
    assert torch.allclose(g1, g2, atol=1e-6)
    assert (w != 1).any()  # the case reweighted something


def test_adaptive_schedule_steps_and_clamps():
    assert adapt_weights(1.1, 0.9, entropy=0.2, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.11, 0.89)
    assert adapt_weights(1.1, 0.9, entropy=0.4, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.09, 0.91)
    assert adapt_weights(1.1, 0.9, entropy=0.3, target=0.3, alpha=0.01, w_max=1.5, m_min=0.5) == (1.1, 0.9)
    assert adapt_weights(1.5, 0.5, entropy=0.0, target=0.3, alpha=0.1, w_max=1.5, m_min=0.5) == (1.5, 0.5)
    assert adapt_weights(1.0, 1.0, entropy=1.0, target=0.3, alpha=0.1, w_max=1.5, m_min=0.5) == (1.0, 1.0)
    w, m = 1.1, 0.9
    for _ in range(7):
        w, m = adapt_weights(w, m, 0.0, 0.3, 0.01, 1.5, 0.5)
    assert (w, m) == (1.17, 0.83)  # rounded steps: no drift


# ------------------------------------------------------------------ the authors' rule, transcribed
# hp-luo/STARE, verl/trainer/ppo/core_algos.py: compute_stare_token_weights and compute_policy_loss_stare (the
# dual-clip GRPO surrogate, times the rollout IS weights, times ω ranked on this call's log_prob), agg_loss
# token-mean over the global batch's tokens. verl calls the loss once per micro-batch.


def authors_weights(log_prob, advantages, response_mask, top_ratio, w, m, variant, gate=True):
    weights = torch.ones_like(advantages, dtype=torch.float32)
    valid = response_mask > 0
    positive_candidates = valid & (advantages > 0)
    negative_candidates = valid & (advantages < 0)
    surprisal = -log_prob.detach()

    def top_surprisal_mask(candidate_mask):
        candidate_count = int(candidate_mask.sum().item())
        selected = torch.zeros_like(candidate_mask, dtype=torch.bool)
        if candidate_count == 0 or top_ratio <= 0.0:
            return selected
        k = max(1, int(candidate_count * top_ratio + 0.999999))
        k = min(k, candidate_count)
        _, idx = torch.topk(surprisal[candidate_mask], k=k, largest=True)
        flat = candidate_mask.reshape(-1).nonzero(as_tuple=False).squeeze(-1)
        selected.reshape(-1)[flat[idx]] = True
        return selected

    l_plus = top_surprisal_mask(positive_candidates)
    l_minus = top_surprisal_mask(negative_candidates) if variant == "C2" else torch.zeros_like(valid)
    if gate:
        weights = torch.where(l_plus, torch.full_like(weights, w), weights)
        if variant == "C2":
            weights = torch.where(l_minus, torch.full_like(weights, m), weights)
    return weights


def authors_loss(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_c, batch_num_tokens,
                 rollout_is_weights, top_ratio, w, m, variant):
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_losses = pg_losses * rollout_is_weights
    pg_losses = pg_losses * authors_weights(log_prob, advantages, response_mask, top_ratio, w, m, variant)
    return (pg_losses * response_mask).sum() / batch_num_tokens


def random_minibatch(g: torch.Generator, B: int = 9, L: int = 11) -> dict[str, torch.Tensor]:
    mask = torch.rand(B, L, generator=g) > 0.25
    old = torch.where(mask, -torch.rand(B, L, generator=g) * 4, 0.0)
    adv = torch.randn(B, generator=g)
    adv[int(torch.randint(0, B, (1,), generator=g))] = 0.0  # a group with no signal
    return {"response_mask": mask, "old_logp": old, "token_advantages": adv[:, None].expand(B, L).clone(),
            "is_weight": torch.rand(B, L, generator=g) * 2}


@pytest.mark.parametrize("variant", ["O1", "C2"])
def test_the_loss_weighs_each_micro_batch_as_the_authors_code_on_the_current_log_probs(variant):
    """``micro_batch_loss`` with STARE's knobs, summed over micro-batches, is the authors' loss per micro-batch
    (value and gradient), over 50 random minibatches cut three ways; the current policy's log-probs rank."""
    from lit_entropy.algo import AlgoConfig
    from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens

    algo = AlgoConfig(eps_high=0.28, dual_clip=10.0, loss_agg="token-mean")
    w, m = 1.3, 0.6
    knobs = Knobs(0.2, 0.28, stare_top_frac=0.15, stare_w=w, stare_m=m if variant == "C2" else 1.0)
    g = torch.Generator().manual_seed(1)
    differs_from_one_ranking = 0
    for case in range(50):
        mb = random_minibatch(g)
        logp = (mb["old_logp"] + 0.3 * torch.randn(mb["old_logp"].shape, generator=g)).requires_grad_(True)
        sel = select_tokens(algo, mb, knobs)
        cuts = [slice(0, 3), slice(3, 7), slice(7, 9)] if case % 3 else [slice(0, 5), slice(5, 9)]
        ours = sum(micro_batch_loss(algo, knobs, {k: v[c] for k, v in mb.items()}, sel.rows(c), logp[c], None)[0]
                   for c in cuts)
        theirs = sum(authors_loss(mb["old_logp"][c], logp[c], mb["token_advantages"][c], mb["response_mask"][c].float(),
                                  0.2, 0.28, 10.0, sel.num_tokens, mb["is_weight"][c], 0.15, w, m, variant)
                     for c in cuts)
        assert torch.allclose(ours, theirs, atol=1e-6, rtol=1e-5)
        (g_ours,) = torch.autograd.grad(ours, logp)
        (g_theirs,) = torch.autograd.grad(theirs, logp)
        assert torch.allclose(g_ours, g_theirs, atol=1e-6, rtol=1e-5)
        whole = authors_weights(logp, mb["token_advantages"], mb["response_mask"], 0.15, w, m, variant)
        per_cut = torch.cat([authors_weights(logp[c], mb["token_advantages"][c], mb["response_mask"][c], 0.15, w, m,
                                             variant) for c in cuts])
        differs_from_one_ranking += int(not torch.equal(whole, per_cut))
    assert differs_from_one_ranking > 10  # ranking per micro-batch is not ranking the minibatch once


def test_the_knobs_off_or_at_one_leave_the_loss_alone_and_count_what_they_weigh():
    from lit_entropy.algo import AlgoConfig
    from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens

    algo = AlgoConfig()
    mb = random_minibatch(torch.Generator().manual_seed(2))
    logp = mb["old_logp"] + 0.1
    plain = Knobs(0.2, 0.2)
    sel = select_tokens(algo, mb, plain)
    base, stats = micro_batch_loss(algo, plain, mb, sel, logp, None)
    assert "stare_acted" not in stats  # STARE off: nothing counted, the loss of plain GRPO
    shut, stats = micro_batch_loss(algo, Knobs(0.2, 0.2, stare_top_frac=0.1), mb, sel, logp, None)
    assert torch.equal(shut, base) and int(stats["stare_acted"]) == 0  # the gate shut: weights of 1, counted 0
    _, stats = micro_batch_loss(algo, Knobs(0.2, 0.2, stare_top_frac=0.1, stare_w=1.5), mb, sel, logp, None)
    _, l_plus, _ = stare_weights(mb["token_advantages"], logp, mb["response_mask"], 0.1, 1.5, 1.0)
    assert int(stats["stare_acted"]) == int(l_plus.sum()) > 0


def test_the_second_optimizer_step_ranks_on_the_updated_policy_as_the_authors_code():
    """Two minibatches of one iteration, a real optimizer step between them: the second step's gradient is the
    authors' loss over the module's own micro-batches with the tokens ranked on the updated policy's log-probs,
    and not the one ranked on the pre-update log-probs (the rule of ``rank: iteration``)."""
    from tests.unit.test_module_micro_batching import make_minibatch, make_module

    module = make_module(micro_batch_size=4, eps_high=0.28, dual_clip=10.0)
    module.stare_top_frac, module.stare_w, module.stare_m = 0.2, 3.0, 0.3
    first, second = make_minibatch(module, seed=0), make_minibatch(module, seed=1)
    opt = torch.optim.SGD(module.parameters(), lr=0.5)
    grads_only = False
    grads: list[torch.Tensor] = []

    def step(opt_, sched):  # the first minibatch's step is taken; the second's gradient is kept, not applied
        grads[:] = [p.grad.clone() for p in module.parameters()]
        if not grads_only:
            opt.step()
        opt.zero_grad()
        return torch.zeros(())

    module.optimizers, module.lr_schedulers = (lambda: opt), (lambda: None)
    module.manual_backward = lambda loss: loss.backward()
    module.log_dict = module.log = lambda *a, **k: None
    module._clip_and_step = step
    module.training_step(first, 0)
    grads_only = True
    module.training_step(second, 1)
    old, adv, mask = second["old_logp"], second["token_advantages"], second["response_mask"]

    def reference(rank_on_current: bool) -> list[torch.Tensor]:
        module.zero_grad()
        logp, _ = module.token_stats(second["input_ids"], second["attention_mask"], with_entropy=False)
        loss = torch.zeros(())
        for mb in module.row_passes(second).micro_batches(0):
            r = mb.rows
            omega = authors_weights(logp[r] if rank_on_current else old[r], adv[r], mask[r], 0.2, 3.0, 0.3, "C2")
            # the authors' loss with the ω above as its only weight (P = 1 with W = M = 1 weighs nothing more)
            loss = loss + authors_loss(old[r], logp[r], adv[r], mask[r].float(), 0.2, 0.28, 10.0, int(mask.sum()),
                                       omega, 1.0, 1.0, 1.0, "C2")
        loss.backward()
        return [p.grad.clone() for p in module.parameters()]

    authors = reference(rank_on_current=True)
    assert all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads, authors, strict=True))
    stale = reference(rank_on_current=False)
    assert not all(torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(grads, stale, strict=True))
