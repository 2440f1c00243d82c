"""``module.pre_update_pass=skip`` (verl's bypass mode): no pass before the update; the first minibatch's forward
measures what the pass measured, exactly, and every setting that reads the pass before the update is refused by
name. The runs through the real Trainer are in tests/integration/test_train_smoke.py."""

from __future__ import annotations

import copy

import pytest
import torch

from lit_entropy.algo import AlgoConfig
from lit_entropy.iteration import first_pass_metrics, hook_refusals, prepare_update, skip_refusals
from lit_entropy.module import PolicyModule
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.policy.models import PolicyBundle, TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.rollout.batch import BatchConfig
from tests.unit.test_iteration_correction import make_rollout, preset

BYPASS = CorrectionConfig(name="bypass", bypass=True)


def make_module(pre_update_pass: str, minibatches: int = 1, algo: AlgoConfig | None = None,
                correction: CorrectionConfig = BYPASS, **kw) -> PolicyModule:
    tok = CharTokenizer.for_countdown()
    arch = TinyArch(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=32)
    model = build_tiny_qwen2(tok.vocab_size, arch, tok, seed=3)
    batch = BatchConfig(prompts_per_iter=3, group_size=4, num_minibatches=minibatches, micro_batch_size=4)
    return PolicyModule(PolicyBundle(model, tok, ""), algo=algo or preset("algo", "grpo"), batch=batch,
                        correction=correction, pre_update_pass=pre_update_pass, **kw)


def steps(module: PolicyModule, batch, minibatches: int) -> tuple[list[float], dict[str, float], list, list]:
    """``training_step`` on each minibatch with a real AdamW step (no Trainer): the losses, what was logged, the
    minibatches and a copy of the policy before each step."""
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module.optimizers = lambda: opt
    module.lr_schedulers = lambda: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    module.manual_backward = lambda loss: loss.backward()
    logged: dict[str, float] = {}
    module.log_dict = lambda metrics, **k: logged.update({key: float(v) for key, v in metrics.items()})
    module.log = lambda *a, **k: None
    gen = torch.Generator().manual_seed(0)
    parts, before, losses = batch.minibatches(minibatches, generator=gen), [], []
    for i, mb in enumerate(parts):
        before.append(copy.deepcopy(module.model))
        losses.append(float(module.training_step(mb, i)))
    return losses, logged, parts, before


@pytest.mark.parametrize("minibatches", [1, 2])
def test_skip_measures_the_pass_values_in_the_first_step_and_trains_identically(minibatches):
    runs = {}
    for mode in ("run", "skip"):
        module = make_module(mode, minibatches)
        batch = make_rollout(module, noise=0.3)
        prepare_update(module, batch)
        runs[mode] = (batch, *steps(module, batch, minibatches), [p.detach().clone() for p in module.parameters()])
    (ran, ran_losses, _, _, _, ran_params) = runs["run"]
    (skipped, skip_losses, logged, _, _, skip_params) = runs["skip"]
    assert skipped.entropy is None and ran.entropy is not None
    assert torch.equal(skipped.old_logp, ran.old_logp)  # bypass: the sampler's log-probs either way
    assert not any(k.startswith("rollout_corr/") for k in skipped.metrics)  # weights 1 by construction, not measured
    # The same loss and the same weights after every optimizer step.
    assert skip_losses == pytest.approx(ran_losses, abs=1e-6)
    for a, b in zip(ran_params, skip_params, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    # diag/logp_mismatch_*: the first minibatch's rows under the initial policy; rollout/entropy: every row, under
    # the policy its own minibatch's step started from (with one minibatch, the initial one).
    parts, before = runs["skip"][3], runs["skip"][4]
    probe = make_module("run")
    measured = []
    for part, model in zip(parts, before, strict=True):
        with torch.no_grad():
            measured.append(probe.token_stats(part["input_ids"], part["attention_mask"], model=model))
    first = first_pass_metrics(measured[0][1], measured[0][0], parts[0]["sampler_logp"], parts[0]["response_mask"])
    assert logged["diag/logp_mismatch_mean"] == pytest.approx(first["diag/logp_mismatch_mean"], abs=1e-6)
    assert logged["diag/logp_mismatch_max"] == pytest.approx(first["diag/logp_mismatch_max"], abs=1e-5)
    ent = sum(float((e * p["response_mask"]).sum()) for (_, e), p in zip(measured, parts, strict=True))
    n = sum(float(p["response_mask"].sum()) for p in parts)
    assert logged["rollout/entropy"] == pytest.approx(ent / n, abs=1e-6)
    if minibatches == 1:  # every row: the values of the skipped pass itself
        assert logged["rollout/entropy"] == pytest.approx(ran.metrics["rollout/entropy"], abs=1e-6)
        assert logged["diag/logp_mismatch_mean"] == pytest.approx(ran.metrics["diag/logp_mismatch_mean"], abs=1e-6)


def test_skip_refuses_each_reader_of_the_pass_by_name():
    grpo = preset("algo", "grpo")
    assert skip_refusals(grpo, BYPASS, [], replays=False) == []
    cases = {
        "correction=none": (grpo, CorrectionConfig(), [], False),
        "correction.reject": (grpo, CorrectionConfig(name="bypass", bypass=True, reject="k3_mean",
                                                     reject_threshold=1.0), [], False),
        "correction.opsm_delta": (grpo, CorrectionConfig(name="bypass", bypass=True, opsm_delta=1e-4), [], False),
        "algo.selection=forking": (preset("algo", "forking"), BYPASS, [], False),
        "algo.selection=clip_b": (preset("algo", "clip_b"), BYPASS, [], False),
        "algo.archer": (grpo, BYPASS, ["archer"], False),
        "algo.token_shaping": (preset("algo", "gtpo"), BYPASS, [], False),
        "rollout.top_p": (grpo, BYPASS, [], True),
    }
    for name, (algo, correction, changes, replays) in cases.items():
        assert any(name in r for r in skip_refusals(algo, correction, changes, replays)), name
    # A rule that reads only the current policy (KL-Cov, Clip-Cov) is fine.
    assert skip_refusals(preset("algo", "kl_cov"), BYPASS, [], False) == []
    with pytest.raises(ValueError, match="correction=none .*correction=bypass"):
        make_module("skip", correction=CorrectionConfig())
    with pytest.raises(ValueError, match="rollout.top_p"):
        make_module("skip", top_p=0.9)
    with pytest.raises(ValueError, match="module.pre_update_pass='sometimes'"):
        make_module("sometimes")


def test_skip_refuses_the_callbacks_that_read_the_batch_before_the_update():
    class Controller:
        def on_rollout_batch(self, trainer, module, batch): ...

    class Checkpoint:
        def on_rollout_start(self, trainer, module): ...

    assert hook_refusals([Controller(), Checkpoint()]) == ["Controller"]


def test_skip_runs_the_divergence_checks_before_the_first_optimizer_step():
    module = make_module("skip", 2, max_logp_mismatch_mean=0.05)  # the sampler is 0.3 nats off (make_rollout)
    batch = make_rollout(module, noise=0.3)
    prepare_update(module, batch)
    params = [p.detach().clone() for p in module.parameters()]
    with pytest.raises(RuntimeError, match="diag/logp_mismatch_mean=0.2.* > module.max_logp_mismatch_mean=0.05"):
        steps(module, batch, 2)
    assert all(torch.equal(a, b) for a, b in zip(params, module.parameters(), strict=True))
