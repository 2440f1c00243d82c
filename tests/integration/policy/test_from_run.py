"""A training checkpoint's policy weights (lit_entropy.policy.from_run): loaded exactly, a mismatched one refused.
The evaluation of a checkpoint from its run's config: tests/integration/test_evaluation_run.py."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.policy.from_run import load_checkpoint_weights
from lit_entropy.policy.models import TinyLabPolicy, WarmStart
from tests.integration.test_evaluation_run import CACHE, WARM_STEPS, write_checkpoint

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lab_policy():
    """The smoke-test warm start of test_evaluation_run.py (the same cache entry: built once)."""
    return TinyLabPolicy(cache_dir=str(CACHE), warmstart=WarmStart(steps=WARM_STEPS)).build()


def test_checkpoint_weights_load_exactly(tmp_path, lab_policy):
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=False)
    fresh = TinyLabPolicy(cache_dir=str(tmp_path / "c"), warmstart=WarmStart(steps=0)).build().model
    load_checkpoint_weights(fresh, ckpt)
    for (name, a), b in zip(lab_policy.model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {"model.nope.weight": torch.zeros(1)}}, bad)
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint_weights(fresh, bad)
