"""JSONL prompt sources: field normalisation of the shipped files, row validation, determinism."""

from __future__ import annotations

import json
import pickle
import re
import sys

import pytest

from lit_entropy.tasks.math_answers import math_reward
from lit_entropy.tasks.math_sources import (
    DEFAULT_TEMPLATE,
    MATH_DATASETS,
    R1_ZERO_TEMPLATE,
    JSONLPrompts,
    MathDataset,
    default_data_dir,
)

DATA = default_data_dir()
needs_data = pytest.mark.skipif(not (DATA / "MANIFEST.json").is_file(),
                                reason=f"the math JSONL files are not in {DATA}; set LIT_ENTROPY_DATA to their folder")


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------- shipped files


@needs_data
@pytest.mark.parametrize("name", sorted(MATH_DATASETS))
def test_named_sets_match_the_manifest_and_normalise_answers(name):
    manifest = {m["file"]: m for m in json.loads((DATA / "MANIFEST.json").read_text())}
    ds = MathDataset(name, shuffle=False)
    assert len(ds) == manifest[MATH_DATASETS[name].file]["rows"]
    prompts = ds.all_prompts()
    assert len(prompts) == len(ds)
    for p in prompts:
        assert isinstance(p.reference, str) and p.reference and p.reference == p.reference.strip()
        assert not re.fullmatch(r"-?\d+\.0", p.reference)  # 27.0 -> "27"
        assert "####" not in p.reference and "\n" not in p.reference
        assert p.text.endswith("\nPut the final answer in \\boxed{}.")
    assert ds.reward_fn is math_reward and ds.reward_kwargs == {}


@needs_data
def test_field_normalisation_per_file():
    first = {name: MathDataset(name, shuffle=False).all_prompts()[0] for name in MATH_DATASETS}
    assert first["gsm8k"].reference == "18" and first["gsm8k"].text.startswith("Janet\u2019s ducks lay 16 eggs")
    assert first["gsm8k_train"].reference == "72"
    assert first["math500"].reference == r"\left( 3, \frac{\pi}{2} \right)"
    assert first["math500"].text.startswith("Convert the point $(0,3)$")
    assert first["aime2024"].reference == "204"  # strings stay strings
    assert first["aime2025"].reference == "70"  # int
    assert first["amc2023"].reference == "27"  # float 27.0
    assert MathDataset("amc2023").all_prompts()[15].reference == "-1"  # -1.0
    gsm_refs = [p.reference for p in MathDataset("gsm8k_train", shuffle=False).all_prompts()]
    assert all("," not in r for r in gsm_refs)  # "#### 1,000" -> "1000"


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.delenv("LIT_ENTROPY_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_data_dir() == tmp_path / "data"
    write_jsonl(tmp_path / "aime2025_test.jsonl", [{"problem": "1+1?", "answer": 2}])
    assert len(MathDataset("aime2025", data_dir=tmp_path)) == 1
    monkeypatch.setenv("LIT_ENTROPY_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path and len(MathDataset("aime2025")) == 1
    with pytest.raises(FileNotFoundError, match="math500_test.jsonl"):
        MathDataset("math500")


def test_unknown_name_and_source():
    with pytest.raises(ValueError, match="gsm8k"):
        MathDataset("gsm9k")
    with pytest.raises(ValueError, match="source"):
        MathDataset("gsm8k", source="s3")


def test_hf_source_without_datasets_says_so(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError; no network
    with pytest.raises(ImportError, match="datasets"):
        MathDataset("math500", data_dir=tmp_path, source="hf")


# ---------------------------------------------------------------------------------------- validation


def test_jsonl_fields_template_and_transform(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"q": "What is {x}?", "a": "work\n#### 1,200"},
        "",  # blank lines are skipped
        {"q": "  Two?  ", "a": "x = 2\n#### 2", "extra": 1},
    ])
    src = JSONLPrompts(path, question_field="q", answer_field="a", answer_transform="gsm8k",
                       template="Q: {question}\nA: \\boxed{}", shuffle=False)
    assert len(src) == 2
    assert [p.reference for p in src.all_prompts()] == ["1200", "2"]
    assert src.all_prompts()[0].text == "Q: What is {x}?\nA: \\boxed{}"  # no other braces interpreted
    assert src.all_prompts()[1].text == "Q: Two?\nA: \\boxed{}"
    assert JSONLPrompts(path, "q", "a").all_prompts()[0].text.endswith("Put the final answer in \\boxed{}.")
    assert DEFAULT_TEMPLATE.count("{question}") == 1
    pickle.dumps((src.reward_fn, src.reward_kwargs))


@pytest.mark.parametrize("rows, line, match", [
    ([{"question": "a", "answer": 1}, {"question": "b", "answer": 2}, "{not json"], 3, "bad JSON"),
    ([{"question": "a", "answer": 1}, {"question": "b"}], 2, "missing field 'answer'"),
    ([{"answer": 1}], 1, "missing field 'question'"),
    ([{"question": "a", "answer": 1}, "", "[1, 2]"], 3, "expected a JSON object"),
    ([{"question": "  ", "answer": 1}], 1, "non-empty string"),
    ([{"question": 5, "answer": 1}], 1, "non-empty string"),
    ([{"question": "a", "answer": None}], 1, "not a usable answer"),
    ([{"question": "a", "answer": True}], 1, "not a usable answer"),
    ([{"question": "a", "answer": [1]}], 1, "not a usable answer"),
    ([{"question": "a", "answer": ""}], 1, "not a usable answer"),
])
def test_malformed_rows_name_the_file_and_line(tmp_path, rows, line, match):
    path = write_jsonl(tmp_path / "broken.jsonl", rows)
    with pytest.raises(ValueError, match=match) as info:
        JSONLPrompts(path)
    assert str(path) in str(info.value) and f"line {line}:" in str(info.value)


def test_gsm8k_transform_needs_the_marker(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "a", "answer": "#### 3"}, {"question": "b", "answer": "4"}])
    with pytest.raises(ValueError, match=r"g\.jsonl, line 2: .*####"):
        JSONLPrompts(path, answer_transform="gsm8k")


