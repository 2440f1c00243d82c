"""A study's runs as a records file and back (studies/records.py, scripts/study.py --export-records /
--import-records): the imported run reads back to the same summary, dose and figure input as the original."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from torch.utils.tensorboard import SummaryWriter

from lit_entropy.analysis.runs import read_scalars
from studies import bf16_via_fp32
from studies.method_study import run_summary
from studies.protocol_phases import fp32_kernels_line
from studies.records import export_records, import_records
from tests.helpers import CONF, ROOT


def _run(folder: Path, lam: float, t0: float = 1_000.0) -> None:
    """A REPO run of 6 iterations, 2.5 s apart, with a held-out evaluation after iteration 3 and 6, and a tag
    the records do not keep (train/grad_norm)."""
    (folder / ".hydra").mkdir(parents=True)
    cfg = {"algo": {"name": "grpo", "eps_low": 0.2}, "optim": {"lr": 5e-4},
           "callbacks": {"entropy": {"_target_": "callbacks.repo.REPOCallback", "variant": "r", "lam_max": 0.5}}}
    (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["algo=grpo", "callbacks/entropy=repo_r"]))
    writer = SummaryWriter(str(folder / "tensorboard"))
    for i in range(6):
        writer.add_scalar("rollout/entropy", 0.5 - 0.05 * i, i, walltime=t0 + 2.5 * i)
        writer.add_scalar("rollout/accuracy", 0.1 * i, i, walltime=t0 + 2.5 * i)
        writer.add_scalar("control/repo_lambda", lam if i else 0.0, i)
        writer.add_scalar("train/grad_norm", 1.0, i)
        if i in (2, 5):
            writer.add_scalar("eval/pass@1", 0.1 * i, i)
            writer.add_scalar("eval/pass@8", 0.12 * i, i)
    writer.close()
    (folder / "done.json").write_text(json.dumps({"returncode": 0, "seconds": 17.0, "command": ["/abs/train.py"]}))


def test_an_imported_run_summarises_like_the_original(tmp_path: Path) -> None:
    src, dst, f = tmp_path / "study", tmp_path / "elsewhere", tmp_path / "records.json.gz"
    _run(src / "runs" / "grpo+repo_r" / "seed0", lam=0.5)
    _run(src / "runs" / "grpo+repo_r" / "seed1", lam=0.2)
    (src / "runs" / "grpo+repo_r" / "seed2").mkdir()  # unfinished: no done.json, not exported
    assert export_records(src, f) == 2
    assert import_records(f, dst) == (2, 0)
    for seed in (0, 1):
        a, b = (run_summary(d / "runs" / "grpo+repo_r" / f"seed{seed}") for d in (src, dst))
        assert a is not None and b is not None
        assert set(a) == set(b)
        for key, value in a.items():
            assert b[key] == pytest.approx(value, abs=1e-6), key  # s_per_it from the kept wall times
    assert run_summary(dst / "runs" / "grpo+repo_r" / "seed0")["lambda_at_clamp"] == pytest.approx(5 / 6)
    assert run_summary(dst / "runs" / "grpo+repo_r" / "seed0")["s_per_it"] == pytest.approx(2.5)
    assert "train/grad_norm" not in read_scalars(dst / "runs" / "grpo+repo_r" / "seed0")
    assert not (dst / "runs" / "grpo+repo_r" / "seed2").exists()


def test_a_run_stopped_as_diverged_is_still_stopped_after_import(tmp_path: Path) -> None:
    src, dst, f = tmp_path / "study", tmp_path / "elsewhere", tmp_path / "records.json.gz"
    folder = src / "runs" / "grpo+repo_r" / "seed0"
    _run(folder, lam=0.5)
    writer = SummaryWriter(str(folder / "tensorboard"))
    writer.add_scalar("stop/diverged", 1.0, 5)  # callbacks/stop=diverged ended it after iteration 5
    writer.close()
    export_records(src, f)
    import_records(f, dst)
    assert run_summary(dst / "runs" / "grpo+repo_r" / "seed0")["stopped_at"] == 5


def test_a_run_with_bf16_through_fp32_kernels_says_so_after_import_and_others_do_not(tmp_path: Path) -> None:
    src, dst, f = tmp_path / "study", tmp_path / "elsewhere", tmp_path / "records.json.gz"
    _run(src / "runs" / "grpo+repo_r" / "seed0", lam=0.5)
    _run(src / "runs" / "grpo+repo_r" / "seed1", lam=0.5)
    (src / "runs" / "grpo+repo_r" / "seed1" / "study_stdout.log").write_text(
        f"loading\n{bf16_via_fp32.MARKER} bf16 linear layers ...\nmodel: llama\n")
    export_records(src, f)
    with gzip.open(f, "rt") as fh:
        runs = json.load(fh)["runs"]
    assert runs["runs/grpo+repo_r/seed1"]["done"]["bf16_via_fp32"] is True
    assert "bf16_via_fp32" not in runs["runs/grpo+repo_r/seed0"]["done"]  # the older records keep their bytes
    import_records(f, dst)
    got = {seed: run_summary(dst / "runs" / "grpo+repo_r" / f"seed{seed}")["bf16_via_fp32"] for seed in (0, 1)}
    assert got == {0: False, 1: True}
    assert fp32_kernels_line({"grpo+repo_r": {0: {"bf16_via_fp32": False}, 1: {"bf16_via_fp32": True}}}).endswith(
        "the rest of the run as declared): grpo+repo_r seed 1.")
    assert fp32_kernels_line({"grpo": {0: {"bf16_via_fp32": False}}}) == ""


def test_records_keep_no_command_line_or_path(tmp_path: Path) -> None:
    _run(tmp_path / "study" / "runs" / "c" / "seed0", lam=0.5)
    ov = tmp_path / "study" / "runs" / "c" / "seed0" / ".hydra" / "overrides.yaml"  # a resumed run's overrides
    ov.write_text(yaml.safe_dump(["algo=grpo", f"ckpt_path={tmp_path}/study/runs/c/seed0/checkpoints/last.ckpt"]))
    f = tmp_path / "r.json.gz"
    export_records(tmp_path / "study", f)
    text = gzip.open(f, "rt").read()
    assert "/abs/train.py" not in text and str(tmp_path) not in text
    assert json.loads(text)["runs"]["runs/c/seed0"]["done"] == {"returncode": 0, "seconds": 17.0}
    assert json.loads(text)["runs"]["runs/c/seed0"]["overrides"] == ["algo=grpo"]


def test_import_keeps_finished_runs_and_replaces_half_written_ones(tmp_path: Path) -> None:
    _run(tmp_path / "a" / "runs" / "c" / "seed0", lam=0.5)
    _run(tmp_path / "a" / "runs" / "c" / "seed1", lam=0.5)
    f = tmp_path / "r.json.gz"
    export_records(tmp_path / "a", f)
    _run(tmp_path / "b" / "runs" / "c" / "seed0", lam=0.9)  # finished here already: kept as is
    (tmp_path / "b" / "runs" / "c" / "seed1").mkdir(parents=True)
    (tmp_path / "b" / "runs" / "c" / "seed1" / "stale.txt").write_text("interrupted")
    assert import_records(f, tmp_path / "b") == (1, 1)
    assert run_summary(tmp_path / "b" / "runs" / "c" / "seed0")["lambda_final"] == pytest.approx(0.9)
    assert not (tmp_path / "b" / "runs" / "c" / "seed1" / "stale.txt").exists()


def test_the_nearest_choice_travels_with_the_records_and_a_choice_made_here_stays(tmp_path: Path) -> None:
    """nearest.json is chosen once from the runs of its moment; rebuilt from records that hold later runs, the
    choice could differ, so the records carry the file and an import writes it back (never over one made there)."""
    _run(tmp_path / "a" / "evaluate" / "runs" / "c" / "seed0", lam=0.5)
    f, g = tmp_path / "r.json.gz", tmp_path / "none.json.gz"
    export_records(tmp_path / "a", g)
    with gzip.open(g, "rt") as fh:
        assert "choices" not in json.load(fh)  # a study without a choice: the records' bytes as before
    choice = {"metric": "ho_pass@1", "gaps": {"maxrl": 0.004, "dapo": 0.1}, "methods": ["maxrl"]}
    (tmp_path / "a" / "evaluate" / "nearest.json").write_text(json.dumps(choice))
    export_records(tmp_path / "a", f)
    import_records(f, tmp_path / "b")
    assert json.loads((tmp_path / "b" / "evaluate" / "nearest.json").read_text()) == choice
    (tmp_path / "c" / "evaluate").mkdir(parents=True)
    (tmp_path / "c" / "evaluate" / "nearest.json").write_text('{"methods": ["dapo"]}')
    import_records(f, tmp_path / "c")
    assert json.loads((tmp_path / "c" / "evaluate" / "nearest.json").read_text()) == {"methods": ["dapo"]}


def test_a_file_that_is_not_records_names_itself(tmp_path: Path) -> None:
    f = tmp_path / "other.json.gz"
    with gzip.open(f, "wt") as fh:
        json.dump({"runs": {}}, fh)
    with pytest.raises(ValueError, match="other.json.gz: not a study records file"):
        import_records(f, tmp_path / "out")


def _study_script():
    """``scripts/study.py`` as a module (it is a script, not part of a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_script", ROOT / "scripts" / "study.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_the_study_script_exports_and_imports_records_without_a_phase(tmp_path: Path) -> None:
    import contextlib
    import io

    script = _study_script()
    _run(tmp_path / "a" / "tune" / "runs" / "grpo+none" / "seed100", lam=0.5)
    protocol, f = str(CONF / "protocol" / "collapse.yaml"), tmp_path / "r.json.gz"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert script.main(["--protocol", protocol, "--out", str(tmp_path / "a"), "--export-records", str(f)]) == 0
        assert script.main(["--protocol", protocol, "--out", str(tmp_path / "b"), "--import-records", str(f)]) == 0
    assert "exported 1 runs" in out.getvalue() and "imported 1 runs" in out.getvalue()
    assert (tmp_path / "b" / "tune" / "runs" / "grpo+none" / "seed100" / "done.json").is_file()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(io.StringIO()) as err:
        script.main(["--protocol", protocol, "--out", str(tmp_path / "c"), "--import-records", str(tmp_path / "no")])
    assert "no" in err.getvalue()


def test_the_shipped_records_give_the_verdicts_docs_results_reports(tmp_path: Path) -> None:
    """docs/results.md's collapse verdicts are what the labelling code makes of the shipped records: import them,
    pick, judge, and every row of the page's verdict table (label against the pick and against the control)
    is a row the code writes."""
    from studies.protocol import load_protocol, pick
    from studies.protocol_phases import evaluation_report
    from studies.records import import_records

    protocol = load_protocol(ROOT / "conf" / "protocol" / "collapse.yaml")
    import_records(ROOT / "docs" / "data" / "collapse_protocol.json.gz", tmp_path)
    picks = json.loads(json.dumps(pick(protocol, tmp_path / "tune")))  # as read back from picks.json
    report = evaluation_report(protocol, picks, tmp_path / "evaluate")
    blocks = report.split("\n\n")
    ours = [b for b in blocks if b.startswith("| method | setting | dose | claim")][0].splitlines()[2:]
    control = [b for b in blocks if b.startswith("| method | claim | Δ vs control")][0].splitlines()[2:]
    cells = lambda row: [c.strip() for c in row.strip("|").split("|")]  # noqa: E731
    expected = []
    for a, b in zip(ours, control, strict=True):
        x, y = cells(a), cells(b)
        expected.append([x[0], x[2], x[3].replace(" > baseline", " ↑"), *x[5:8], *y[2:5]])
    page = (ROOT / "docs" / "results.md").read_text()
    table = page[page.index("| method | dose | claim | Δ vs GRPO 2.5e-4 |"):].split("\n\n")[0].splitlines()[2:]
    assert [cells(r) for r in table] == expected
    assert len(expected) == 47  # thirteen methods with three claims (STARE under both rules), SAPO, DPPO-TV, DPPO-KL, Lite
    # PPO, TOPR and TOPR in its paper's setting one, MaxRL two


def test_the_shipped_real_lm_records_rebuild_the_shipped_report_byte_for_byte(tmp_path: Path) -> None:
    """docs/data/real_lm_report.md is what the evaluate phase writes (``<out>/evaluate.md``) from the shipped
    real-LM records on a machine that has only them: imported, picked again from the tuning runs (no
    picks.json: the phase writes it), judged, nothing run. A record added without its report fails here."""
    from studies.protocol import load_protocol
    from studies.protocol_phases import run_phase

    protocol = load_protocol(ROOT / "conf" / "protocol" / "real_lm.yaml")
    import_records(ROOT / "docs" / "data" / "real_lm_protocol.json.gz", tmp_path)
    assert not (tmp_path / "picks.json").exists()
    run_phase(protocol, "evaluate", tmp_path, ROOT / "scripts" / "train.py", run=False, log=lambda _: None)
    assert (tmp_path / "picks.json").is_file()
    assert (tmp_path / "evaluate.md").read_text() == (ROOT / "docs" / "data" / "real_lm_report.md").read_text()


def test_the_evaluate_phase_without_picks_or_finished_tuning_runs_names_what_is_missing(tmp_path: Path) -> None:
    """A protocol with a grid to tune and no picks.json: the evaluate phase says which tuning runs are missing."""
    from studies.protocol import load_protocol
    from studies.protocol_phases import MissingPicks, run_phase

    protocol = load_protocol(ROOT / "conf" / "protocol" / "real_lm.yaml")
    with pytest.raises(MissingPicks, match=r"grpo-lr2e-05 seed 100.*run --phase tune first"):
        run_phase(protocol, "evaluate", tmp_path, ROOT / "scripts" / "train.py", run=False)


def test_the_script_turns_missing_picks_into_a_usage_error(tmp_path: Path) -> None:
    """``scripts/study.py --phase evaluate`` with no picks and no tuning runs exits 2 naming the missing run, no
    traceback."""
    import contextlib
    import io

    script = _study_script()
    args = ["--protocol", str(ROOT / "conf" / "protocol" / "real_lm.yaml"), "--phase", "evaluate",
            "--out", str(tmp_path), "--summarise-only"]
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(io.StringIO()) as err:
        script.main(args)
    assert stop.value.code == 2 and "grpo-lr2e-05 seed 100" in err.getvalue()


def test_the_real_lm_tables_in_docs_results_are_the_shipped_reports() -> None:
    """docs/results.md's real-LM tables (between ``<!-- real-lm:NAME -->`` markers) say what the shipped report says:
    the verdict table is the report's verdicts beside its control's, the cell table a choice of the report's cell
    columns, and the seed-claim, law and lab-to-real tables the report's own. The report is checked against the
    records byte for byte above, so a record added without these tables fails here."""
    report = (ROOT / "docs" / "data" / "real_lm_report.md").read_text().split("\n\n")
    page = (ROOT / "docs" / "results.md").read_text()
    cells = lambda row: [c.strip() for c in row.strip("|").split("|")]  # noqa: E731

    def block(prefix: str) -> list[str]:
        return [b for b in report if b.startswith(prefix)][0].splitlines()

    def on_page(name: str) -> list[str]:
        start = page.index(f"<!-- real-lm:{name} -->\n") + len(f"<!-- real-lm:{name} -->\n")
        return page[start:page.index(f"<!-- /real-lm:{name} -->")].rstrip("\n").splitlines()

    ours, control = block("| method | setting | dose | claim")[2:], block("| method | claim | Δ vs control")[2:]
    expected = []
    for a, b in zip(ours, control, strict=True):
        x, y = cells(a), cells(b)
        assert x[0] == y[0]
        expected.append([x[0], x[2], x[3].replace(" > baseline", " ↑"), *x[5:8], *y[2:5]])
    assert [cells(r) for r in on_page("verdicts")[2:]] == expected

    head = cells(report[0].splitlines()[0])
    shown = cells(on_page("cells")[0])[1:]
    by_cell = {cells(r)[0].split("@", 1)[1]: cells(r) for r in report[0].splitlines()[2:]}
    rows = [cells(r) for r in on_page("cells")[2:]]
    assert sorted(r[0] for r in rows) == sorted(by_cell)
    for r in rows:
        assert r[1:] == [by_cell[r[0]][head.index(c)] for c in shown], r[0]

    for name, prefix in (("claims", "| seed | claim | cell"), ("law", "| cell | seed | law R²"),
                         ("lab", "| method | claim | lab:")):
        assert on_page(name) == block(prefix), name


def test_the_real_lm_preset_is_what_the_verdicts_study_recommends(tmp_path: Path) -> None:
    """``experiment=real_lm`` follows the evidence (issue 77): it is the point the verdicts protocol recommends from
    the shipped records by its declared rule (``recommend``: a method reproduced on both held-out claims, else GRPO;
    while the study is unfinished, GRPO), at GRPO's learning rate calibrated on the tuning split, not the first
    study's, whose calibration read its evaluation problems. Composing the point's algo, controller and overrides
    on top of the preset changes nothing."""
    from studies.protocol_phases import study_recommendation
    from tests.helpers import compose_train

    point = study_recommendation(ROOT / "conf" / "protocol" / "verdicts.yaml",
                                 ROOT / "docs" / "data" / "verdicts_protocol.json.gz")
    assert point.name == "grpo-lr1e-05"  # GRPO's three learning rates finished, this one best; the study under way
    preset = ["experiment=real_lm", "paths.output_dir=unused"]
    algo = point.algo.partition("@")[0]
    as_is = OmegaConf.to_container(compose_train(preset))
    with_point = OmegaConf.to_container(compose_train(
        [*preset, f"algo={algo}", f"callbacks/entropy={point.controller}", *point.overrides]))
    assert as_is == with_point and as_is["optim"]["lr"] == 1e-5
    readme = " ".join((ROOT / "README.md").read_text().split())  # and the README recommends nothing yet
    assert "no method is recommended until the verdicts study" in readme


def test_the_shipped_verdicts_records_rebuild_the_tuning_report_and_its_table_in_docs_results(tmp_path: Path) -> None:
    """docs/data/verdicts_tune.md is what the verdicts study's tune phase writes (``<out>/tune.md``: the picks and
    every finished tuning run) from the shipped records alone, nothing run; docs/results.md's tuning table (between
    ``<!-- verdicts:tuning -->`` markers) is its run-by-run table. A record added without both fails here."""
    from studies.protocol import load_protocol
    from studies.protocol_phases import run_phase

    protocol = load_protocol(ROOT / "conf" / "protocol" / "verdicts.yaml")
    import_records(ROOT / "docs" / "data" / "verdicts_protocol.json.gz", tmp_path)
    run_phase(protocol, "tune", tmp_path, ROOT / "scripts" / "train.py", run=False, log=lambda _: None)
    shipped = (ROOT / "docs" / "data" / "verdicts_tune.md").read_text()
    assert (tmp_path / "tune.md").read_text() == shipped
    [runs] = [b for b in shipped.split("\n\n") if b.startswith("| cell | seed | tuning pass@1")]
    page = (ROOT / "docs" / "results.md").read_text()
    start = page.index("<!-- verdicts:tuning -->\n") + len("<!-- verdicts:tuning -->\n")
    assert page[start:page.index("<!-- /verdicts:tuning -->")].rstrip("\n") == runs.rstrip("\n")


def test_the_shipped_verdicts_records_rebuild_the_finished_evaluation_runs_in_docs_results(tmp_path: Path) -> None:
    """docs/results.md's table of the evaluation runs finished so far (between ``<!-- verdicts:evaluation -->``
    markers) is the run-by-run table the evaluation phase prints from the shipped records, nothing run (while
    tuning: the ready methods' finished runs, marked no claim; after it: the report's run-by-run block)."""
    from studies.protocol import load_protocol
    from studies.protocol_phases import run_phase

    protocol = load_protocol(ROOT / "conf" / "protocol" / "verdicts.yaml")
    import_records(ROOT / "docs" / "data" / "verdicts_protocol.json.gz", tmp_path)
    text = run_phase(protocol, "evaluate", tmp_path, ROOT / "scripts" / "train.py", run=False, while_tuning=True,
                     log=lambda _: None)
    tables = [b for b in text.split("\n\n") if b.startswith("| cell | seed | ")]
    expected = tables[0] if tables else "No evaluation run has finished yet."
    page = (ROOT / "docs" / "results.md").read_text()
    start = page.index("<!-- verdicts:evaluation -->\n") + len("<!-- verdicts:evaluation -->\n")
    assert page[start:page.index("<!-- /verdicts:evaluation -->")].rstrip("\n") == expected


def test_a_record_keeps_every_methods_dose_tag() -> None:
    """A dose read from a tag the record drops would read *not tested at this dose* once imported."""
    from studies.dose import METHOD_DOSE
    from studies.records import KEPT_TAGS

    for method, dose in METHOD_DOSE.items():
        for tag in filter(None, (dose.tag, *dose.legacy_tags)):
            assert tag.startswith(KEPT_TAGS), (method, tag)


def test_machines_commits_and_per_problem_counts_travel_with_the_records(tmp_path: Path) -> None:
    from studies.method_study import machine, record_attempt

    src, dst, f, g = tmp_path / "study", tmp_path / "elsewhere", tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    new, old = src / "runs" / "grpo" / "seed0", src / "runs" / "grpo" / "seed1"
    _run(new, lam=0.5)
    _run(old, lam=0.5)
    record_attempt(new, ROOT / "scripts" / "train.py")
    attempts = record_attempt(new, ROOT / "scripts" / "train.py")  # resumed once: two attempts
    assert len(attempts) == 2 and attempts[0]["machine"] == machine() and " cores" in machine()
    (new / "done.json").write_text(json.dumps({"returncode": 0, "seconds": 17.0, "attempts": attempts}))
    counts = {"held_out": {"sampled": {"problem": ["1+1", "2+2"], "num_samples": [4, 4], "num_correct": [1, 3]}}}
    (new / "eval_problems").mkdir()
    (new / "eval_problems" / "iteration-0003.json").write_text(json.dumps({"iteration": 3, "splits": counts}))
    (new / "eval_problems" / "iteration-0006.json").write_text(json.dumps(
        {"iteration": 6, "splits": {"held_out": {"sampled": {**counts["held_out"]["sampled"], "num_correct": [2, 4]}}}}))
    export_records(src, f)
    with gzip.open(f, "rt") as fh:
        runs = json.load(fh)["runs"]
    rec = runs["runs/grpo/seed0"]
    assert [a["machine"] for a in rec["done"]["attempts"]] == [machine()] * 2
    assert set(rec["done"]["attempts"][0]) == {"machine", "commit"}  # no start times: records rebuild byte for byte
    held = rec["problems"]["splits"]["held_out"]["sampled"]
    assert rec["problems"]["iteration"] == 6 and held["num_correct"] == [2, 4] and len(held["problems_sha"]) == 16
    assert "problems" not in runs["runs/grpo/seed1"] and "attempts" not in runs["runs/grpo/seed1"]["done"]
    import_records(f, dst)
    export_records(dst, g)  # an imported study exports the same records
    with gzip.open(g, "rt") as fh:
        again = json.load(fh)["runs"]
    assert again["runs/grpo/seed0"]["problems"] == rec["problems"]
    assert again["runs/grpo/seed0"]["done"]["attempts"] == rec["done"]["attempts"]


def test_the_shipped_base_model_score_is_on_the_splits_every_evaluation_run_reads() -> None:
    """docs/data/verdicts_base_model.json: its problems are the evaluation splits at the evaluation's seed and sizes
    (what callbacks.eval scores in every verdicts run; retention, and held_out once scored), and its pass@k follow
    from its own per-problem counts."""
    from lit_entropy.metrics.passk import pass_at_k
    from lit_entropy.tasks.arithmetic import ArithmeticConfig
    from lit_entropy.tasks.prompts import ArithmeticPrompts

    base = json.loads((ROOT / "docs" / "data" / "verdicts_base_model.json").read_text())
    protocol = yaml.safe_load((CONF / "protocol" / "verdicts.yaml").read_text())
    source = ArithmeticPrompts(task=ArithmeticConfig(tuning_share=0.5, retention=True), answer_format="number")
    assert set(protocol["eval"]["problems"]) == {"held_out", "retention"}
    assert "retention" in base["per_problem"] and set(base["per_problem"]) <= set(protocol["eval"]["problems"])
    for split in base["per_problem"]:  # the held-out split joins when scored (three hours of a core on AVX2)
        size = protocol["eval"]["problems"][split]
        problems = [p.text for p in source.problems(size, 0, split)]
        assert base["per_problem"][split]["sampled"]["problem"] == problems, split
        for mode, n, ks in (("sampled", protocol["eval"]["final_n"], protocol["eval"]["final_ks"]), ("greedy", 1, [1])):
            counts = base["per_problem"][split][mode]
            assert counts["num_samples"] == [n] * size
            for k in ks:
                mean = sum(pass_at_k(n, c, k) for c in counts["num_correct"]) / size
                assert base[f"eval/{split}/{mode}/pass@{k}"] == pytest.approx(mean, abs=1e-9), (split, mode, k)
