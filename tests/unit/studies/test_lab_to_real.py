"""The lab's verdicts against the real model's (studies/lab_to_real.py)."""

from __future__ import annotations

from studies.lab_to_real import compare_verdicts, outcome
from studies.verdicts import Claim, Verdict


def v(method: str, metric: str, interval: tuple[float, float] | None, label: str, direction: str = "higher") -> Verdict:
    mean = None if interval is None else sum(interval) / 2
    return Verdict(method, Claim(metric, direction), [0, 1, 2], mean, interval, 0.1, label, "")


def test_each_outcome():
    rep = v("repo_r", "h_final", (0.2, 0.4), "reproduced")
    assert outcome(rep, v("repo_r", "h_final", (0.1, 0.3), "reproduced")) == "transfers"
    assert outcome(rep, v("repo_r", "h_final", (-0.3, -0.1), "not reproduced")) == "reverses"
    assert outcome(rep, v("repo_r", "h_final", (-0.1, 0.3), "not reproduced")) == "real LM cannot separate"
    assert outcome(v("kl_cov", "pass@64", (-0.1, 0.3), "not reproduced"),
                   v("kl_cov", "pass@64", (0.1, 0.2), "reproduced")) == "separates on the real LM only"
    assert outcome(rep, v("repo_r", "h_final", (0.1, 0.3), "not tested at this dose")) == "not comparable"
    assert outcome(rep, v("repo_r", "h_final", None, "no verdict")) == "not comparable"
    neg = v("dapo", "h_final", (-0.2, -0.1), "not reproduced")
    assert outcome(neg, v("dapo", "h_final", (-0.5, 0.1), "not reproduced")) == "transfers"
    assert outcome(neg, v("dapo", "h_final", (0.1, 0.2), "reproduced")) == "reverses"
    lower = v("x", "h_final", (0.1, 0.2), "not reproduced", direction="lower")  # a claim of lower, against it
    assert outcome(lower, v("x", "h_final", (-0.2, -0.1), "reproduced", direction="lower")) == "reverses"


def test_the_table_pairs_the_labs_metrics_with_the_held_out_ones():
    lab = [v("repo_r", "pass@64", (0.1, 0.3), "reproduced"), v("repo_r", "pass@1", (-0.2, -0.1), "not reproduced"),
           v("sapo", "pass@1", (0.0, 0.1), "not reproduced")]  # sapo: not in the real study
    real = [v("repo_r", "ho_pass@64", (-0.05, 0.02), "not reproduced"), v("repo_r", "ho_pass@1", (-0.3, -0.1),
                                                                           "not reproduced")]
    table = compare_verdicts(lab, real).splitlines()
    assert table[2] == ("| repo_r | pass@64 > GRPO | +0.200, reproduced | -0.015, not reproduced | "
                        "**real LM cannot separate** |")
    assert table[3].endswith("| **transfers** |") and len(table) == 4


def test_the_labs_verdicts_rebuilt_from_its_shipped_records_are_the_pages(tmp_path):
    """records_verdicts picks and judges the lab's shipped records again: the labels of docs/results.md's table."""
    from pathlib import Path

    from studies.protocol_phases import records_verdicts

    root = Path(__file__).resolve().parents[3]
    got = records_verdicts(root / "conf" / "protocol" / "collapse.yaml",
                           root / "docs" / "data" / "collapse_protocol.json.gz")
    page = (root / "docs" / "results.md").read_text()
    table = page[page.index("| method | dose | claim | Δ vs GRPO 2.5e-4 |"):].split("\n\n")[0].splitlines()[2:]
    rows = [[c.strip() for c in r.strip("|").split("|")] for r in table]
    assert [(g.method, g.claim.metric, g.label) for g in got] == [
        (r[0], r[2].split()[0], r[5].strip("*")) for r in rows]


def test_the_real_lm_protocols_report_sets_the_labs_verdicts_beside_its_own():
    """real_lm.yaml names the lab; lab_table rebuilds the lab's verdicts from the shipped records and pairs each
    with the real verdict on the held-out metric of the same meaning."""
    from pathlib import Path

    from studies.protocol import load_protocol
    from studies.protocol_phases import lab_table

    protocol = load_protocol(Path(__file__).resolve().parents[3] / "conf" / "protocol" / "real_lm.yaml")
    assert protocol.lab == {"protocol": "conf/protocol/collapse.yaml", "records": "docs/data/collapse_protocol.json.gz"}
    real = [v("dapo", "ho_pass@1", (-0.01, 0.05), "not reproduced"), v("sapo", "ho_pass@1", (0.1, 0.2), "reproduced")]
    block = lab_table(protocol, real).splitlines()
    assert block[0].startswith("**The lab's verdicts beside these** (conf/protocol/collapse.yaml")
    # the lab's dapo row of docs/results.md (+0.049, reproduced); sapo is reproduced on neither side
    assert block[-2] == "| dapo | pass@1 > GRPO | +0.049, reproduced | +0.020, not reproduced | **real LM cannot separate** |"
    assert block[-1].startswith("| sapo | pass@1 > GRPO |") and block[-1].endswith("**reverses** |")