def test_bad_arguments(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": 1}])
    with pytest.raises(ValueError, match="template"):
        JSONLPrompts(path, template="no placeholder")
    with pytest.raises(ValueError, match="answer_transform"):
        JSONLPrompts(path, answer_transform="math")
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        JSONLPrompts(tmp_path / "nope.jsonl")
    with pytest.raises(ValueError, match="no rows"):
        JSONLPrompts(write_jsonl(tmp_path / "empty.jsonl", [""]))


# ---------------------------------------------------------------------------------------- sampling


@pytest.fixture
def numbered(tmp_path):
    return write_jsonl(tmp_path / "n.jsonl", [{"question": f"q{i}", "answer": i} for i in range(23)])


def refs(prompts):
    return [p.reference for p in prompts]


def test_sampling_is_deterministic_per_iteration_and_round(numbered):
    a, b = JSONLPrompts(numbered, seed=7), JSONLPrompts(numbered, seed=7)
    for it in (0, 1, 5, 10**6):
        for rnd in (0, 1, 2):
            assert refs(a.sample(5, it, rnd)) == refs(b.sample(5, it, rnd))
    # order of calls does not matter (a resumed run sees the same stream)
    assert refs(a.sample(5, 3)) == refs(JSONLPrompts(numbered, seed=7).sample(5, 3))
    assert refs(a.sample(5, 0)) != refs(a.sample(5, 1))
    assert refs(a.sample(5, 0)) != refs(a.sample(5, 0, round=1))
    assert refs(a.sample(5, 0)) != refs(JSONLPrompts(numbered, seed=8).sample(5, 0))


def test_each_pass_covers_every_row_once(numbered):
    src = JSONLPrompts(numbered, seed=3)
    stream = [r for it in range(23) for r in refs(src.sample(2, it))]  # 46 positions = two passes
    assert sorted(stream[:23], key=int) == [str(i) for i in range(23)]
    assert sorted(stream[23:], key=int) == [str(i) for i in range(23)]
    assert stream[:23] != stream[23:]  # a fresh order each pass
    assert stream[:23] != [str(i) for i in range(23)]  # shuffled


def test_unshuffled_follows_file_order_and_refills_are_distinct(numbered):
    src = JSONLPrompts(numbered, shuffle=False)
    assert refs(src.sample(4, 0)) == ["0", "1", "2", "3"] and refs(src.sample(4, 1)) == ["4", "5", "6", "7"]
    assert refs(src.sample(3, 7)) == ["21", "22", "0"]  # wraps around
    refill = refs(src.sample(10, 0, round=1))
    assert len(set(refill)) == 10
    assert len(src.sample(50, 0, round=2)) == 50 and src.sample(0, 4) == []


# ---------------------------------------------------------------------------------------- answer rules


def test_integer_rule_scores_bare_numbers_that_math_verify_does_not(tmp_path):
    from lit_entropy.tasks.arithmetic import arithmetic_reward

    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "6*7?", "answer": "42"}, {"question": "b", "answer": 27.0}])
    src = JSONLPrompts(path, shuffle=False, answer_rule="integer", reward_kwargs={"verifier_timeout_s": 5})
    assert src.reward_fn is arithmetic_reward and src.reward_kwargs == {}  # math-verify's kwarg dropped
    assert [p.reference for p in src.all_prompts()] == [42, 27]
    assert all(type(p.reference) is int for p in src.all_prompts())
    ref = src.all_prompts()[0].reference
    for completion in ("The answer is 42.", "\\boxed{42}", "42"):
        assert src.reward_fn("6*7?", completion, ref, **src.reward_kwargs) == 1.0, completion
    assert src.reward_fn("6*7?", "41", ref, **src.reward_kwargs) == 0.0
    mv = JSONLPrompts(path, shuffle=False)  # the default: math-verify, which needs a box or "####"
    assert mv.answer_rule == "math_verify" and mv.reward_fn is math_reward
    assert mv.reward_fn("6*7?", "42", mv.all_prompts()[0].reference, **mv.reward_kwargs) == 0.0
    assert mv.reward_fn("6*7?", "\\boxed{42}", mv.all_prompts()[0].reference, **mv.reward_kwargs) == 1.0
    pickle.dumps((src.reward_fn, src.reward_kwargs))
    boxed_only = JSONLPrompts(path, answer_rule="integer", reward_kwargs={"require_boxed": True})
    assert boxed_only.reward_kwargs == {"require_boxed": True}
    assert boxed_only.reward_fn("q", "42", 42, **boxed_only.reward_kwargs) == 0.0


