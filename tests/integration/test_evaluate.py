"""scripts/evaluate.py (lit_entropy.evaluation_run) and lit_entropy.evaluation: the sampler, isolated scoring,
accuracy / mean@k / pass@k."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.evaluation import evaluate
from lit_entropy.evaluation_run import compose_evaluate, main
from lit_entropy.metrics import pass_at_k
from lit_entropy.policy.from_run import load_checkpoint_weights
from lit_entropy.policy.models import PolicyBundle, TinyLabPolicy, WarmStart
from lit_entropy.rewards.config import RewardConfig
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.tasks.math_answers import math_reward
from lit_entropy.tasks.prompts import Prompt
from tests.helpers import ROOT, compose_train

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "evaluate.py"
CACHE = Path(os.environ.get("LIT_ENTROPY_CACHE", ROOT / ".cache" / "lit_entropy"))
WARM_STEPS = 20  # the smoke-test warm start: quick to build, shared cache entry
FAST = [f"model.warmstart.steps={WARM_STEPS}", f"paths.cache_dir={CACHE}", "reward.workers=1"]


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

    def generate(self, prompts, n, sampling, seed, first_index=0):
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


def scripted_sampler(engine, stop=(), **reward) -> Sampler:
    """A sampler on ``engine``; generous reward time limit (a loaded test machine must not time math-verify out)."""
    reward = {"workers": 1, "timeout_s": 60.0, **reward}
    sampler = Sampler(engine, SamplingConfig(max_new_tokens=32, stop=stop), RewardConfig(**reward))
    sampler.start(PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused"), math_reward)
    return sampler


def test_evaluate_counts_and_metrics_with_a_scripted_engine():
    correct = [0, 1, 3, 5, 5, 2]
    prompts = [Prompt(f"{i}:{10 * i}", reference=str(10 * i)) for i in range(len(correct))]
    engine = ScriptedEngine(correct)
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")
    sampler = scripted_sampler(engine)
    try:
        res = evaluate(bundle, prompts, sampler, n=5, ks=[5, 1, 2], seed=0, prompts_per_chunk=4)
    finally:
        sampler.close()
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

    sampler = scripted_sampler(factory, mode="inline")
    evaluate(bundle, prompts[:2], sampler, n=2, ks=[1])
    sampler.close()
    assert built and built[0]["model_path"] == "unused" and built[0]["eos_id"] == 0 and sampler.engine is None
    with pytest.raises(ValueError, match="k"):
        evaluate(bundle, prompts, scripted_sampler(engine), n=2, ks=[4])


class RamblingEngine(ScriptedEngine):
    """Every sample answers correctly, closes its answer, then rambles on to a wrong answer."""

    def generate(self, prompts, n, sampling, seed, first_index=0):
        tok = ByteTok()
        out = []
        for ids in prompts:
            answer = int(tok.decode(ids).split(":")[1])
            text = f"\\boxed{{{answer}}}</answer> or maybe \\boxed{{{answer + 1}}}"
            out.append([Generation(tok.encode(text) + [0], [0.0] * (len(text) + 1), False) for _ in range(n)])
        return out


def test_evaluation_cuts_completions_at_the_stop_strings():
    """A run trained with stop strings is evaluated on the completions training would have seen."""
    prompts = [Prompt(f"{i}:{10 * i}", reference=str(10 * i)) for i in range(3)]
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")
    results = {}
    for stop in ((), ("</answer>",)):
        sampler = scripted_sampler(RamblingEngine([0, 0, 0]), stop=stop, mode="inline")
        try:
            results[stop] = evaluate(bundle, prompts, sampler, n=2, ks=[1])
        finally:
            sampler.close()
    assert results[()]["eval/accuracy"] == 0.0  # the last boxed answer is the wrong one
    assert results[("</answer>",)]["eval/accuracy"] == 1.0
    assert results[("</answer>",)]["per_problem"][1]["completions"] == ["\\boxed{10}</answer>"]


# ------------------------------------------------------------------------------- the script


def test_cli_on_the_lab_policy_writes_json(tmp_path):
    out = tmp_path / "res.json"
    cmd = [sys.executable, str(SCRIPT), "data=countdown", "rollout=hf", "eval.limit=8", "eval.n=4", "eval.k=[1,4]",
           f"eval.out={out}", *FAST]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "eval/pass@4" in proc.stdout and "eval/mean@1" in proc.stdout  # the printed table
    res = json.loads(out.read_text())
    check_result(res, problems=8, n=4, ks=[1, 4])
    assert res["config"]["engine"] == "HFEngine" and "warm-start steps" in res["config"]["policy"]
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
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=False)
    fresh = TinyLabPolicy(cache_dir=str(tmp_path / "c"), warmstart=WarmStart(steps=0)).build().model
    load_checkpoint_weights(fresh, ckpt)
    for (name, a), b in zip(lab_policy.model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {"model.nope.weight": torch.zeros(1)}}, bad)
    with pytest.raises(ValueError, match="does not match"):
        load_checkpoint_weights(fresh, bad)


def test_checkpoint_with_run_config_matches_the_same_weights(tmp_path, lab_policy):
    """ckpt_path= rebuilds the model from the run's .hydra/config.yaml: same weights, same samples, same scores."""
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=True)
    common = ["data=countdown", "eval.limit=6", "eval.n=4", "eval.k=[1,2,4]", *FAST]
    from_ckpt = main([f"ckpt_path={ckpt}", *common])
    direct = main(common)
    assert "from the run config" in from_ckpt["config"]["policy"]
    check_result(from_ckpt, problems=6, n=4, ks=[1, 2, 4])
    assert [p["completions"] for p in from_ckpt["per_problem"]] == [p["completions"] for p in direct["per_problem"]]
    assert from_ckpt["eval/pass@4"] == direct["eval/pass@4"]


