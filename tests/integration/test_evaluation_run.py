"""scripts/evaluate.py (lit_entropy.evaluation_run): the command line on the lab policy, a checkpoint evaluated from
its run's config, a JSONL source, argument errors. The evaluation itself: test_evaluation.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lit_entropy.evaluation_run import compose_evaluate, main, split_limit
from lit_entropy.policy.models import TinyLabPolicy, WarmStart
from tests.helpers import ROOT, compose_train
from tests.integration.test_evaluation import check_result

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "scripts" / "evaluate.py"
CACHE = Path(os.environ.get("LIT_ENTROPY_CACHE", ROOT / ".cache" / "lit_entropy"))
WARM_STEPS = 20  # the smoke-test warm start: quick to build, shared cache entry
FAST = [f"model.warmstart.steps={WARM_STEPS}", f"paths.cache_dir={CACHE}", "reward.workers=1"]


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


def test_the_command_keeps_chunks_until_its_result_is_written_and_refuses_another_evaluations(tmp_path, lab_policy):
    """eval.out=F keeps finished chunks in F.chunks/ while it runs (lit_entropy.evaluation.ChunkStore: a killed
    evaluation resumes there, test_evaluation.py) and deletes them once F is written; a chunk left by an evaluation
    of another setting is an error naming it, not a mix."""
    from lit_entropy.evaluation import ChunkStore
    from lit_entropy.evaluation_run import chunk_store

    out = tmp_path / "res.json"
    common = ["data=countdown", "eval.limit=5", "eval.n=2", "eval.k=[1,2]", "eval.prompts_per_chunk=2", *FAST]
    first = main([*common, f"eval.out={out}"])
    assert out.is_file() and not Path(str(out) + ".chunks").exists()
    assert [p["completions"] for p in main(common)["per_problem"]] == [p["completions"] for p in first["per_problem"]]
    store = chunk_store(compose_evaluate([*common, f"eval.out={out}"]))
    assert store.folder == Path(str(out) + ".chunks")
    assert chunk_store(compose_evaluate([*common, f"eval.out={out}", "rollout.temperature=0.5"])).fingerprint \
        != store.fingerprint
    assert chunk_store(compose_evaluate(common)) is None  # nothing to resume into without eval.out
    assert chunk_store(compose_evaluate([*common, f"eval.out={out}", "eval.resume=false"])) is None
    ChunkStore(store.folder, "an evaluation at another temperature").save(0, "k", {})
    with pytest.raises(ValueError, match=r"all-0000.json holds a chunk of another evaluation"):
        main([*common, f"eval.out={out}"])


def test_argument_errors():
    with pytest.raises(SystemExit, match="Hydra overrides"):
        main(["--data", "jsonl"])
    with pytest.raises(ValueError, match="eval.k"):
        main(["eval.n=2", "eval.k=[1,4]"])
    with pytest.raises(ValueError, match="eval.limit"):
        main(["eval.limit=0"])
    with pytest.raises(ValueError, match="names splits"):  # countdown has none
        main(["eval.limit={held_out:4}", *FAST])


@pytest.mark.parametrize("limit", [0, -3, True, 2.5, {"held_out": -1}, {"held_out": 0}, {"held_out": "many"}])
def test_a_bad_eval_limit_names_itself(limit):
    with pytest.raises(ValueError, match="eval.limit"):
        split_limit(limit)


def test_eval_limit_is_a_count_or_counts_by_split():
    assert split_limit(None) is None and split_limit(7) == 7
    assert split_limit(OmegaConf.create({"held_out": 256, "retention": 64, "tuning": 0})) == \
        {"held_out": 256, "retention": 64, "tuning": 0}


def test_the_lab_model_refuses_prompts_it_cannot_read_before_it_is_built():
    """model=tiny_countdown on the arithmetic task: the same error as training gives, naming the model to use."""
    with pytest.raises(ValueError, match="cannot read these prompts.*model=smollm2_135m"):
        main(["data=arithmetic", *FAST])


def test_an_old_eval_key_is_refused_by_name(tmp_path):
    """The keys that moved to the rollout and reward groups before 0.1.0 are refused, naming themselves."""
    with pytest.raises(Exception, match=r"eval\.max_new_tokens"):
        compose_evaluate(["eval.max_new_tokens=7", "data=math500"])
    assert compose_evaluate(["data=math500"]).rollout.max_new_tokens == 512  # the data preset's length
