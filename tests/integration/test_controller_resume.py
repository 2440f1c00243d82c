"""Every entropy controller resumes exactly (in-process, tests/harness.py): 2 iterations, resume from that
checkpoint to 4, equal to 4 straight — every TensorBoard scalar, the final checkpoint (weights, optimizer,
RNG, every callback's state) and the controller's live ``state_dict``.

The resume starts from the straight run's own ``iteration-0002.ckpt`` (``callbacks.checkpoint.keep_iterations``):
no separate two-iteration run. A real process killed mid-run and resumed is test_exact_resume.py."""

from __future__ import annotations

import re

import pytest
import torch

from lit_entropy.callbacks.dashboard import LAYOUT
from lit_entropy.utils.checkpointing import check_resumable
from lit_entropy.utils.log_steps import on_optimizer_step
from tests.helpers import CONF
from tests.integration.test_exact_resume import max_state_diff

pytestmark = pytest.mark.integration

K, J = 4, 2
LAB = ["batch.prompts_per_iter=8", "batch.group_size=4", "rollout.max_new_tokens=16", "reward.mode=inline",
       "batch.micro_batch_size=16", "callbacks.checkpoint.keep_iterations=true", "~callbacks.progress",
       "+trainer.enable_progress_bar=false", "rollout.engine.show_progress=false"]
CONTROLLERS = sorted(p.stem for p in (CONF / "callbacks" / "entropy").glob("*.yaml"))
ENGINE = {"entrocraft_hard": "vllm"}  # the lab default on the shared vLLM engine; the rest on HF generate
NEEDS = {"gppo_beta": ["algo=ce_gppo"]}  # refused under an objective without CE-GPPO's betas


def _overrides(name: str) -> list[str]:
    rollout = ENGINE.get(name, "hf")
    lab = LAB if rollout == "vllm" else LAB[:-1]
    return [*lab, f"rollout={rollout}", f"callbacks/entropy={name}", *NEEDS.get(name, [])]


def _controller(run):
    """The run's entropy controller (None for callbacks/entropy=none)."""
    target = (run.cfg.callbacks.get("entropy") or {}).get("_target_", "")
    found = [cb for cb in run.trainer.callbacks if target and target.endswith("." + type(cb).__name__)]
    return found[0] if found else None


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    return a == b or (a != a and b != b)  # NaN == NaN


def test_every_controller_config_is_covered():
    assert set(CONTROLLERS) >= {"none", "entrocraft", "entrocraft_hard", "adapo", "repo_r", "repo_d",
                                "adaptive_bonus", "entropic", "gppo_beta", "stare", "aepo"}


@pytest.mark.parametrize("name", CONTROLLERS)
def test_resume_from_iteration_2_equals_4_straight(tmp_path, harness, name):
    straight = harness.fit([*_overrides(name), f"trainer.max_epochs={K}"], tmp_path, smoke=False, name="straight")
    ckpt = straight.ckpt(J)
    meta = check_resumable(ckpt)
    assert meta["kind"] == "iteration" and meta["iteration"] == J
    if name != "none":
        saved = torch.load(ckpt, map_location="cpu", weights_only=True)["callbacks"]
        assert any(type(_controller(straight)).__name__ in k for k in saved), saved.keys()
        # The dashboard's knob chart (lit_entropy/callbacks/dashboard.py) draws this controller's knob.
        knob_chart = LAYOUT["entropy"]["the controller's knob"][1]
        assert any(re.match(r, t) for r in knob_chart for t in straight.scalars), sorted(straight.scalars)
    resumed = harness.fit([*_overrides(name), f"trainer.max_epochs={K}", f"ckpt_path={ckpt}"], tmp_path,
                          smoke=False, name="resumed")
    # The resumed run's first step: the optimizer step after the checkpoint's for train/*, the iteration after it
    # for the per-iteration tags (lit_entropy/utils/log_steps.py).
    first = {True: meta["step"], False: meta["iteration"] + 1}
    want = {t: [(s, v) for s, v in p if s >= first[on_optimizer_step(t)]] for t, p in straight.scalars.items()
            if not t.startswith("time/")}  # wall-clock seconds differ by nature
    got = {t: p for t, p in resumed.scalars.items() if not t.startswith("time/")}
    assert {t for t, p in want.items() if p} == set(got), set(got) ^ {t for t, p in want.items() if p}
    differ = {t: (got[t], want[t]) for t in got if got[t] != want[t]}
    assert not differ, differ
    for tag in ("rollout/entropy", "train/loss"):
        assert len(got[tag]) >= K - J, tag
    state_diff, keys = max_state_diff(resumed.last_ckpt, straight.last_ckpt)
    assert not keys, f"final checkpoints differ in {keys[:20]} (max |Δ| {state_diff:.3g})"
    if name != "none":
        live, want_state = _controller(resumed).state_dict(), _controller(straight).state_dict()
        assert want_state and _same(live, want_state), (live, want_state)
