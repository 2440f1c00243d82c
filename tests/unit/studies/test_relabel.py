"""The earlier studies' claims relabelled under the declared rule (studies/relabel.py): constructed cases a reader
can check by hand, then the shipped pages rebuilt byte for byte from the shipped records."""

from __future__ import annotations

import pytest

from studies.dose import NOT_TESTED
from studies.relabel import (
    DECLARED,
    PairedClaim,
    floor_table,
    records_claims,
    relabel,
    relabel_report,
    summary,
)
from studies.verdicts import NOT_REPRODUCED, REPRODUCED, IntervalRule, bootstrap_interval
from tests.helpers import ROOT

BOOTSTRAP = IntervalRule()


def _claim(diffs: list[float], name: str = "m", direction: str = "higher", old: str = REPRODUCED,
           dosed: bool | None = True) -> PairedClaim:
    return PairedClaim(name, f"pass@1 {'>' if direction == 'higher' else '<'} grpo", direction,
                       tuple(range(len(diffs))), tuple(diffs), old, dosed)


def test_three_agreeing_seeds_give_one_eighth_and_are_never_reproduced() -> None:
    """The degenerate case: three seeds that agree in sign. The old bootstrap interval is [min, max] (it excludes 0:
    *reproduced*); the exact test gives 1/8 whatever the sizes, over α = 0.05 even alone and uncorrected."""
    diffs = [0.05, 0.11, 0.30]
    lo, hi = bootstrap_interval(diffs)
    assert lo == pytest.approx(0.05) and hi == pytest.approx(0.30)  # the resamples' extremes: all-min, all-max
    for rule in (DECLARED, IntervalRule(kind="sign_flip", correction="none")):
        [r] = relabel([_claim(diffs)], rule)
        assert r.p == 0.125 and r.p_adjusted == 0.125 and r.label == NOT_REPRODUCED
    family = relabel([_claim([0.05 * (i + 1), 0.1, 9.0], f"m{i}") for i in range(31)])  # 31 such claims
    assert {r.p for r in family} == {0.125} and {r.p_adjusted for r in family} == {1.0}
    assert all(r.label == NOT_REPRODUCED for r in family)
    s = summary(family)
    assert s["claims"] == 31 and s["old_reproduced"] == 31 and s["old_survive"] == [] and not s["can_survive"]
    assert s["seeds_needed"] == 10 and s["raw_under_alpha"] == []


def test_ten_positive_seeds_survive_holm_at_24_claims() -> None:
    """The verdicts study's plan: 10 seeds, 24 claims. Ten positive differences give p = 1/1024, and Holm's every
    step gives 24/1024 = 0.0234 <= 0.05: all 24 are reproduced. One contrary seed of the smallest size gives
    2/1024, and 24·2/1024 = 0.047 still passes."""
    claims = [_claim([0.01 * (k + 1) for k in range(10)], f"m{i}") for i in range(24)]
    rows = relabel(claims)
    assert all(r.p == 1 / 1024 and r.p_adjusted == pytest.approx(24 / 1024) for r in rows)
    assert all(r.label == REPRODUCED for r in rows)
    one_contrary = [-0.01, *[0.01 * (k + 2) for k in range(9)]]
    rows = relabel([_claim(one_contrary, f"m{i}") for i in range(24)])
    assert all(r.p == 2 / 1024 and r.p_adjusted == pytest.approx(48 / 1024) for r in rows)
    assert all(r.label == REPRODUCED for r in rows)
    assert summary(rows)["can_survive"] and summary(rows)["seeds_needed"] == 9


def test_holm_across_the_family_and_the_claimed_direction() -> None:
    """Holm by hand on three claims: p = 1/32 (five seeds up), 1/32 (five down, claimed lower), 1/8 (three up):
    adjusted 3/32, 3/32 (the running max of 2/32 and 3/32), 1/8 · 1 = 0.125; none under 0.05. Alone, the
    five-seed claim's 1/32 passes uncorrected: Holm is what removes it."""
    up5, down5, up3 = [0.1, 0.2, 0.3, 0.4, 0.5], [-0.1, -0.2, -0.3, -0.4, -0.5], [0.1, 0.2, 0.3]
    rows = relabel([_claim(up5, "a"), _claim(down5, "b", "lower"), _claim(up3, "c")])
    assert [r.p for r in rows] == [1 / 32, 1 / 32, 1 / 8]
    assert [r.p_adjusted for r in rows] == pytest.approx([3 / 32, 3 / 32, 1 / 8])
    assert all(r.label == NOT_REPRODUCED for r in rows)
    [alone] = relabel([_claim(up5)], IntervalRule(kind="sign_flip", correction="none"))
    assert alone.label == REPRODUCED
    [against] = relabel([_claim(up5, direction="lower")])  # five seeds up, the claim says lower
    assert against.p == 1.0 and against.label == NOT_REPRODUCED
    assert len(summary(rows)["raw_under_alpha"]) == 2


def test_the_dose_rule_stays_and_an_untested_claim_stays_in_the_family() -> None:
    """A method under its dose is *not tested at this dose* whatever its p, and its p still counts in Holm (the
    family is fixed by the protocol); a claim with one paired seed had no verdict and is left out."""
    ten = [0.01 * (k + 1) for k in range(10)]
    claims = [_claim(ten, "dosed"), _claim(ten, "undosed", dosed=False, old=NOT_TESTED), _claim([0.3], "one")]
    rows = relabel(claims)
    assert [r.label for r in rows] == [REPRODUCED, NOT_TESTED, "no verdict"]
    assert rows[0].p_adjusted == pytest.approx(2 / 1024)  # m = 2: the untested claim counts, the 1-seed one not
    assert rows[2].p is None and rows[2].p_adjusted is None and summary(rows)["claims"] == 2