def test_on_a_jsonl_source(tmp_path, lab_policy):
    """A tmp JSONL of Countdown-style questions with numeric answers, scored by math-verify (plumbing)."""
    ckpt = write_checkpoint(lab_policy.model, tmp_path / "run", with_config=False)
    data = tmp_path / "q.jsonl"
    data.write_text("".join(json.dumps({"q": f"{a},{b},2={a * b + 2}:", "gold": float(a * b + 2)}) + "\n"
                            for a, b in [(3, 4), (5, 6), (7, 2), (9, 9), (1, 8)]))
    out = tmp_path / "out" / "res.json"
    res = main([f"ckpt_path={ckpt}", "data=jsonl", f"data.prompts.path={data}", "data.prompts.question_field=q",
                "data.prompts.answer_field=gold", "data.prompts.template='{question}'", "eval.limit=4", "eval.n=3",
                "eval.k=[1,3]", "rollout.max_new_tokens=12", f"eval.out={out}", *FAST])
    saved = json.loads(out.read_text())
    assert saved["eval/pass@3"] == res["eval/pass@3"]
    check_result(saved, problems=4, n=3, ks=[1, 3])
    assert [p["reference"] for p in saved["per_problem"]] == ["14", "32", "16", "83"]  # 14.0 -> "14"
    assert saved["per_problem"][0]["prompt"] == "3,4,2=14:"


def test_argument_errors():
    with pytest.raises(SystemExit, match="Hydra overrides"):
        main(["--data", "jsonl"])
    with pytest.raises(ValueError, match="eval.k"):
        main(["eval.n=2", "eval.k=[1,4]"])
    with pytest.raises(ValueError, match="eval.limit"):
        main(["eval.limit=0"])


def test_an_old_eval_key_is_refused_by_name(tmp_path):
    """The keys that moved to the rollout and reward groups before 0.1.0 are refused, naming themselves."""
    with pytest.raises(Exception, match=r"eval\.max_new_tokens"):
        compose_evaluate(["eval.max_new_tokens=7", "data=math500"])
    assert compose_evaluate(["data=math500"]).rollout.max_new_tokens == 512  # the data preset's length


# ------------------------------------------------------------------------------- evaluate_splits(), scripted


class ArithmeticEngine(RolloutEngine):
    """Answers a generated arithmetic prompt from a table: greedy with the bare answer, sampled with the answer
    first and then a wrong number (right by the first number, wrong by the verifier, not a bare answer)."""

    def __init__(self, answers: dict[str, int]):
        self.answers, self.modes = answers, []

    def sync_weights(self, model):
        pass

    def generate(self, prompts, n, sampling, seed, first_index=0):
        tok = ByteTok()
        self.modes.append("greedy" if sampling.greedy else "sampled")
        out = []
        for ids in prompts:
            answer = self.answers[tok.decode(ids)]
            text = f"{answer}." if sampling.greedy else f"{answer}\n\nThen 1 more."
            out.append([Generation(tok.encode(text) + [0], [0.0] * (len(text) + 1), False) for _ in range(n)])
        return out


