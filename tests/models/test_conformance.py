"""Every model family computes the trainer's numbers on both forward paths, samples what it trains on, and
takes LoRA with its defaults; a path that would be wrong for a family is refused instead.

Each family's check is one test. By default each check runs on the families that take a distinct path
through the code under test (the sliding-window refusal and the exact shared path below the window on
Mistral; LoRA on GPT-2's Conv1D and on Qwen3-MoE's wrapped expert parameters); the lab's Qwen2 is covered
by tests/unit/policy/test_prefix.py and tests/unit/policy/test_lora.py. The whole matrix is ``slow``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from lit_entropy.policy import model_support, prefix
from lit_entropy.policy.lora import LoRAConfig, apply_lora, merged_state_items
from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.hf_engine import HFEngine
from tests.models import trainer_paths as tp
from tests.models.families import FAMILIES, SLIDING, VOCAB, WINDOW, grouped_rows, sample_prompts, tiny_model

TOL = 1e-5


def families(*fast: str) -> list:
    return [f if f in fast else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("family", families("mistral"))
def test_trainer_paths_equal_each_row_alone(family):
    model = tiny_model(family)
    long_rows, short_rows = grouped_rows(), grouped_rows((2, 3, 5), 3)
    assert model_support.longest_row(tp.layout_of(long_rows)) > WINDOW >= model_support.longest_row(
        tp.layout_of(short_rows))
    for rows in (long_rows, short_rows):
        mask = rows["response_mask"]
        ref_logp, ref_ent = tp.unpadded(model, rows)
        ref_grad = tp.gradient(model, tp.policy_loss(ref_logp, rows))
        logp, ent = tp.whole_rows(model, rows)
        assert tp.max_diff(logp, ref_logp, mask) <= TOL and tp.max_diff(ent, ref_ent, mask) <= TOL
        assert relative(tp.gradient(model, tp.policy_loss(logp, rows)), ref_grad) <= TOL

        exact, reason = model_support.shared_prompts_exact(model, model_support.longest_row(tp.layout_of(rows)))
        if not exact:  # refused: only sliding-window families, only on rows longer than the window
            assert family in SLIDING and rows is long_rows
            assert family.split("_")[0] in reason and f"window of {WINDOW} tokens" in reason
            continue
        logp, ent = tp.shared_prompts(model, rows)
        assert tp.max_diff(logp, ref_logp, mask) <= TOL and tp.max_diff(ent, ref_ent, mask) <= TOL
        assert relative(tp.gradient(model, tp.policy_loss(logp, rows)), ref_grad) <= TOL


@pytest.mark.parametrize("family", families("qwen3", "gpt2"))
def test_the_package_passes_with_compiled_kernels_and_a_token_budget_equal_each_row_alone(family):
    """The passes a run takes (:mod:`lit_entropy.policy.passes`): the compiled vocabulary kernels and token-budget
    micro-batches, whole rows and shared prompts, values and the update's gradient, against each row alone."""
    model = tiny_model(family)
    rows = grouped_rows((2, 3, 5), 3)  # within every window: shared prompts are exact on every family
    mask = rows["response_mask"]
    ref_logp, ref_ent = tp.unpadded(model, rows)
    ref_grad = tp.gradient(model, tp.policy_loss(ref_logp, rows))
    for share in (False, True):
        logp, ent, grad = tp.package_passes(model, rows, share, kernels="compiled", tokens=12)
        assert tp.max_diff(logp, ref_logp, mask) <= TOL and tp.max_diff(ent, ref_ent, mask) <= TOL
        assert relative(grad, ref_grad) <= TOL


def sampled_vs_trainer(model, prompts: list[list[int]], max_new_tokens: int) -> tuple[float, int]:
    """Largest |sampler − trainer| log-prob of HF-engine samples, and how often the shared prefill ran."""
    engine = HFEngine("", eos_id=2, pad_id=0, share_prefill=True)
    engine.sync_weights(model)
    calls = []
    prefill = engine._shared_prefill
    engine._shared_prefill = lambda *a: calls.append(1) or prefill(*a)
    gens = engine.generate(prompts, n=3, sampling=SamplingConfig(temperature=tp.TEMPERATURE,
                                                                max_new_tokens=max_new_tokens), seed=5)
    return tp.sampler_mismatch(model, prompts, gens), len(calls)


@pytest.mark.parametrize("family", families("mistral"))
def test_hf_engine_samples_with_the_trainers_logprobs(family):
    """Fails without the window check for sliding-window families: the shared prefill's cache drops keys
    that the trainer's whole row keeps (0.3–0.4 nats on Mistral, Gemma 2, Gemma 3)."""
    model = tiny_model(family)
    long_prompts = sample_prompts()
    worst, prefills = sampled_vs_trainer(model, long_prompts, max_new_tokens=8)
    assert worst <= TOL
    assert prefills == (0 if family in SLIDING else 1)  # shared prefill refused where a window is shorter
    if family in SLIDING:  # rows within the window keep the shared prefill, exactly
        short_prompts = [p[:n] for p, n in zip(long_prompts, (2, 3, 4), strict=True)]
        worst, prefills = sampled_vs_trainer(model, short_prompts, max_new_tokens=WINDOW - 4)
        assert worst <= TOL and prefills == 1


@pytest.mark.parametrize("family", families("gpt2", "qwen3_moe"))
def test_lora_defaults_build_and_merge_like_peft(family):
    model = apply_lora(tiny_model(family), LoRAConfig(r=4, alpha=8))
    adapted = [n for n, _ in model.named_parameters() if "lora_A" in n]
    assert adapted, "no adapters with the default target_modules"
    ids = torch.randint(3, VOCAB, (2, 9), device=tp.device_of(model))
    with torch.no_grad():
        fresh = model(input_ids=ids).logits
        with model.disable_adapter():
            assert torch.equal(model(input_ids=ids).logits, fresh)  # B = 0: adapters change nothing yet
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
        plain = tiny_model(family)
        with model.disable_adapter():  # the KL reference (adapters off) is the base model
            assert torch.allclose(model(input_ids=ids).logits, plain(input_ids=ids).logits, atol=1e-6)
    ours = dict(merged_state_items(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert list(ours) == list(reference) == list(plain.state_dict())
    for name, tensor in reference.items():
        assert torch.allclose(ours[name], tensor, atol=1e-6), name
    plain.load_state_dict(ours)
    with torch.no_grad():
        assert torch.allclose(plain(input_ids=ids).logits, model(input_ids=ids).logits, atol=1e-5)


def test_lora_default_targets_are_the_former_list_on_llama_style_models():
    """``all-linear`` adapts exactly the layers the explicit Llama-style list did, with the same init."""
    former = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    torch.manual_seed(0)
    old = apply_lora(tiny_model("qwen2_tied"), LoRAConfig(target_modules=former)).state_dict()
    torch.manual_seed(0)
    new = apply_lora(tiny_model("qwen2_tied"), LoRAConfig()).state_dict()
    assert list(old) == list(new) and all(torch.equal(old[k], new[k]) for k in old)


def test_prompt_layout_of_the_suite_rows_is_shareable():
    layout = prefix.prompt_layout(**{k: v for k, v in grouped_rows().items()})
    assert layout is not None and layout.worthwhile()
