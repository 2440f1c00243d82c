"""scripts/evaluate.py and lit_entropy.evaluation: sampling, isolated scoring, accuracy / mean@k / pass@k."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.data.prompts import Prompt
from lit_entropy.evaluation import evaluate
from lit_entropy.metrics import pass_at_k
from lit_entropy.models import PolicyBundle, TinyLabPolicy, WarmStart
from lit_entropy.rollout.base import Generation, RolloutEngine
from lit_entropy.tasks.math_answers import math_reward
from tests.helpers import ROOT, compose_train

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "evaluate.py"
CACHE = Path(os.environ.get("LIT_ENTROPY_CACHE", ROOT / ".cache" / "lit_entropy"))
WARM_STEPS = 20  # the smoke-test warm start: quick to build, shared cache entry
FAST = ["--warmstart-steps", str(WARM_STEPS), "--cache-dir", str(CACHE), "--reward-workers", "1", "--quiet"]


def load_script():
    spec = importlib.util.spec_from_file_location("evaluate_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_result(res: dict, problems: int, n: int, ks: list[int]) -> None:
    assert res["num_problems"] == problems and res["num_samples"] == problems * n and res["ks"] == ks
    per = res["per_problem"]
    assert len(per) == problems and all(p["num_samples"] == n for p in per)
    correct = [p["num_correct"] for p in per]
    assert all(0 <= c <= n for c in correct)
    assert res["eval/accuracy"] == pytest.approx(sum(correct) / (problems * n))
    for k in ks:
        assert res[f"eval/mean@{k}"] == pytest.approx(sum(c / n for c in correct) / problems)
        assert res[f"eval/pass@{k}"] == pytest.approx(sum(pass_at_k(n, c, k) for c in correct) / problems)
        assert 0.0 <= res[f"eval/pass@{k}"] <= 1.0
    assert res["reward_failures"] == 0


# ------------------------------------------------------------------------------- evaluate(), scripted


class ByteTok:
    eos_id, pad_id, bos_id = 0, 0, None

    def encode(self, text, add_bos=False):
        return [b + 1 for b in text.encode()]

    def decode(self, ids, skip_special=True):
        return bytes(i - 1 for i in ids if i > 0).decode()


class ScriptedEngine(RolloutEngine):
    """Problem i gets correct answers in its first `correct[i]` samples (answers are in the prompt)."""

    def __init__(self, correct):
        self.correct, self.synced, self.closed = correct, None, False

    def sync_weights(self, model):
        self.synced = model

    def generate(self, prompts, n, sampling, seed):
        tok = ByteTok()
        out = []
        for ids in prompts:
            text = tok.decode(ids)
            index, answer = (int(x) for x in text.split(":"))
            per = []
            for j in range(n):
                completion = f"so \\boxed{{{answer if j < self.correct[index] else answer + 1}}}"
                per.append(Generation(tok.encode(completion) + [0], [0.0] * (len(completion) + 1), False))
            out.append(per)
        return out

    def close(self):
        self.closed = True


def test_evaluate_counts_and_metrics_with_a_scripted_engine():
    correct = [0, 1, 3, 5, 5, 2]
    prompts = [Prompt(f"{i}:{10 * i}", reference=str(10 * i)) for i in range(len(correct))]
    engine = ScriptedEngine(correct)
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")
    res = evaluate(bundle, prompts, math_reward, engine, n=5, ks=[5, 1, 2], temperature=1.0, max_new_tokens=32,
                   seed=0, reward_workers=1, prompts_per_chunk=4)
    assert engine.synced is bundle.model and not engine.closed  # a given engine is the caller's to close
    assert [p["num_correct"] for p in res["per_problem"]] == correct
    check_result(res, problems=6, n=5, ks=[1, 2, 5])
    assert res["eval/pass@5"] == pytest.approx(5 / 6)
    assert res["per_problem"][3]["completions"] == ["so \\boxed{30}"]
    json.dumps(res)
    # a factory is built from the bundle and closed afterwards
    built = []

    def factory(**kwargs):
        built.append(kwargs)
        return ScriptedEngine(correct)

    evaluate(bundle, prompts[:2], math_reward, factory, n=2, ks=[1], reward_mode="inline")
    assert built and built[0]["model_path"] == "unused" and built[0]["eos_id"] == 0
    with pytest.raises(ValueError, match="k"):
        evaluate(bundle, prompts, math_reward, engine, n=2, ks=[4])


# ------------------------------------------------------------------------------- the script


def test_cli_on_the_lab_policy_writes_json(tmp_path):
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(SCRIPT), "--data", "countdown", "--limit", "8", "-n", "4", "--k", "1,4",
           "--engine", "hf", "--out", str(out), *FAST]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eval/pass@4" in proc.stdout and "eval/mean@1" in proc.stdout  # the printed table
    res = json.loads(out.read_text())
    check_result(res, problems=8, n=4, ks=[1, 4])
    assert res["config"]["engine"] == "hf" and "lab policy" in res["config"]["policy"]
    assert all("=" in p["prompt"] and p["prompt"].endswith(":") for p in res["per_problem"])


@pytest.fixture(scope="module")
def lab_policy():
    return TinyLabPolicy(cache_dir=str(CACHE), warmstart=WarmStart(steps=WARM_STEPS)).build()


def write_checkpoint(model: torch.nn.Module, run_dir: Path, with_config: bool) -> Path:
    """A Lightning-style checkpoint of a PolicyModule: state dict keys `model.<hf key>` (lm_head tied)."""
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    torch.save({"epoch": 3, "global_step": 6, "state_dict": state}, ckpt)
    if with_config:
        cfg = compose_train(["debug=smoke", "paths.output_dir=/tmp/lit-entropy-test-out"])
        (run_dir / ".hydra").mkdir()
        OmegaConf.save(cfg, run_dir / ".hydra" / "config.yaml")
    return ckpt


def test_checkpoint_weights_load_exactly(tmp_path, lab_policy):
    script = load_script()
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=False)
    fresh = TinyLabPolicy(cache_dir=str(tmp_path / "c"), warmstart=WarmStart(steps=0)).build().model
    script.load_checkpoint_weights(fresh, ckpt)
    for (name, a), b in zip(lab_policy.model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {"model.nope.weight": torch.zeros(1)}}, bad)
    with pytest.raises(ValueError, match="does not match"):
        script.load_checkpoint_weights(fresh, bad)


def test_cli_checkpoint_with_run_config_matches_the_same_weights(tmp_path, lab_policy):
    """--ckpt rebuilds the model from the run's .hydra/config.yaml: same weights, same samples, same scores."""
    script = load_script()
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=True)
    common = ["--data", "countdown", "--limit", "6", "-n", "4", "--k", "1,2,4", *FAST]
    from_ckpt = script.main(["--ckpt", str(ckpt), *common])
    direct = script.main(common)
    assert "run config" in from_ckpt["config"]["policy"]
    check_result(from_ckpt, problems=6, n=4, ks=[1, 2, 4])
    assert [p["completions"] for p in from_ckpt["per_problem"]] == [p["completions"] for p in direct["per_problem"]]
    assert from_ckpt["eval/pass@4"] == direct["eval/pass@4"]


