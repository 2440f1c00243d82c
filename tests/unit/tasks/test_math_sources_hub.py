"""The math presets' hub path: Hugging Face `datasets` reading small local files the tests write (offline)."""

from __future__ import annotations

import json

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from lit_entropy.tasks.math_sources import MathDataset
from tests.helpers import compose_train

pytest.importorskip("datasets", reason="the hf extra (datasets) is not installed")

GSM8K_ROWS = [{"question": f"What is {i} + {i}?", "answer": f"{i} plus {i}.\n#### {2 * i}"} for i in range(1, 6)]
MATH_ROWS = [{"problem": "What is $1/2 + 1/2$?", "answer": "1", "subject": "Algebra"},
             {"problem": "Compute $3^2$.", "answer": "9", "subject": "Algebra"}]


def _parquet_dir(tmp_path, split: str, rows: list[dict]):
    import datasets

    folder = tmp_path / "hub_copy"
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(rows).to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return folder


def _prompts(tmp_path, preset: str, **hub):
    cfg = compose_train([f"data={preset}", f"data.prompts.data_dir={tmp_path / 'no_files_here'}"])
    node = OmegaConf.to_container(cfg.data.prompts, resolve=True)
    node["hub"].update(hub)
    return instantiate(node)


def test_gsm8k_preset_without_a_local_file_loads_through_datasets(tmp_path):
    folder = _parquet_dir(tmp_path, "train", GSM8K_ROWS)
    prompts = _prompts(tmp_path, "gsm8k", path=str(folder), config=None)
    assert prompts.source == "hf" and len(prompts) == 5
    assert prompts.all_prompts()[2].reference == "6"  # "#### 6" extracted as in the JSONL path
    assert prompts.all_prompts()[0].text.startswith("What is 1 + 1?\nPut the final answer in \\boxed{}.")


def test_math500_preset_reads_json_data_files_with_its_field_mapping(tmp_path):
    path = tmp_path / "math.json"
    path.write_text("\n".join(json.dumps(r) for r in MATH_ROWS))
    prompts = _prompts(tmp_path, "math500", path="json", data_files=str(path), split="train")
    assert [p.reference for p in prompts.all_prompts()] == ["1", "9"]


def test_a_local_jsonl_wins_over_the_hub(tmp_path):
    (tmp_path / "math500_test.jsonl").write_text("\n".join(json.dumps(r) for r in MATH_ROWS))
    ds = MathDataset("math500", data_dir=tmp_path, source="auto", hub={"path": "does/not-exist"})
    assert ds.source == "local" and len(ds) == 2


def test_a_missing_field_names_the_dataset_and_field(tmp_path):
    folder = _parquet_dir(tmp_path, "train", [{"question": "q?", "solution": "#### 1"}])
    with pytest.raises(ValueError, match=r"hf://.*hub_copy\[train\]: expected columns.*'answer'"):
        MathDataset("gsm8k_train", data_dir=tmp_path, source="auto", hub={"path": str(folder), "config": None})


def test_an_unreachable_hub_set_says_how_to_get_it_offline(tmp_path):
    with pytest.raises(RuntimeError, match=r"gsm8k_train: could not load hf://openai/gsm8k\[train\].*data_dir"):
        MathDataset("gsm8k_train", data_dir=tmp_path, source="auto")


def test_unknown_hub_keys_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown hub keys.*'splt'"):
        MathDataset("gsm8k", data_dir=tmp_path, hub={"splt": "test"})
