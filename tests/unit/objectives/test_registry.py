"""The registry of selection rules and loss terms: queries, knobs, and adding a rule or a term (docs/objectives.md)."""

from __future__ import annotations

import ast
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import Tensor

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives import registry
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.policy_loss import aggregate
from lit_entropy.objectives.registry import LossTerm, SelectionRule, TermInputs
from lit_entropy.objectives.selection.tokens import check_mask, fraction, per_token
from tests.unit.objectives.test_objective import logp_entropy, make_minibatch


def test_no_objectives_module_imports_the_config():
    """objectives/ is imported by lit_entropy.algo; it must not import it back (even lazily at module level)."""
    for path in Path(registry.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                assert not any(n.startswith(("lit_entropy.algo", "lit_entropy.module")) for n in names), path.name


@pytest.mark.parametrize("rule", [None, "clip_cov", "kl_cov", "clip_b", "clip_v", "forking"])
def test_what_the_module_asks(rule):
    algo = AlgoConfig(selection=rule)
    assert registry.needs_scores(algo) == (rule in ("clip_b", "clip_v"))
    assert registry.needs_current_logp(algo) == (rule in ("clip_cov", "kl_cov"))


def test_rule_arguments_come_from_the_signature():
    assert registry.SELECTION_RULES["clip_cov"].args == ("rho", "bound_low", "bound_high", "bounds", "min_count",
                                                         "rounding")
    assert registry.SELECTION_RULES["kl_cov"].args == ("k", "min_count", "beta")
    with pytest.raises(ValueError, match="algo.selection="):
        AlgoConfig(selection="clip_z")
    with pytest.raises(ValueError, match=r"algo.selection_args \['rho'\] are not arguments of forking"):
        AlgoConfig(selection="forking", selection_args={"rho": 1})


def test_a_rule_entry_is_checked_against_its_function():
    with pytest.raises(ValueError, match="RULE_INPUTS"):
        SelectionRule("bad", registry.SELECTION_RULES["forking"].fn, inputs={"entropy": "logits", "mask": "mask"})


def test_knobs_are_a_mapping_of_the_registered_knobs():
    knobs = Knobs(0.2, 0.28, kl_coef=0.1)
    assert dict(knobs) == {"eps_low": 0.2, "eps_high": 0.28, "gppo_beta_low": 1.0, "gppo_beta_high": 1.0,
                           "stare_top_frac": 0.0, "stare_w": 1.0, "stare_m": 1.0,
                           "pic_alpha": 0.0, "entropy_coef": 0.0, "kl_coef": 0.1}
    assert knobs.kl_coef == knobs["kl_coef"] == 0.1
    with pytest.raises(TypeError, match="unknown knobs"):
        Knobs(0.2, 0.2, entropy=0.1)
    module = SimpleNamespace(eps_low=0.1, eps_high=0.3, gppo_beta_low=0.5, gppo_beta_high=1.0, stare_top_frac=0.1,
                             stare_w=1.2, stare_m=1.0, entropy_coef=0.01,
                             kl_coef=0.0, pic_alpha=-0.5)
    assert dict(Knobs.read(module)) == vars(module)
    assert [t.name for t in registry.active_terms(Knobs.read(module))] == ["entropic", "entropy_bonus"]
    assert registry.needs_entropy_grad(Knobs.read(module))


def test_the_module_starts_with_every_knob_as_an_attribute():
    from lit_entropy.module import PolicyModule

    algo = AlgoConfig(eps_high=0.28, entropy_coef=0.01)
    module = PolicyModule(SimpleNamespace(model=torch.nn.Linear(2, 2), tokenizer=None, path="unused"), algo)
    assert (module.eps_low, module.eps_high, module.entropy_coef, module.kl_coef, module.pic_alpha) == (
        0.2, 0.28, 0.01, 0.0, 0.0)
    module.pic_alpha = 0.3  # what EntroPICCallback does
    assert module.knobs()["pic_alpha"] == 0.3


# ---- the worked examples of docs/objectives.md, verbatim ("Adding a selection rule / a loss term") ---------------


def low_prob_negatives(old_logp: Tensor, advantages: Tensor, mask: Tensor, p_min: float = 0.01) -> tuple[Tensor, Tensor]:
    """Drop negative-advantage tokens the pre-update policy gave probability below ``p_min``."""
    mask = check_mask(mask, old_logp)
    removed = mask & (per_token(advantages, mask) < 0) & (old_logp < math.log(p_min))
    return mask & ~removed, fraction(removed, int(mask.sum()))


def ratio_l2(t: TermInputs, coef: float) -> Tensor:
    """coef · aggregated (logp − old_logp)²: keeps the update near the sampler."""
    return coef * t.aggregate((t.logp - t.mb["old_logp"]).square())


def test_a_new_rule_is_a_function_and_an_entry(monkeypatch):
    rule = SelectionRule("low_prob", low_prob_negatives,
                         inputs={"old_logp": "old_logp", "advantages": "token_advantages", "mask": "mask"})
    monkeypatch.setitem(registry.SELECTION_RULES, "low_prob", rule)
    algo = AlgoConfig(selection="low_prob", selection_args={"p_min": 0.2})
    assert not registry.needs_scores(algo) and not registry.needs_current_logp(algo)
    with pytest.raises(ValueError, match="p_max"):
        AlgoConfig(selection="low_prob", selection_args={"p_max": 0.2})
    mb, _ = make_minibatch()
    sel = select_tokens(algo, mb, Knobs(0.2, 0.2))
    expected, frac = low_prob_negatives(mb["old_logp"], mb["token_advantages"], mb["response_mask"], 0.2)
    assert torch.equal(sel.loss_mask, expected) and 0 < sel.frac == float(frac)


def test_a_new_term_is_a_function_and_an_entry(monkeypatch):
    term = LossTerm("ratio_l2", "ratio_l2_coef", ratio_l2)
    monkeypatch.setitem(registry.LOSS_TERMS, "ratio_l2", term)
    monkeypatch.setattr(registry, "TERM_KNOBS", (*registry.TERM_KNOBS, "ratio_l2_coef"))
    monkeypatch.setattr(registry, "KNOBS", (*registry.KNOBS, "ratio_l2_coef"))
    algo = AlgoConfig(term_coefs={"ratio_l2_coef": 0.5})
    assert registry.initial_knobs(algo)["ratio_l2_coef"] == 0.5
    with pytest.raises(ValueError, match="algo.term_coefs"):
        AlgoConfig(term_coefs={"entropy_coef": 0.5})  # has its own key
    mb, model = make_minibatch()
    logp, ent = logp_entropy(model, mb["input_ids"])
    off, on = Knobs(0.2, 0.2), Knobs(0.2, 0.2, ratio_l2_coef=0.5)
    sel = select_tokens(algo, mb, on)
    base, _ = micro_batch_loss(algo, off, mb, sel, logp, ent)
    loss, _ = micro_batch_loss(algo, on, mb, sel, logp, ent)
    mask = mb["response_mask"]
    penalty = 0.5 * aggregate((logp - mb["old_logp"]).square(), mask, "token-mean", num_tokens=mask.sum())
    assert torch.equal(loss, base + penalty)
