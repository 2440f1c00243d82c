"""A real Hugging Face-format model end to end: trained BPE tokenizer, chat template, GSM8K, vLLM and HF
(the runs in-process on tests/harness.py; the tiny model is written by scripts/make_tiny_hf.py, a process)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from lit_entropy.tasks.math_sources import default_data_dir
from tests.helpers import ROOT

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    if not (default_data_dir() / "gsm8k_train.jsonl").exists():
        pytest.skip(f"gsm8k_train.jsonl is not in {default_data_dir()}; set LIT_ENTROPY_DATA to its folder")
    out = tmp_path_factory.mktemp("tiny_hf")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_hf.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_tiny_hf_tokenizer_has_a_working_chat_template(tiny_hf):
    from transformers import AutoTokenizer

    from lit_entropy.policy.models import HFTokenizerAdapter

    tok = HFTokenizerAdapter(AutoTokenizer.from_pretrained(str(tiny_hf)))
    assert tok.has_chat_template
    ids = tok.encode_chat("How many eggs?", system="Be brief.")
    text = tok.decode(ids, skip_special=False)
    assert text == "<|system|>\nBe brief.<|end|>\n<|user|>\nHow many eggs?<|end|>\n<|assistant|>\n"
    assert tok.eos_id == tok.hf.convert_tokens_to_ids("<|end|>")


@pytest.mark.parametrize("engine", ["vllm", pytest.param("hf", marks=pytest.mark.slow)])
def test_hf_model_runs_gsm8k_with_chat_template(tmp_path, harness, tiny_hf, engine):
    overrides = ["model=hf", f"model.name_or_path={tiny_hf}", "data=gsm8k", f"rollout={engine}",
                 "data.chat_template=true", "data.system_prompt='Be brief.'", "batch.prompts_per_iter=4",
                 "batch.group_size=2", "rollout.max_new_tokens=16", "reward.workers=1", "reward.overlong_buffer=4",
                 "rollout.stop=['####']", "trainer.max_epochs=2", "callbacks/entropy=none", "callbacks/law=none",
                 "batch.micro_batch_size=8"]
    if engine == "vllm":
        overrides.append("rollout.engine.show_progress=false")
    scalars = harness.fit(overrides, tmp_path, smoke=False).scalars
    for tag in ("rollout/entropy", "rollout/reward_mean", "rollout/response_len_mean", "train/loss",
                "diag/logp_mismatch_max"):
        assert len(scalars[tag]) >= 2 and all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= 1e-3
    # Random weights ramble to the cap: the soft overlong punishment makes rewards negative.
    assert min(v for _, v in scalars["rollout/reward_mean"]) < 0
