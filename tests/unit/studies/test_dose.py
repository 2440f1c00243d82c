"""Each method's dose read back from a run's scalars and config (studies/dose.py), and the study
table's dose column with its *not tested at this dose* mark."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from torch.utils.tensorboard import SummaryWriter

from studies.dose import (
    NOT_TESTED,
    dose_cell,
    dose_given,
    dose_metrics,
    dose_series,
    method_dose,
    method_from_config,
    method_of,
    window_means,
)
from studies.method_study import StudyPlan, run_dir, run_summary, summarise


def test_selection_and_clip_fractions_are_step_means() -> None:
    d = dose_metrics({"train/masked_frac_clip_cov": [0.002, 0.004], "train/clipfrac_high": [0.0, 0.01, 0.02]})
    assert d["sel_frac"] == pytest.approx(0.003) and d["clipfrac_high"] == pytest.approx(0.01)
    assert d["lambda_mean"] is None and d["m_neg_frac"] is None


def test_controller_trajectories_and_clamps() -> None:
    cfg = {"callbacks": {"entropy": {"eps_min": 0.2, "eps_max": 0.4, "lam_max": 0.5}}}
    d = dose_metrics({"control/eps_high": [0.28, 0.3, 0.4, 0.4], "control/repo_lambda": [0.0, 0.01, -0.5, 0.5]}, cfg)
    assert d["eps_high_mean"] == pytest.approx(0.345) and d["eps_high_final"] == pytest.approx(0.4)
    assert d["eps_at_clamp"] == pytest.approx(0.5)  # 2 of 4 iterations at eps_max
    assert d["lambda_mean"] == pytest.approx((0.01 + 0.5 + 0.5) / 4) and d["lambda_final"] == pytest.approx(0.5)
    assert d["lambda_at_clamp"] == pytest.approx(0.5)  # |lambda| = lam_max twice
    assert dose_metrics({"control/eps_high": [0.3]})["eps_at_clamp"] is None  # no config: clamps unknown
    m = dose_metrics({"control/direction": [-1.0, -1.0, 0.0, 1.0], "control/entrocraft_kept_frac": [0.5, 0.7, 1, 1]})
    assert (m["m_neg_frac"], m["m_pos_frac"], m["m_active_frac"]) == (0.5, 0.25, 0.75)
    assert m["kept_frac"] == pytest.approx(0.8) and m["dropped_frac"] == pytest.approx(0.2)


def test_each_method_has_its_own_dose_and_threshold() -> None:
    summary = {"sel_frac": 0.002, "clipfrac_high": 0.0007, "lambda_mean": 0.3, "dropped_frac": 0.0,
               "m_active_frac": 0.9}
    assert method_of("clip_cov@clip_cov-rho0.01", "none") == "clip_cov" and method_of("dapo", "adapo") == "adapo"
    assert method_dose("clip_cov", summary) == 0.002 and method_dose("adapo", summary) == 0.0007
    assert method_dose("repo_r", summary) == 0.3 and method_dose("grpo", summary) is None
    assert dose_given("clip_cov", [0.002, 0.004]) is True
    assert dose_given("adapo", [0.0007, 0.0009]) is False  # ADAPO at ppo_epochs=1: ~0.07 % of tokens clipped
    assert dose_given("entrocraft", [0.0]) is False and dose_given("entrocraft_hard", [0.9]) is True
    assert dose_given("grpo", [None]) is None
    assert dose_cell("adapo", [0.0007, 0.0009]) == f"0.0008 ± 0.0001 ({NOT_TESTED})"
    assert dose_cell("clip_cov", [0.003]) == "0.0030" and dose_cell("grpo", [None, None]) == "—"


def test_method_from_a_runs_config() -> None:
    repo = {"callbacks": {"entropy": {"_target_": "lit_entropy.callbacks.repo.REPOCallback", "variant": "d"}}}
    hard = {"callbacks": {"entropy": {"_target_": "lit_entropy.callbacks.entrocraft.EntrocraftCallback",
                                      "mode": "hard"}}}
    assert method_from_config(repo) == "repo_d" and method_from_config(hard) == "entrocraft_hard"
    assert method_from_config({"callbacks": {"entropy": None}, "algo": {"name": "clip_cov", "selection": "clip_cov"}}) \
        == "clip_cov"
    assert method_from_config({"algo": {"name": "dapo", "selection": None}}) == "dapo"


def _run(folder: Path, tags: dict[str, list[float]], cfg: dict | None = None) -> None:
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i in range(4):
        writer.add_scalar("rollout/entropy", 0.5, i)
        writer.add_scalar("rollout/accuracy", 0.2, i)
        for tag, xs in tags.items():
            writer.add_scalar(tag, xs[i], i)
    writer.close()
    if cfg is not None:
        (folder / ".hydra").mkdir(parents=True)
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))


def test_the_study_table_has_a_dose_column_and_a_legend(tmp_path: Path) -> None:
    plan = StudyPlan(algos=["grpo", "clip_cov"], controllers=["none"], seeds=[0], cells=[("grpo", "repo_r")])
    _run(run_dir(tmp_path, "grpo", "none", 0), {"train/clipfrac_high": [0.01] * 4})
    _run(run_dir(tmp_path, "clip_cov", "none", 0), {"train/masked_frac_clip_cov": [0.0002] * 4})
    _run(run_dir(tmp_path, "grpo", "repo_r", 0), {"control/repo_lambda": [0.05] * 4},
         {"callbacks": {"entropy": {"lam_max": 0.05}}})
    s = run_summary(run_dir(tmp_path, "grpo", "repo_r", 0))
    assert s["lambda_mean"] == pytest.approx(0.05) and s["lambda_at_clamp"] == 1.0
    table, cells = summarise(plan, tmp_path, ("h_final", "dose", "lambda_at_clamp"))
    rows = {line.split(" | ")[0] + "|" + line.split(" | ")[1]: line for line in table.splitlines()[2:5]}
    assert rows["| grpo|none"].endswith("| — | — |")  # the baseline has no dose
    assert f"0.0002 ({NOT_TESTED})" in rows["| clip_cov|none"]
    assert "| 0.0500 | 1.000 |" in rows["| grpo|repo_r"]
    assert "dose of `clip_cov`: fraction of response tokens detached" in table
    assert cells["grpo+repo_r"][0]["dose"] == pytest.approx(0.05)


def test_a_new_controller_brings_its_dose_method_name_and_refusals_as_class_data(monkeypatch):
    """Subclassing registers a controller; the studies read its dose and method name from the class, start-up
    reads its refused losses: no list elsewhere to edit."""
    from lit_entropy.callbacks.base import CONTROLLERS, Dose, EntropyController
    from lit_entropy.train import check_controllers_and_algo

    monkeypatch.setattr("lit_entropy.callbacks.base.CONTROLLERS", dict(CONTROLLERS))

    class TwoModes(EntropyController):
        knobs = ("eps_high",)
        methods = {"two_a": Dose("clipfrac_high", "tokens at the upper clip"), "two_b": None}
        refused_losses = ("cispo",)
        refusal = "cannot act under algo.loss={loss} (algo={algo})"

        @classmethod
        def method_of(cls, node):
            return "two_b" if node.get("mode") == "b" else "two_a"

    import lit_entropy.callbacks.base as base
    from studies import dose

    registry = base.CONTROLLERS
    assert registry["TwoModes"] is TwoModes
    monkeypatch.setattr(dose, "CONTROLLERS", registry)
    assert dose.method_doses()["two_a"].key == "clipfrac_high" and "two_b" not in dose.method_doses()
    node = {"_target_": "my_pkg.two.TwoModes", "mode": "b"}
    assert dose.method_from_config({"callbacks": {"entropy": node}}) == "two_b"
    with pytest.raises(ValueError, match=r"TwoModes cannot act under algo.loss=cispo \(algo=cispo\)"):
        check_controllers_and_algo([TwoModes()], SimpleNamespace(loss="cispo", name="cispo"))
    check_controllers_and_algo([TwoModes()], SimpleNamespace(loss="ppo", name="grpo"))


def test_doses_declared_with_a_tag_are_that_tags_run_mean() -> None:
    """STARE, AEPO (controllers) and TOPR (a policy loss) declare their dose with the tag it is the mean of; the
    study reads it without a line of its own for each (studies/dose.py)."""
    from studies.dose import METHOD_DOSE

    for method, tag in {"stare": "train/stare_reweighted_frac", "aepo": "control/aepo_rows_frac",
                        "topr": "train/clipfrac_low"}.items():
        rule = METHOD_DOSE[method]
        assert rule.tag == tag
        d = dose_metrics({tag: [0.0, 0.02, 0.04]})
        assert d[rule.key] == pytest.approx(0.02)
        assert method_dose(method, d) == pytest.approx(0.02)
    assert dose_metrics({})["stare_reweighted_frac"] is None  # not logged: no dose
    # records of earlier runs (and rank: iteration) logged STARE's dose per iteration under the controller's tag
    old = {"control/stare_reweighted_frac": [0.0, 0.03]}
    assert dose_metrics(old)["stare_reweighted_frac"] == pytest.approx(0.015)
    assert dose_series("stare", old) == [("control/stare_reweighted_frac", [0.0, 0.03])]
    both = {**old, "train/stare_reweighted_frac": [0.1]}
    assert dose_metrics(both)["stare_reweighted_frac"] == pytest.approx(0.1)  # the current tag first


def test_the_dose_series_is_the_scalar_behind_each_methods_dose() -> None:
    s = {"train/masked_frac_kl_cov": [0.01, 0.02], "train/clipfrac_high": [0.1, 0.3], "control/repo_lambda": [-0.01, 1.0],
         "control/direction": [0.0, -1.0, 1.0], "control/entrocraft_kept_frac": [1.0, 0.75]}
    assert dose_series("kl_cov", s) == [("train/masked_frac_kl_cov", [0.01, 0.02])]
    assert dose_series("dapo", s) == [("train/clipfrac_high", [0.1, 0.3])]
    assert dose_series("repo_r", s) == [("control/repo_lambda", [-0.01, 1.0])]  # signed
    assert dose_series("entrocraft_hard", s) == [("m ≠ 0", [0.0, 1.0, 1.0])]
    assert dose_series("entrocraft", s) == [("1 − kept", [0.0, 0.25])]
    assert dose_series("grpo", s) == [] and dose_series("repo_d", {}) == []
    adapo = dose_series("adapo", {"train/clipfrac_high": [0.2], "control/eps_high": [0.28]})
    assert adapo == [("train/clipfrac_high", [0.2]), ("control/eps_high", [0.28])]


def test_window_means_map_steps_to_iterations() -> None:
    per_iteration = [float(i) for i in range(1, 7)]  # 6 iterations, windows of 4: iterations 1-4 and 5-6
    assert window_means(per_iteration, 6, 4) == [2.5, 5.5]
    per_step = [x for i in per_iteration for x in (i, i + 1)]  # two optimizer steps an iteration
    assert window_means(per_step, 6, 4) == [3.0, 6.0]
    assert window_means([], 6, 4) == [] and window_means([1.0], 0, 4) == []