def test_evaluate_splits_keeps_greedy_sampled_format_and_skill_apart():
    from lit_entropy.evaluation import evaluate_splits
    from lit_entropy.tasks.arithmetic import arithmetic_reward
    from lit_entropy.tasks.prompts import ArithmeticPrompts

    source = ArithmeticPrompts(answer_format="number")
    splits = source.eval_splits(6, seed=0)
    engine = ArithmeticEngine({p.text: p.reference for prompts in splits.values() for p in prompts})
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")
    sampler = Sampler(engine, SamplingConfig(max_new_tokens=32), RewardConfig(workers=1, mode="inline"))
    sampler.start(bundle, arithmetic_reward)
    try:
        res = evaluate_splits(bundle, source, sampler, 6, n=4, ks=[1, 4], seed=0)
    finally:
        sampler.close()
    assert engine.modes == ["sampled", "greedy"] * 2 and set(res["splits"]) == {"held_out", "transfer"}
    for split in ("held_out", "transfer"):
        g, s = f"eval/{split}/greedy", f"eval/{split}/sampled"
        assert res[f"{g}/pass@1"] == 1.0 and res[f"{g}/format"] == 1.0 and res[f"{g}/first_number"] == 1.0
        assert res[f"{s}/pass@1"] == 0.0 and res[f"{s}/pass@4"] == 0.0  # the last number (1) is what counts
        assert res[f"{s}/format"] == 0.0 and res[f"{s}/first_number"] == 1.0  # right, then rambling
        assert res[f"{s}/length"] > res[f"{g}/length"] > 1
        assert f"{g}/pass@4" not in res and f"{g}/accuracy" not in res
        assert res["splits"][split]["greedy"]["num_samples"] == 6
    assert splits == source.eval_splits(6, seed=0) != source.eval_splits(6, seed=1)


def test_evaluate_splits_by_name_at_their_own_sizes_with_per_problem_counts(tmp_path):
    import json

    from lit_entropy.callbacks.evaluation import write_problems
    from lit_entropy.evaluation import evaluate_splits
    from lit_entropy.tasks.arithmetic import ArithmeticConfig, arithmetic_reward
    from lit_entropy.tasks.prompts import ArithmeticPrompts

    source = ArithmeticPrompts(task=ArithmeticConfig(tuning_share=0.5, retention=True), answer_format="number")
    sizes = {"held_out": 5, "retention": 3, "tuning": 0}
    wanted = {split: source.problems(k, 0, split) for split, k in sizes.items()}
    engine = ArithmeticEngine({p.text: p.reference for prompts in wanted.values() for p in prompts})
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")
    sampler = Sampler(engine, SamplingConfig(max_new_tokens=32), RewardConfig(workers=1, mode="inline"))
    sampler.start(bundle, arithmetic_reward)
    try:
        res = evaluate_splits(bundle, source, sampler, sizes, n=2, ks=[1, 2], seed=0)
        with pytest.raises(ValueError, match=r"\['test'\] are not splits of this task"):
            evaluate_splits(bundle, source, sampler, {"test": 4}, n=2, ks=[1], seed=0)
    finally:
        sampler.close()
    assert list(res["splits"]) == ["held_out", "retention"]  # tuning at 0: never read
    assert "eval/tuning/greedy/pass@1" not in res and res["eval/retention/greedy/pass@1"] == 1.0
    write_problems(tmp_path / "it.json", 3, res)
    counts = json.loads((tmp_path / "it.json").read_text())
    assert counts["iteration"] == 3
    held = counts["splits"]["held_out"]
    assert held["greedy"]["problem"] == [p.text for p in wanted["held_out"]]
    assert held["greedy"]["num_correct"] == [1] * 5 and held["sampled"]["num_samples"] == [2] * 5
    assert held["sampled"]["num_correct"] == [0] * 5 and len(counts["splits"]["retention"]["greedy"]["problem"]) == 3
