"""The real-LM study's tables in docs/results.md, rewritten from the shipped report.

docs/results.md quotes five tables of ``docs/data/real_lm_report.md`` between markers ``<!-- real-lm:NAME -->`` and
``<!-- /real-lm:NAME -->``: the verdicts (the report's verdict table beside its table against the fp32 control), the
cells (the columns the page's own header names, one row per cell of the report), and the seed-claim, law and
lab-to-real tables as the report has them. When a finished run joins the records the report changes, and
:func:`rewrite_real_lm_tables` brings the page's tables to it; the prose around them stays the author's.

    python -m studies.results_page docs/data/real_lm_report.md docs/results.md

``tests/unit/studies/test_records.py`` checks the page against the report independently of this module.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TABLES = ("verdicts", "cells", "claims", "law", "lab")
"""The marked tables of docs/results.md's real-LM section, in page order."""

_REPORT_BLOCKS = {"claims": "| seed | claim | cell", "law": "| cell | seed | law R²", "lab": "| method | claim | lab:"}
"""Tables copied as they are: the first line each starts with in the report."""


def _cells(row: str) -> list[str]:
    return [c.strip() for c in row.strip().strip("|").split("|")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _block(report: list[str], prefix: str) -> list[str]:
    found = [b for b in report if b.startswith(prefix)]
    if not found:
        raise ValueError(f"the report has no table starting {prefix!r}")
    return found[0].splitlines()


def _marked(page: str, name: str) -> tuple[int, int]:
    """Start and end offsets of the table between the markers of ``name``."""
    opening, closing = f"<!-- real-lm:{name} -->\n", f"<!-- /real-lm:{name} -->"
    if opening not in page or closing not in page:
        raise ValueError(f"the page has no {opening.strip()} … {closing} markers")
    start = page.index(opening) + len(opening)
    return start, page.index(closing, start)


def real_lm_tables(report_text: str, page: str) -> dict[str, list[str]]:
    """Each marked table's lines as the report says them. The cell table keeps the page's header (its choice of
    the report's columns; the first, ``cell``, is the report's ``algo`` column without its algorithm) and its
    order of cells, with cells new to it after them."""
    report = report_text.split("\n\n")
    tables: dict[str, list[str]] = {}

    ours = _block(report, "| method | setting | dose | claim")
    control = _block(report, "| method | claim | Δ vs control")[2:]
    verdicts = ["| method | dose | claim | Δ vs GRPO | 95 % interval | **label** | Δ vs fp32 GRPO (control) | "
                "95 % interval | label vs control |", "|---|---|---|---|---|---|---|---|---|"]
    if len(ours) - 2 != len(control):
        raise ValueError("the report's verdict and control tables have different rows")
    for a, b in zip(ours[2:], control, strict=True):
        x, y = _cells(a), _cells(b)
        if x[0] != y[0]:
            raise ValueError(f"verdict row {x[0]!r} beside control row {y[0]!r}")
        verdicts.append(_row([x[0], x[2], x[3].replace(" > baseline", " ↑"), *x[5:8], *y[2:5]]))
    tables["verdicts"] = verdicts

    start, end = _marked(page, "cells")
    header = page[start:end].splitlines()[:2]
    shown = _cells(header[0])[1:]
    cell_lines = report[0].splitlines()
    columns = _cells(cell_lines[0])
    missing = [c for c in shown if c not in columns]
    if missing:
        raise ValueError(f"the page's cell table names columns the report lacks: {missing}")
    by_cell = {_cells(r)[0].split("@", 1)[1]: _cells(r) for r in cell_lines[2:]}
    order = [n for n in (_cells(r)[0] for r in page[start:end].splitlines()[2:]) if n in by_cell]
    order += [n for n in by_cell if n not in order]  # the page's order, then cells new to it
    tables["cells"] = header + [_row([n, *(by_cell[n][columns.index(c)] for c in shown)]) for n in order]

    for name, prefix in _REPORT_BLOCKS.items():
        tables[name] = _block(report, prefix)
    return tables


def rewrite_real_lm_tables(report_text: str, page: str) -> str:
    """The page with every marked table replaced by the report's; everything outside the markers unchanged."""
    for name, lines in real_lm_tables(report_text, page).items():
        start, end = _marked(page, name)
        page = page[:start] + "\n".join(lines) + "\n" + page[end:]
    return page


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report", type=Path, help="the study's report (docs/data/real_lm_report.md)")
    ap.add_argument("page", type=Path, help="the page with the marked tables (docs/results.md)")
    args = ap.parse_args(argv)
    page = args.page.read_text()
    new = rewrite_real_lm_tables(args.report.read_text(), page)
    if new != page:
        args.page.write_text(new)
    print(f"{args.page}: " + ("tables rewritten from the report" if new != page else "tables already the report's"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