def test_relabel_refuses_an_interval_rule() -> None:
    with pytest.raises(ValueError, match="sign_flip"):
        relabel([_claim([0.1, 0.2, 0.3])], BOOTSTRAP)


def test_the_page_states_the_floor_the_counts_and_both_labels() -> None:
    claims = [_claim([0.1, 0.2, 0.3], "three"), _claim([0.1, 0.2, 0.3, 0.4, 0.5], "five"),
              _claim([-0.1, 0.2, -0.3], "mixed", old=NOT_REPRODUCED)]
    rows = relabel(claims)
    table = floor_table(rows).splitlines()
    assert table[2] == "| 3 | 2 | 0.1250 | 0.3750 | no |"
    assert table[3] == "| 5 | 1 | 0.0312 | 0.0938 | no |"
    page = relabel_report("toy", "conf/protocol/toy.yaml", "docs/data/toy.json.gz", rows, BOOTSTRAP)
    assert page.startswith("# The toy study's claims relabelled under the declared rule\n")
    assert "α/m = 0.05/3 = 0.01667" in page and "needs 6 paired seeds" in page
    assert ("3 claims; the old rule labelled 2 *reproduced*; under the declared rule 0 of them survive, and 0 claims "
            "in all are *reproduced*. The smallest p is 0.0312 (five pass@1 > grpo, 5 seeds; Holm-adjusted 0.0938). "
            "Without the correction, 1 claim has p ≤ 0.05.") in page
    assert "| five | pass@1 > grpo | 5 | +0.300 | 0.0312 | 0.0938 | **not reproduced** | reproduced |" in page
    assert "| mixed | pass@1 > grpo | 3 | -0.067 | 0.7500 | 0.7500 | **not reproduced** | not reproduced |" in page
    assert page.endswith(" |\n")


def test_the_module_writes_the_page_with_paths_from_the_checkout(tmp_path, monkeypatch, capsys) -> None:
    """``python -m studies.relabel PROTOCOL RECORDS PAGE`` writes the page naming the checkout's relative paths,
    whatever the working folder (the records are read by :func:`records_claims`, stubbed here)."""
    import studies.relabel as module

    claims = [_claim([0.1, 0.2, 0.3], "three")]
    monkeypatch.setattr(module, "records_claims", lambda protocol, records: ("toy", BOOTSTRAP, claims))
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "relabel_toy.md"
    assert module.main([str(ROOT / "conf" / "protocol" / "real_lm.yaml"), str(ROOT / "docs" / "data" / "x.json.gz"),
                        str(page)]) == 0
    text = page.read_text()
    assert text == relabel_report("toy", "conf/protocol/real_lm.yaml", "docs/data/x.json.gz", relabel(claims),
                                  BOOTSTRAP)
    assert str(ROOT) not in text
    assert "1 claims, 1 reproduced by the old rule, 0 of them survive" in capsys.readouterr().out


# --------------------------------------------------------------------------------- the shipped records and pages

STUDIES = {"real_lm": ("conf/protocol/real_lm.yaml", "docs/data/real_lm_protocol.json.gz"),
           "collapse": ("conf/protocol/collapse.yaml", "docs/data/collapse_protocol.json.gz")}


@pytest.fixture(scope="module", params=sorted(STUDIES))
def shipped(request):
    name = request.param
    protocol, records = STUDIES[name]
    study, old_rule, claims = records_claims(ROOT / protocol, ROOT / records)
    return name, study, old_rule, claims


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def test_the_shipped_relabel_pages_rebuild_byte_for_byte_and_keep_the_old_labels(shipped) -> None:
    """docs/data/relabel_<study>.md is what ``python -m studies.relabel`` writes from the shipped records; its old
    labels are the study's own (for the real-LM study, its shipped report's verdict and seed-claim tables); and, as
    the docs say, none of the old *reproduced* survives the declared rule at these seed counts."""
    name, study, old_rule, claims = shipped
    protocol, records = STUDIES[name]
    rows = relabel(claims)
    page = relabel_report(study, protocol, records, rows, old_rule)
    assert page == (ROOT / "docs" / "data" / f"relabel_{name}.md").read_text()
    s = summary(rows)
    assert s["old_reproduced"] > 0 and s["old_survive"] == [] and s["survive"] == [] and not s["can_survive"]
    if name == "real_lm":
        report = (ROOT / "docs" / "data" / "real_lm_report.md").read_text().split("\n\n")
        verdicts = [b for b in report if b.startswith("| method | setting | dose | claim")][0].splitlines()[2:]
        seeds = [b for b in report if b.startswith("| seed | claim | cell")][0].splitlines()[2:]
        old = [_cells(r)[-2].strip("*") for r in verdicts] + [_cells(r)[-2].strip("*") for r in seeds]
        assert [c.old for c in claims] == old
        assert [(c.method, c.claim.split()[0]) for c in claims[:len(verdicts)]] == [
            (_cells(r)[0], _cells(r)[3].split()[0]) for r in verdicts]
        assert s["claims"] == 31 and sorted({r.n for r in rows}) == [3, 5]
    else:  # the lab's verdict table in docs/results.md (test_lab_to_real checks it against the records too)
        results = (ROOT / "docs" / "results.md").read_text()
        table = results[results.index("| method | dose | claim | Δ vs GRPO 2.5e-4 |"):].split("\n\n")[0]
        rows_on_page = [_cells(r) for r in table.splitlines()[2:]]
        assert [(c.method, c.claim.split()[0], c.old) for c in claims] == [
            (r[0], r[2].split()[0], r[5].strip("*")) for r in rows_on_page]
        assert s["claims"] == 47 and {r.n for r in rows} == {5}
