"""Every entropy controller closes the loop on the lab (real Trainer, vLLM), and resumes exactly."""

from __future__ import annotations

import math

import pytest
import torch

from tests.helpers import read_scalars
from tests.integration.test_train_smoke import run_train

pytestmark = pytest.mark.integration

CONTROLLERS = {
    "entrocraft": "control/band_low",
    "entrocraft_hard": "control/direction",
    "adapo": "control/eps_high",
    "repo_r": "control/repo_lambda",
    "repo_d": "control/repo_lambda",
    "adaptive_bonus": "control/entropy_coef",
    "entropic": "control/pic_alpha",
    "gppo_beta": "control/gppo_beta_high",
}
NEEDS = {"gppo_beta": ["algo=ce_gppo"]}  # the objective a controller's knob needs


@pytest.mark.parametrize("name", sorted(CONTROLLERS))
def test_controller_closed_loop_smoke(tmp_path, name):
    run_train(tmp_path, f"callbacks/entropy={name}", "rollout=hf", *NEEDS.get(name, []))
    scalars = read_scalars(tmp_path / "run")
    values = [v for _, v in scalars[CONTROLLERS[name]]]
    assert len(values) == 3 and all(math.isfinite(v) for v in values)
    assert all(math.isfinite(v) for _, v in scalars["control/target_entropy"])
    assert all(math.isfinite(v) for _, v in scalars["train/loss"])


def test_two_controllers_on_one_knob_fail_at_start_up(tmp_path):
    import subprocess
    import sys

    from tests.helpers import ROOT

    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "debug=smoke", "algo=entropy_bonus",
           "callbacks/entropy=adaptive_bonus", f"paths.log_dir={tmp_path}", f"hydra.run.dir={tmp_path / 'run'}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "entropy_coef" in proc.stderr and "AdaptiveEntropyBonusCallback" in proc.stderr


@pytest.mark.parametrize("name", ["adapo", "entropic"])
def test_resume_mid_run_restores_controller_state_bit_for_bit(tmp_path, name):
    """Two iterations, stop, resume to four == four uninterrupted; the checkpoint holds the state."""
    common = [f"callbacks/entropy={name}", "rollout=hf", "trainer.max_epochs=4"]
    full, part = tmp_path / "full", tmp_path / "part"
    run_train(full, *common)
    run_train(part, *common[:-1], "trainer.max_epochs=2")
    ckpt = part / "run" / "checkpoints" / "last.ckpt"
    state = torch.load(ckpt, map_location="cpu", weights_only=False)["callbacks"]
    assert any(k.endswith("Callback") or "Callback" in k for k in state), state.keys()
    resumed = tmp_path / "resumed"
    run_train(resumed, *common, f"ckpt_path={ckpt}")
    a, b = read_scalars(full / "run"), read_scalars(resumed / "run")
    tag = CONTROLLERS[name]
    full_vals = [v for _, v in a[tag]]
    resumed_vals = [v for _, v in b[tag]]
    assert resumed_vals == full_vals[2:]  # iterations 3 and 4, exactly
    assert [v for _, v in b["rollout/entropy"]] == [v for _, v in a["rollout/entropy"]][2:]


def test_entrocraft_hard_lever_moves_lab_entropy_the_designed_way(tmp_path):
    """The lab's default controller has a lever with the designed sign (docs/controllers/entrocraft.md).

    The full lab (800-step warm start, 128 prompts x 8) for 6 iterations with the direction forced by a
    constant band far away: RAFT++ every iteration (m = +1) must leave entropy well below NSR every
    iteration (m = -1). Measured: 0.399 vs 0.492 at iteration 5.
    """
    import subprocess
    import sys

    from tests.helpers import ROOT

    finals = {}
    for name, band in {"raft": "[0.0,0.01]", "nsr": "[2.0,2.1]"}.items():
        run = tmp_path / name
        cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "trainer.max_epochs=6",
               "callbacks/entropy=entrocraft_hard", "callbacks.entropy.band.kind=constant",
               f"callbacks.entropy.band.start={band}", f"paths.log_dir={tmp_path}", f"hydra.run.dir={run}"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        scalars = read_scalars(run)
        direction = {v for _, v in scalars["control/direction"]}
        assert direction == ({1.0} if name == "raft" else {-1.0})
        finals[name] = [v for _, v in sorted(scalars["rollout/entropy"])][-1]
    assert finals["nsr"] > finals["raft"] + 0.03, finals
