"""lit_entropy.evaluation on scripted engines: the sampler, isolated scoring, accuracy / mean@k / pass@k, stop
strings, and the split evaluation's greedy, sampled, format and first-number metrics. The command line
(scripts/evaluate.py, lit_entropy.evaluation_run): test_evaluation_run.py."""

from __future__ import annotations

import json

import pytest
import torch

from lit_entropy.evaluation import evaluate
from lit_entropy.metrics import pass_at_k
from lit_entropy.policy.models import PolicyBundle
from lit_entropy.rewards.config import RewardConfig
from lit_entropy.rollout.base import Generation, RolloutEngine, SamplingConfig
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.tasks.math_answers import math_reward
from lit_entropy.tasks.prompts import Prompt

pytestmark = pytest.mark.integration


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
                completion = f"so \\boxed{{{answer if self.right(index, j, seed) else answer + 1}}}"
                per.append(Generation(tok.encode(completion) + [0], [0.0] * (len(completion) + 1), False))
            out.append(per)
        return out

    def right(self, index: int, j: int, seed: int) -> bool:
        return j < self.correct[index]

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


# ------------------------------------------------------------------------------- an evaluation resumed by chunks


class SeededEngine(ScriptedEngine):
    """Each sample right or wrong by a coin drawn from its call's seed: a chunk's result depends on its seed and
    problems alone, as with a real engine. ``fail_on_call``: that call raises, as a killed process stops."""

    def __init__(self, fail_on_call: int | None = None):
        super().__init__([])
        self.calls, self.fail_on_call = 0, fail_on_call

    def generate(self, prompts, n, sampling, seed, first_index=0):
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("killed")
        return super().generate(prompts, n, sampling, seed, first_index)

    def right(self, index: int, j: int, seed: int) -> bool:
        import random

        return random.Random(f"{seed}:{index}:{j}").random() < 0.5


def test_a_killed_evaluation_resumes_at_its_first_unfinished_chunk_with_the_uninterrupted_result(tmp_path):
    from lit_entropy.evaluation import ChunkStore

    prompts = [Prompt(f"{i}:{10 * i}", reference=str(10 * i)) for i in range(10)]
    bundle = PolicyBundle(model=torch.nn.Linear(1, 1), tokenizer=ByteTok(), path="unused")

    def run(engine, store=None, problems=prompts):
        sampler = scripted_sampler(engine, mode="inline")
        try:
            return evaluate(bundle, problems, sampler, n=4, ks=[1, 4], seed=3, prompts_per_chunk=3, store=store)
        finally:
            sampler.close()

    whole = run(SeededEngine())  # 4 chunks: 3 + 3 + 3 + 1 problems
    assert 0 < whole["eval/accuracy"] < 1
    store = ChunkStore(tmp_path / "res.json.chunks", fingerprint="this evaluation")
    with pytest.raises(RuntimeError, match="killed"):
        run(SeededEngine(fail_on_call=3), store)  # killed while sampling its third chunk
    assert sorted(p.name for p in store.folder.iterdir()) == ["all-0000.json", "all-0001.json"]
    engine = SeededEngine()
    resumed = run(engine, store)
    assert engine.calls == 2  # the two unfinished chunks only
    timeless = lambda r: {k: v for k, v in r.items() if not k.startswith("time/")}  # noqa: E731
    assert timeless(resumed) == timeless(whole)
    assert sorted(p.name for p in store.folder.iterdir()) == [f"all-{j:04d}.json" for j in range(4)]
    engine = SeededEngine()
    assert timeless(run(engine, store)) == timeless(whole) and engine.calls == 0  # all read back

    # never a silent mix: another evaluation's chunk, other problems or a half-written file name the file
    with pytest.raises(ValueError, match=r"all-0000.json holds a chunk of another evaluation"):
        run(SeededEngine(), ChunkStore(store.folder, fingerprint="another policy"))
    with pytest.raises(ValueError, match=r"all-0000.json holds a chunk of another evaluation"):
        run(SeededEngine(), store, [Prompt(f"{i}:{10 * i}", reference=str(10 * i)) for i in range(1, 11)])
    (store.folder / "all-0001.json").write_text('{"fingerprint": "this eval')
    with pytest.raises(ValueError, match=r"all-0001.json is not a finished chunk.*delete it"):
        run(SeededEngine(), store)
