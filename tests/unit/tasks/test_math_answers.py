"""Answer extraction and the math-verify reward; every shipped gold answer verifies against itself."""

from __future__ import annotations

import json
import pickle
import re
import time
from decimal import Decimal, InvalidOperation

import pytest

from lit_entropy.rewards import RewardRunner, RewardTimeout
from lit_entropy.tasks.math_answers import (
    extract_answer,
    extract_boxed,
    extract_gsm8k,
    math_reward,
    normalize_reference,
)
from lit_entropy.tasks.math_sources import default_data_dir

DATA = default_data_dir()
TEST_FILES = ["gsm8k_test.jsonl", "math500_test.jsonl", "aime2024_test.jsonl", "aime2025_test.jsonl",
              "amc2023_test.jsonl"]
needs_data = pytest.mark.skipif(not (DATA / "MANIFEST.json").is_file(),
                                reason=f"the math JSONL files are not in {DATA}; set LIT_ENTROPY_DATA to their folder")


# ---------------------------------------------------------------------------------------- extraction


def test_extract_boxed_takes_the_last_balanced_box():
    assert extract_boxed(r"first \boxed{1} then \boxed{\frac{1}{2}} done") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{ \left( 3, \frac{\pi}{2} \right) }") == r"\left( 3, \frac{\pi}{2} \right)"
    assert extract_boxed(r"so \fbox{42}.") == "42"
    assert extract_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"  # escaped braces are content
    assert extract_boxed(r"$\boxed 7$") == "7"
    # a truncated last box falls back to the last complete one
    assert extract_boxed(r"\boxed{3} and then \boxed{\frac{1}{") == "3"
    for text in ["no box", r"\boxed{", r"\boxedx{3}", "", None, 17]:
        assert extract_boxed(text) is None


def test_extract_gsm8k_and_answer_order():
    assert extract_gsm8k("She makes $18.\n#### 18") == "18"
    assert extract_gsm8k("#### 1,234,567.\nmore text") == "1234567"
    assert extract_gsm8k("#### ") is None and extract_gsm8k("no marker") is None
    assert extract_answer(r"#### 5 but \boxed{6}") == "6"  # the box wins
    assert extract_answer("work\n#### 5") == "5"
    assert extract_answer("the answer is 5") is None


def test_normalize_reference():
    assert normalize_reference(27.0) == "27" and normalize_reference(2.5) == "2.5"
    assert normalize_reference(70) == "70" and normalize_reference(" 9 ") == "9"
    assert normalize_reference("work\n#### 1,000") == "1000"
    for bad in (None, True, float("nan"), "", [1]):
        assert normalize_reference(bad) is None


# ---------------------------------------------------------------------------------------- reward


def test_math_reward_equivalent_forms():
    assert math_reward("", r"so \boxed{0.5}", r"\frac{1}{2}") == 1.0
    assert math_reward("", r"\boxed{\dfrac{14}{3}}", r"\frac{14}{3}") == 1.0
    assert math_reward("", r"\boxed{(3, \pi/2)}", r"\left( 3, \frac{\pi}{2} \right)") == 1.0
    assert math_reward("", "blah\n#### 1,000", "1000") == 1.0
    assert math_reward("", r"\boxed{27}", 27.0) == 1.0
    assert math_reward("", r"\boxed{28}", 27.0) == 0.0
    assert math_reward("", "27", 27) == 0.0  # no \boxed{} and no ####: no answer
    assert math_reward("", r"\boxed{27}", "work\n#### 27") == 1.0  # a raw GSM8K solution as reference


@pytest.mark.parametrize("completion, reference", [
    (None, "3"), (123, "3"), (r"\boxed{3}", None), (r"\boxed{3}", object()), (r"\boxed{}", "3"),
    ("\\boxed{" + "{" * 3000 + "}" * 3000 + "}", "3"), (r"\boxed{\frac{", "3"), (r"\boxed{x^{x^{x^{x}}}}", "3"),
    (r"\boxed{3}", r"\frac{"), ("\x00\\boxed{\u2603}", "3"), (r"\boxed{" + "9" * 5000 + "}", "3"),
])
def test_math_reward_never_raises_on_garbage(completion, reference):
    assert math_reward("prompt", completion, reference) == 0.0


def test_math_reward_is_picklable_and_ignores_extra_kwargs():
    fn = pickle.loads(pickle.dumps(math_reward))
    assert fn("p", r"\boxed{4}", "4", use_all=True, format_reward=0.1) == 1.0


