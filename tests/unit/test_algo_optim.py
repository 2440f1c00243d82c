"""The `algo` and `optim` groups' config objects: the optimizer is a ``_partial_`` target, AdamW by default, with the
old keys' meaning; a clip range the loss never reads is named at start-up."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hydra.utils import instantiate

from lit_entropy.algo import OptimConfig, build_optimizer, unread_clip_advice
from lit_entropy.module import PolicyModule
from tests.helpers import compose_train

OUT = ["paths.output_dir=/tmp/lit-entropy-test-out"]


def params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.arange(4.0))]


def groups(opt: torch.optim.Optimizer) -> dict:
    return {k: v for k, v in opt.param_groups[0].items() if k != "params"}


def test_default_is_the_adamw_the_module_built_before():
    old = torch.optim.AdamW(params(), lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    cfg = compose_train(["optim.lr=3e-4", "optim.betas=[0.8,0.95]", "optim.eps=1e-6", "optim.weight_decay=0.1", *OUT])
    for optim in (instantiate(cfg.optim), OptimConfig(lr=3e-4, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)):
        new = optim.build(params())
        assert type(new) is torch.optim.AdamW and groups(new) == groups(old)
        new.load_state_dict(old.state_dict())  # an earlier checkpoint's optimizer state loads


def test_the_module_builds_it_from_what_hydra_hands_over():
    """``instantiate(cfg.module, optim=...)`` turns the dataclass into a DictConfig: the module builds from that."""
    optim = instantiate(compose_train(["optim.lr=3e-4", *OUT]).optim)
    handed = instantiate({"_target_": "builtins.dict"}, optim=optim, _recursive_=False)["optim"]
    assert not isinstance(handed, OptimConfig)
    assert groups(build_optimizer(handed, params())) == groups(optim.build(params()))
    default = PolicyModule.configure_optimizers(SimpleNamespace(optim_cfg=OptimConfig(), parameters=params))
    assert type(default["optimizer"]) is torch.optim.AdamW


def test_sgd_is_one_option():
    optim = instantiate(compose_train(["optim=sgd", "optim.lr=0.05", "optim.optimizer.momentum=0.5", *OUT]).optim)
    opt = optim.build(params())
    assert type(opt) is torch.optim.SGD and opt.param_groups[0]["lr"] == 0.05
    assert opt.param_groups[0]["momentum"] == 0.5 and optim.max_grad_norm == 1.0


@pytest.mark.parametrize(("override", "key"), [("+optim.optimizer.foo=1", "optim.optimizer.foo"),
                                               ("+optim.optimizer.lr=1", "optim.optimizer.lr"),
                                               ("optim.lr=0", "optim.lr")])
def test_a_wrong_key_fails_at_start_up_naming_itself(override, key):
    with pytest.raises(Exception, match=key.replace(".", r"\.")):
        instantiate(compose_train([override, *OUT]).optim)


def test_a_clip_knob_the_objective_never_reads_is_named_at_start_up():
    """``algo=kl_cov algo.eps_high=0.28`` (DAPO's clip-higher meant beside KL-Cov) changes nothing, nor does a clip
    knob beside a loss that reads it not: named here, logged as a warning by ``train.build``."""
    algo = lambda *o: instantiate(compose_train([*o, *OUT]).algo)  # noqa: E731
    for quiet in (["algo=kl_cov"], ["algo=dapo"], ["algo=cispo"], ["algo=sapo"], ["algo=topr"], ["algo=gspo"],
                  ["algo=dppo_tv", "algo.eps_low=0.1"], ["algo=cispo", "algo.eps_high=2.0"]):
        assert unread_clip_advice(algo(*quiet)) is None, quiet  # defaults, or knobs the loss reads
    advice = unread_clip_advice(algo("algo=kl_cov", "algo.eps_high=0.28"))
    assert advice is not None and advice.startswith("algo.eps_high=0.28 is not read: algo.selection=kl_cov")
    both = unread_clip_advice(algo("algo=kl_cov", "algo.eps_high=0.28", "algo.eps_low=0.1"))
    assert both is not None and both.startswith("algo.eps_low=0.1 and algo.eps_high=0.28 are not read")
    assert unread_clip_advice(algo("algo=cispo", "algo.eps_low=0.1")) == (
        "algo.eps_low=0.1 is not read: algo.loss=cispo reads algo.eps_high")
    for loss in ("sapo", "topr"):
        assert unread_clip_advice(algo(f"algo={loss}", "algo.eps_high=0.28")) == (
            f"algo.eps_high=0.28 is not read: algo.loss={loss} reads no clip knob")