def test_cli_on_a_jsonl_source(tmp_path, lab_policy):
    """A tmp JSONL of Countdown-style questions with numeric answers, scored by math-verify (plumbing)."""
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=False)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a},{b},2={a * b + 2}:", "gold": float(a * b + 2)}) + "\n"
                            for a, b in [(3, 4), (5, 6), (7, 2), (9, 9), (1, 8)]))
    out = tmp_path / "out" / "res.json"
    script = load_script()
    res = script.main(["--ckpt", str(ckpt), "--data", "jsonl", "--jsonl", str(data), "--question-field", "q",
                       "--answer-field", "gold", "--template", "{question}", "--limit", "4", "-n", "3",
                       "--k", "1,3", "--max-new-tokens", "12", "--out", str(out), *FAST])
    saved = json.loads(out.read_text())
    assert saved["eval/pass@3"] == res["eval/pass@3"]
    check_result(saved, problems=4, n=3, ks=[1, 3])
    assert [p["reference"] for p in saved["per_problem"]] == ["14", "32", "16", "83"]  # 14.0 -> "14"
    assert saved["per_problem"][0]["prompt"] == "3,4,2=14:"
    assert "4 of 5 problems" in saved["config"]["data"]


def test_cli_argument_errors(capsys):
    script = load_script()
    for argv in (["--data", "jsonl"], ["-n", "2", "--k", "1,4"], ["--k", "a,b"], ["--limit", "0"]):
        with pytest.raises(SystemExit):
            script.parse_args(argv)
    args = script.parse_args(["-n", "8"])
    assert args.ks == [1, 4] and args.max_new_tokens == 16
    assert script.parse_args(["--data", "math500"]).max_new_tokens == 512


HYDRA_FAST = [f"model.warmstart.steps={WARM_STEPS}", f"paths.cache_dir={CACHE}", "eval.reward_workers=1"]


def test_hydra_form_on_the_lab_from_a_training_checkpoint(tmp_path, lab_policy):
    """`ckpt_path=` takes the model from the run's .hydra/config.yaml; the same weights give the same result."""
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=True)
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(SCRIPT), f"ckpt_path={ckpt}", "data=countdown", "rollout=hf", "eval.n=4",
           "eval.k=[1,4]", "eval.limit=6", f"eval.out={out}", *HYDRA_FAST]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    check_result(res, problems=6, n=4, ks=[1, 4])
    assert "from the run config" in res["config"]["policy"] and res["config"]["engine"] == "hf"
    again = load_script().main(["--ckpt", str(ckpt), "--limit", "6", "-n", "4", "--k", "1,4", *FAST])
    assert again["eval/pass@4"] == res["eval/pass@4"] and again["eval/mean@1"] == res["eval/mean@1"]


def test_hydra_form_on_a_jsonl_file(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a},{b},2={a * b + 2}:", "answer": a * b + 2}) + "\n"
                            for a, b in [(3, 4), (5, 6), (7, 2)]))
    res = load_script().main(["data=jsonl", f"data.prompts.path={data}", "data.prompts.template='{question}'",
                              "data.max_new_tokens=12", "eval.n=3", "eval.k=[1,3]", "eval.limit=2", *HYDRA_FAST])
    check_result(res, problems=2, n=3, ks=[1, 3])
    assert [p["reference"] for p in res["per_problem"]] == ["14", "32"]
    with pytest.raises(ValueError, match="eval.k"):
        load_script().main(["eval.n=2", "eval.k=[1,4]"])
