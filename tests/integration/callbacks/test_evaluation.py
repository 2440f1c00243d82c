"""The optional in-training validation loop logs eval/* from a real run (in-process, tests/harness.py)."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.integration


def test_periodic_eval_logs_pass_at_k(tmp_path, harness):
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]"],
                          tmp_path).scalars
    for tag in ("eval/accuracy", "eval/mean@1", "eval/pass@1", "eval/pass@4"):
        assert tag in scalars, sorted(scalars)
        values = [v for _, v in scalars[tag]]
        assert len(values) == 2  # after iteration 2 and after the last (3rd) one
        assert all(math.isfinite(v) and 0 <= v <= 1 for v in values)
    p1 = [v for _, v in scalars["eval/pass@1"]]
    p4 = [v for _, v in scalars["eval/pass@4"]]
    assert all(a <= b + 1e-9 for a, b in zip(p1, p4, strict=True))


def test_the_evaluation_is_timed_apart_from_the_update(tmp_path, harness, monkeypatch):
    """An evaluation made 5 s slower shows in time/evaluate and not in that iteration's time/update (5 s: an
    update of this run takes 0.2 s on an idle machine and up to 3.4 s measured beside two busy lanes)."""
    import time

    import lit_entropy.callbacks.evaluation as periodic

    plain = periodic.evaluate  # what the callback calls for the lab's prompts (no evaluation splits)

    def slow(*args, **kwargs):
        time.sleep(5.0)
        return plain(*args, **kwargs)

    monkeypatch.setattr(periodic, "evaluate", slow)
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]"],
                          tmp_path).scalars
    evaluated = dict(scalars["time/evaluate"])
    assert sorted(evaluated) == [2, 3] and all(v >= 5.0 for v in evaluated.values())
    update = dict(scalars["time/update"])
    assert all(update[step] < 5.0 for step in evaluated), (update, evaluated)


def test_periodic_eval_at_start_logs_the_starting_policy_at_step_0(tmp_path, harness):
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=3",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                           "callbacks.eval.at_start=true"], tmp_path).scalars
    steps = [s for s, _ in scalars["eval/pass@4"]]
    assert len(steps) == 2 and steps[0] == 0 < steps[1]  # before the first update, then after the last
    assert min(s for s, _ in scalars["rollout/entropy"]) > 0  # every iteration's metrics come after it
    assert all(0 <= v <= 1 for _, v in scalars["eval/pass@1"])


def test_the_last_evaluation_draws_final_n_samples_and_reports_final_ks(tmp_path, harness):
    """pass@8 exists only after the last iteration (8 samples there), pass@4 along the way and at the end."""
    scalars = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                           "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                           "callbacks.eval.final_n=8", "callbacks.eval.final_ks=[1,4,8]"], tmp_path).scalars
    last = max(s for s, _ in scalars["rollout/entropy"])
    assert [s for s, _ in scalars["eval/pass@8"]] == [last]
    assert len(scalars["eval/pass@4"]) == 2 and scalars["eval/pass@4"][-1][1] <= scalars["eval/pass@8"][0][1] + 1e-9


def test_final_ks_beyond_final_n_fail_at_start_up():
    from lit_entropy.callbacks.evaluation import PeriodicEvalCallback

    with pytest.raises(ValueError, match=r"callbacks.eval.final_ks=\[1, 16\]: every k must be in \[1, 8\]"):
        PeriodicEvalCallback(n=4, ks=(1, 4), final_n=8, final_ks=(1, 16))


def test_per_problem_counts_are_written_for_every_evaluation(tmp_path, harness):
    import json

    run = harness.fit(["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=2",
                       "callbacks.eval.num_problems=4", "callbacks.eval.n=4", "callbacks.eval.ks=[1,4]",
                       "callbacks.eval.per_problem=true"], tmp_path)
    files = sorted((run.run_dir / "eval_problems").glob("*.json"))
    assert [f.name for f in files] == ["iteration-0002.json", "iteration-0003.json"]
    last = json.loads(files[-1].read_text())["splits"]["all"]["sampled"]
    assert last["num_samples"] == [4] * 4 and len(last["problem"]) == 4
    assert sum(last["num_correct"]) / 16 == pytest.approx(run.values("eval/accuracy")[-1])


def test_named_splits_fail_at_start_up_where_they_cannot_run():
    from lit_entropy.callbacks.evaluation import PeriodicEvalCallback

    with pytest.raises(ValueError, match="counts must be >= 0, one at least > 0"):
        PeriodicEvalCallback(num_problems={"held_out": 0})


def test_a_run_killed_in_its_last_evaluation_resumes_it_from_the_finished_chunks(tmp_path, harness, monkeypatch):
    """Killed in the last evaluation's third chunk of five, resumed from the checkpoint after iteration 2: the
    resumed run trains iteration 3 again (the same weights), reads chunks 0 and 1 back and samples chunks 2-4, and
    its evaluation is the uninterrupted run's. A resume that evaluates otherwise (another temperature) deletes the
    kept chunks and samples all five."""
    import json

    import lit_entropy.evaluation as evaluation

    overrides = ["rollout=hf", "callbacks/eval=periodic", "callbacks.eval.every_n_iterations=3",
                 "callbacks.eval.num_problems=10", "callbacks.eval.n=2", "callbacks.eval.ks=[1,2]",
                 "callbacks.eval.per_problem=true", "callbacks.eval.prompts_per_chunk=2",
                 "callbacks.checkpoint.keep_iterations=true"]
    straight = harness.fit(overrides, tmp_path, name="straight")
    assert not (straight.run_dir / "eval_chunks").exists()  # deleted once the evaluation is done
    plain, calls = evaluation._sample_chunk, []

    def sample_chunk(*args, **kwargs):
        calls.append(args[0][0].text)  # the chunk's first problem
        if kill_at is not None and len(calls) == kill_at:
            raise RuntimeError("killed in the evaluation")
        return plain(*args, **kwargs)

    monkeypatch.setattr(evaluation, "_sample_chunk", sample_chunk)
    kill_at = 3
    with pytest.raises(RuntimeError, match="killed in the evaluation"):
        harness.fit(overrides, tmp_path, name="killed")
    run = tmp_path / "killed"
    kept = sorted(p.name for p in (run / "eval_chunks").glob("*/*.json"))
    assert kept == ["all-0000.json", "all-0001.json"], kept
    assert not (run / "eval_problems").exists()

    calls.clear()
    kill_at = None
    resumed = harness.fit([*overrides, f"ckpt_path={run / 'checkpoints' / 'iteration-0002.ckpt'}"], tmp_path,
                          name="killed")
    problems = json.loads((straight.run_dir / "eval_problems" / "iteration-0003.json").read_text())
    assert calls == [problems["splits"]["all"]["sampled"]["problem"][i] for i in (4, 6, 8)]
    assert json.loads((run / "eval_problems" / "iteration-0003.json").read_text()) == problems
    for tag in ("eval/accuracy", "eval/pass@1", "eval/pass@2"):
        assert resumed.values(tag)[-1] == straight.values(tag)[-1], tag
    assert not (run / "eval_chunks").exists()

    calls.clear()
    kill_at = 3  # again, then a resume that samples the evaluation at another temperature
    with pytest.raises(RuntimeError, match="killed in the evaluation"):
        harness.fit(overrides, tmp_path, name="other")
    calls.clear()
    kill_at = None
    harness.fit([*overrides, "callbacks.eval.temperature=0.7",
                 f"ckpt_path={tmp_path / 'other' / 'checkpoints' / 'iteration-0002.ckpt'}"], tmp_path, name="other")
    assert len(calls) == 5 and not (tmp_path / "other" / "eval_chunks").exists()


def test_the_weights_digest_changes_with_any_one_weight():
    import torch

    from lit_entropy.callbacks.evaluation import weights_digest

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)
    before = weights_digest(model)
    assert weights_digest(model) == before
    with torch.no_grad():
        model[1].bias[2] += 2**-7  # one bf16 step at 1.0 (the bias starts at 0: any change shows)
    assert weights_digest(model) != before


def test_the_weights_digest_of_a_sharded_model_is_its_whole_weights():
    """FSDP2 on one rank holds DTensors (no ``.numpy()``): the digest reads their whole tensors and equals the
    unsharded model's. In a subprocess: it opens a process group."""
    import os
    import subprocess
    import sys

    code = """
import os, torch, torch.distributed as dist
from torch.distributed.fsdp import fully_shard
from lit_entropy.callbacks.evaluation import weights_digest
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("PORT", "29541"))
dist.init_process_group("gloo", rank=0, world_size=1)
torch.manual_seed(0); sharded = torch.nn.Sequential(torch.nn.Linear(4, 4))
torch.manual_seed(0); plain = torch.nn.Sequential(torch.nn.Linear(4, 4))
fully_shard(sharded)
assert type(next(sharded.parameters())).__name__ == "DTensor"
print(weights_digest(sharded) == weights_digest(plain))
dist.destroy_process_group()
"""
    from tests.helpers import ROOT
    from tests.integration.test_several_machines import free_port

    env = {**os.environ, "PORT": str(free_port())}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr[-3000:]


def test_resume_and_chunk_size_are_checked_at_start_up():
    from lit_entropy.callbacks.evaluation import PeriodicEvalCallback

    with pytest.raises(ValueError, match=r"callbacks.eval.prompts_per_chunk=0 must be >= 1"):
        PeriodicEvalCallback(prompts_per_chunk=0)