def test_math_reward_runs_in_the_reward_runner():
    with RewardRunner(math_reward, num_workers=1, timeout_s=30) as runner:
        rewards, stats = runner.score(["p"] * 3, [r"\boxed{2}", r"\boxed{3}", "junk"], ["2", "2", "2"])
    assert rewards == [1.0, 0.0, 0.0] and stats.failures == 0


# ---------------------------------------------------------------------------------------- gold answers


def perturb(answer: str) -> str:
    """A wrong answer: +1 for a number, an appended "+1" for anything else."""
    plain = answer.replace(",", "").strip()
    if re.fullmatch(r"-?\d+(\.\d+)?", plain):
        try:
            return str(Decimal(plain) + 1)
        except InvalidOperation:  # pragma: no cover - the regex admits only decimals
            pass
    return answer + "+1"


def gold_rows(files: list[str]) -> list[tuple[str, int, object]]:
    """(file, line, raw reference) for every row; the raw value goes through math_reward's normalisation."""
    rows = []
    for name in files:
        for lineno, line in enumerate((DATA / name).read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                rows.append((name, lineno, json.loads(line)["answer"]))
    return rows


def completions(rows):
    right = [f"The answer is $\\boxed{{{normalize_reference(ref)}}}$." for _, _, ref in rows]
    wrong = [f"The answer is $\\boxed{{{perturb(normalize_reference(ref))}}}$." for _, _, ref in rows]
    return right, wrong


def check(rows, right_scores, wrong_scores):
    bad = [(f, ln, ref, r, w) for (f, ln, ref), r, w in zip(rows, right_scores, wrong_scores, strict=True)
           if r != 1.0 or w != 0.0]
    assert not bad, f"{len(bad)} gold answers misjudged, e.g. {bad[:5]}"


@needs_data
def test_every_gold_answer_of_the_test_sets_verifies_against_itself():
    """Every row of GSM8K test, MATH-500, AIME 2024/2025 and AMC 2023 (about 5 s in this process)."""
    rows = gold_rows(TEST_FILES)
    assert len(rows) == 1319 + 500 + 30 + 30 + 40
    right, wrong = completions(rows)
    t0 = time.perf_counter()
    right_scores = [math_reward("", c, ref) for c, (_, _, ref) in zip(right, rows, strict=True)]
    wrong_scores = [math_reward("", c, ref) for c, (_, _, ref) in zip(wrong, rows, strict=True)]
    print(f"{2 * len(rows)} math-verify calls in {time.perf_counter() - t0:.1f}s")
    check(rows, right_scores, wrong_scores)


@pytest.mark.slow
@needs_data
def test_every_gold_answer_verifies_in_the_reward_runner_process_pool():
    """The same check through the isolated runner (2 workers), with GSM8K train added (about 10 000 rows)."""
    rows = gold_rows([*TEST_FILES, "gsm8k_train.jsonl"])
    right, wrong = completions(rows)
    refs = [ref for _, _, ref in rows]
    with RewardRunner(math_reward, num_workers=2, timeout_s=30) as runner:
        right_scores, s1 = runner.score([""] * len(rows), right, refs)
        wrong_scores, s2 = runner.score([""] * len(rows), wrong, refs)
    assert s1.failures == 0 and s2.failures == 0
    check(rows, right_scores, wrong_scores)


def test_perturb_helper():
    assert perturb("18") == "19" and perturb("-1") == "0" and perturb("0.5") == "1.5"
    assert perturb(r"\frac{1}{2}") == r"\frac{1}{2}+1"


def test_math_verify_giving_up_on_its_own_timeout_is_counted_as_a_timeout(caplog):
    slow = "The answer is \\boxed{(10^{7})!}"  # sympy cannot compare this with 5 within a second
    with pytest.raises(RewardTimeout):
        math_reward("q", slow, "5", verifier_timeout_s=1)  # main thread: math-verify's alarm is on
    runner = RewardRunner(math_reward, mode="process", timeout_s=30, num_workers=1,
                          fn_kwargs={"verifier_timeout_s": 1})
    with runner, caplog.at_level("WARNING"):
        rewards, stats = runner.score(["q"] * 3, ["\\boxed{5}", slow, "\\boxed{4}"], ["5"] * 3)
        runner.score(["q"], [slow], ["5"])
    assert rewards == [1.0, 0.0, 0.0]
    assert stats.timeouts == 1 and stats.errors == 0
    assert runner.total.timeouts == 2
    assert sum("timed out" in r.message for r in caplog.records) == 1  # warned once
