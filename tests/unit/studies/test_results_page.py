"""docs/results.md's real-LM tables rewritten from the report (studies/results_page.py)."""

from __future__ import annotations

import pytest

from studies.results_page import TABLES, rewrite_real_lm_tables
from tests.helpers import ROOT

REPORT = (ROOT / "docs" / "data" / "real_lm_report.md").read_text()
PAGE = (ROOT / "docs" / "results.md").read_text()


def _table(page: str, name: str) -> str:
    start = page.index(f"<!-- real-lm:{name} -->\n")
    return page[start:page.index(f"<!-- /real-lm:{name} -->", start)]


def test_the_shipped_page_is_a_fixed_point() -> None:
    """The shipped page already quotes the shipped report (test_records checks that independently), so a rewrite
    changes nothing: the writer builds exactly the tables that test accepts."""
    assert rewrite_real_lm_tables(REPORT, PAGE) == PAGE


def test_a_stale_table_is_brought_to_the_report_and_nothing_else_moves() -> None:
    """A page whose tables hold old numbers, a dropped cell row and a dropped verdict row gets the report's tables
    back; the prose between them is untouched."""
    stale = PAGE
    for name in TABLES:
        lines = _table(stale, name).splitlines(keepends=True)
        stale = stale.replace("".join(lines), "".join(lines[:-1]))  # the last row gone
    first_cell_row = _table(stale, "cells").splitlines(keepends=True)[3]
    stale = stale.replace(first_cell_row, first_cell_row.replace(" ± ", " ± 9", 1), 1)  # an old number
    assert first_cell_row not in stale
    assert stale != PAGE
    assert rewrite_real_lm_tables(REPORT, stale) == PAGE


def test_a_column_the_report_lacks_is_named() -> None:
    broken = PAGE.replace("| held-out pass@64 | transfer pass@1 |", "| held-out pass@65 | transfer pass@1 |", 1)
    with pytest.raises(ValueError, match="held-out pass@65"):
        rewrite_real_lm_tables(REPORT, broken)


def test_missing_markers_are_named() -> None:
    with pytest.raises(ValueError, match="real-lm:law"):
        rewrite_real_lm_tables(REPORT, PAGE.replace("<!-- real-lm:law -->\n", ""))
