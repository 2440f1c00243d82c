"""The corrections in training: every objective preset × every correction preset takes real optimizer steps on
the lab's tiny model (no engine: a built rollout batch whose sampler log-probs disagree with the trainer's),
the overlong filter, bypass, and what the objective does with the weights and the kept tokens."""

from __future__ import annotations

import functools
import math

import pytest
import torch
from hydra.utils import instantiate

from lit_entropy.data.rollout_datamodule import build_batch
from lit_entropy.iteration import prepare_update
from lit_entropy.module import PolicyModule
from lit_entropy.objectives.objective import Knobs, micro_batch_loss, select_tokens
from lit_entropy.objectives.rollout_correction import CorrectionConfig
from lit_entropy.policy.models import PolicyBundle, TinyArch, build_tiny_qwen2
from lit_entropy.policy.tokenizer import CharTokenizer
from lit_entropy.rollout.base import Generation
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from tests.helpers import CONF, compose_train

ALGOS = sorted(p.stem for p in (CONF / "algo").glob("*.yaml"))
CORRECTIONS = sorted(p.stem for p in (CONF / "correction").glob("*.yaml"))
G, PROMPTS, MAX_NEW = 4, 3, 6


@functools.cache
def preset(group: str, name: str):
    return instantiate(compose_train([f"{group}={name}", "paths.output_dir=/tmp/lit-entropy-test-out"])[group])


def make_module(algo, correction: CorrectionConfig, **batch_kw) -> PolicyModule:
    tok = CharTokenizer.for_countdown()
    arch = TinyArch(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=32)
    model = build_tiny_qwen2(tok.vocab_size, arch, tok, seed=3)
    batch = BatchConfig(prompts_per_iter=PROMPTS, group_size=G, num_minibatches=2, micro_batch_size=4, **batch_kw)
    return PolicyModule(PolicyBundle(model, tok, ""), algo=algo, batch=batch, correction=correction)


def make_rollout(module: PolicyModule, noise: float = 0.3, seed: int = 0) -> RolloutBatch:
    """G completions of 2..MAX_NEW tokens for each prompt (the longest truncated), mixed rewards, and sampler
    log-probs = the trainer's + Gaussian noise of std ``noise`` (a sampler that disagrees)."""
    tok = module.tokenizer
    g = torch.Generator().manual_seed(seed)
    prompts = [tok.encode(p, add_bos=True) for p in ("3,5,2=16:", "1,2,3=6:", "4,4=8:")]
    gens, rewards = [], []
    for _ in prompts:
        per = []
        for _ in range(G):
            n = int(torch.randint(2, MAX_NEW + 1, (1,), generator=g))
            ids = torch.randint(4, tok.vocab_size, (n,), generator=g).tolist()
            per.append(Generation(token_ids=ids, logprobs=[0.0] * n, truncated=n == MAX_NEW))
        gens.append(per)
        rewards += [1.0, 0.0] + torch.randint(0, 2, (G - 2,), generator=g).float().tolist()
    batch = build_batch(prompts, gens, rewards, G, pad_id=tok.pad_id)
    with torch.no_grad():
        logp, _ = module.token_stats(batch.input_ids, batch.attention_mask, with_entropy=False)
    batch.sampler_logp = torch.where(batch.response_mask, logp + noise * torch.randn(logp.shape, generator=g), 0.0)
    return batch


def take_steps(module: PolicyModule, batch: RolloutBatch) -> list[float]:
    """``training_step`` on each minibatch with a real AdamW step (no Trainer)."""
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    module.optimizers = lambda: opt
    module.lr_schedulers = lambda: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    module.manual_backward = lambda loss: loss.backward()
    module.log_dict = module.log = lambda *a, **k: None
    gen = torch.Generator().manual_seed(0)
    return [float(module.training_step(mb, i)) for i, mb in enumerate(batch.minibatches(2, generator=gen))]


PAIRS = [(a, CORRECTIONS[i % len(CORRECTIONS)]) for i, a in enumerate(ALGOS)]  # each preset of both groups


@pytest.mark.parametrize(("algo", "correction"), PAIRS)
def test_objective_presets_compose_with_corrections(algo, correction):
    check_steps(algo, correction)


@pytest.mark.slow  # the whole product: about 100 cases, minutes on a shared CPU
@pytest.mark.parametrize("correction", CORRECTIONS)
@pytest.mark.parametrize("algo", ALGOS)
def test_every_objective_preset_composes_with_every_correction(algo, correction):
    check_steps(algo, correction)