def test_integer_rule_with_gsm8k_answers(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": "a", "answer": "work\n#### 1,200"},
                                              {"question": "b", "answer": "x\n#### -7"}])
    src = JSONLPrompts(path, answer_transform="gsm8k", answer_rule="integer", shuffle=False)
    assert [p.reference for p in src.all_prompts()] == [1200, -7]
    assert src.reward_fn("a", "so 1,200 in all", 1200) == 1.0


@pytest.mark.parametrize("answer", ["3.5", "x = 3", "\\frac{1}{2}", 2.5, "1" * 19])
def test_a_non_integer_gold_answer_under_the_integer_rule_names_file_line_and_value(tmp_path, answer):
    path = write_jsonl(tmp_path / "ints.jsonl", [{"question": "a", "answer": 1}, {"question": "b", "answer": answer}])
    with pytest.raises(ValueError, match="answer_rule: integer") as info:
        JSONLPrompts(path, answer_rule="integer")
    assert f"{path}, line 2:" in str(info.value) and repr(str(answer)) in str(info.value)
    assert len(JSONLPrompts(path)) == 2  # math-verify takes it


def test_unknown_rule_and_foreign_kwargs_are_refused(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"question": "a", "answer": 1}])
    with pytest.raises(ValueError, match=r"answer_rule must be one of \['integer', 'math_verify'\], got 'exact'"):
        JSONLPrompts(path, answer_rule="exact")
    with pytest.raises(ValueError, match=r"\['use_all'\] do not apply to answer_rule 'integer'.*require_boxed"):
        JSONLPrompts(path, answer_rule="integer", reward_kwargs={"use_all": True})
    with pytest.raises(ValueError, match="answer_rule"):
        MathDataset("aime2025", data_dir=write_jsonl(tmp_path / "aime2025_test.jsonl", [{"problem": "p", "answer": 1}]).parent,
                    answer_rule="exact")
    assert MathDataset("aime2025", data_dir=tmp_path, answer_rule="integer").all_prompts()[0].reference == 1


def test_data_jsonl_with_the_integer_rule_composes_and_instantiates(tmp_path):
    from hydra.utils import instantiate

    from lit_entropy.tasks.arithmetic import arithmetic_reward
    from tests.helpers import compose_train

    path = write_jsonl(tmp_path / "q.jsonl", [{"question": "what is 2+3", "answer": "5"}])
    cfg = compose_train(["data=jsonl", f"data.prompts.path={path}", "data.prompts.answer_rule=integer",
                         f"paths.output_dir={tmp_path / 'out'}"])
    src = instantiate(cfg.data.prompts)
    assert src.reward_fn is arithmetic_reward and src.reward_kwargs == {}  # the preset's verifier_timeout_s dropped
    assert src.sample(1, iteration=0)[0].reference == 5
    assert compose_train(["data=jsonl", f"data.prompts.path={path}"]).data.prompts.answer_rule == "math_verify"


def test_r1_zero_template_is_a_named_base_model_template(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text('{"question": "1+1?", "answer": "2"}\n')
    prompt = JSONLPrompts(data, template="r1_zero", shuffle=False).all_prompts()[0]
    assert prompt.text == R1_ZERO_TEMPLATE.replace("{question}", "1+1?") and prompt.text.endswith("<think>")
