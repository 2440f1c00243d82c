"""The loss terms (lit_entropy.objectives.terms, one file per term): a term that is on names itself when a tensor
it needs is missing. Adding a term (the worked example of docs/objectives.md) and the knobs: test_registry.py."""

from __future__ import annotations

import pytest

from lit_entropy.algo import AlgoConfig
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from tests.unit.objectives.test_objective import logp_entropy, make_minibatch


def test_a_term_missing_its_tensor_names_itself():
    mb, model = make_minibatch()
    del mb["ref_logp"]
    algo, knobs = AlgoConfig(), Knobs(0.2, 0.2, kl_coef=0.1)
    logp, ent = logp_entropy(model, mb["input_ids"])
    with pytest.raises(ValueError, match="kl_penalty.*reference"):
        micro_batch_loss(algo, knobs, mb, select_tokens(algo, mb, knobs), logp, ent)