def check_steps(algo: str, correction: str) -> None:
    module = make_module(preset("algo", algo), preset("correction", correction))
    before = [p.detach().clone() for p in module.parameters()]
    batch = make_rollout(module)
    prepare_update(module, batch)
    assert all(math.isfinite(v) for k, v in batch.metrics.items() if k.startswith("rollout_corr/"))
    losses = take_steps(module, batch)
    assert losses and all(math.isfinite(v) for v in losses), (algo, correction)
    assert any(not torch.equal(a, b) for a, b in zip(before, module.parameters(), strict=True))


def test_default_leaves_the_batch_as_it_was():
    module = make_module(preset("algo", "grpo"), CorrectionConfig())
    batch = make_rollout(module)
    prepare_update(module, batch)
    assert batch.is_weight is None and batch.loss_mask is None  # the loss reads exactly what it read before
    assert "rollout_corr/kl" in batch.metrics and "rollout/masked_truncated" not in batch.metrics


def test_bypass_uses_the_sampler_log_probs_as_old_policy():
    module = make_module(preset("algo", "grpo"), preset("correction", "bypass"))
    batch = make_rollout(module)
    prepare_update(module, batch)
    resp = batch.response_mask
    assert torch.equal(batch.old_logp[resp], batch.sampler_logp[resp])
    assert batch.metrics["rollout_corr/kl"] != 0  # the diagnostics still measure the trainer's pass
    assert batch.entropy is not None and batch.metrics["diag/logp_mismatch_mean"] > 0.1


def test_truncated_completions_leave_the_loss_and_are_counted():
    module = make_module(preset("algo", "grpo"), CorrectionConfig(), mask_truncated_completions=True)
    batch = make_rollout(module)
    prepare_update(module, batch)
    assert batch.truncated.any() and not batch.truncated.all()
    assert not batch.loss_mask[batch.truncated].any()
    assert torch.equal(batch.loss_mask[~batch.truncated], batch.response_mask[~batch.truncated])
    assert batch.metrics["rollout/masked_truncated"] == float(batch.truncated.sum())
    mb = batch.select(torch.arange(batch.batch_size))
    sel = select_tokens(module.algo, mb, module.knobs())
    assert int(sel.num_tokens) == int(batch.response_mask[~batch.truncated].sum())


def test_weights_multiply_the_surrogate_and_masked_tokens_leave_the_counts():
    module = make_module(preset("algo", "grpo"), CorrectionConfig())
    batch = make_rollout(module)
    prepare_update(module, batch)
    mb = batch.select(torch.arange(batch.batch_size))
    knobs = Knobs(0.2, 0.2)
    logp = mb["old_logp"].clone().requires_grad_(True)
    plain, _ = micro_batch_loss(module.algo, knobs, mb, select_tokens(module.algo, mb, knobs), logp, None)
    doubled = {**mb, "is_weight": torch.full_like(mb["old_logp"], 2.0)}
    loss, _ = micro_batch_loss(module.algo, knobs, doubled, select_tokens(module.algo, doubled, knobs), logp, None)
    assert torch.allclose(loss, 2 * plain)
    keep = mb["response_mask"].clone()
    keep[0] = False
    sel = select_tokens(module.algo, {**mb, "loss_mask": keep}, knobs)
    assert int(sel.num_tokens) == int(mb["response_mask"][1:].sum())


def test_bias_corrected_kl_changes_the_gradient_not_the_first_value():
    from lit_entropy.algo import AlgoConfig

    module = make_module(AlgoConfig(kl_coef=0.5), CorrectionConfig())
    batch = make_rollout(module)
    prepare_update(module, batch)
    mb = batch.select(torch.arange(batch.batch_size))
    mb["ref_logp"] = mb["old_logp"] - 0.3
    knobs = Knobs(0.2, 0.2, kl_coef=0.5)
    sel = select_tokens(module.algo, mb, knobs)
    out = []
    for flag in (False, True):
        logp = mb["old_logp"].clone().requires_grad_(True)
        loss, _ = micro_batch_loss(module.algo, knobs, mb, sel, logp, None, kl_bias_correction=flag)
        loss.backward()
        out.append((float(loss.detach()), logp.grad))
    assert out[0][0] == pytest.approx(out[1][0])  # π_θ = π_old: the ratio is 1
    assert not torch.allclose(out[0][1], out[1][1])  # but it carries a gradient
