"""The documentation stays true to the repository: no dangling link or anchor, no config name in the
README that does not exist, a README short enough to read. The checkers themselves are tested on
deliberately broken text, so that a check that can never fail is caught too."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doc_checks import (
    anchors,
    config_groups,
    dangling_links,
    github_slug,
    known_keys,
    markdown_files,
    our_columns,
    unknown_config_names,
)
from tests.helpers import ROOT

README = ROOT / "README.md"
README_MAX_LINES = 250


def test_readme_is_at_most_250_lines():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; move detail to docs/"


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dangling_link_or_anchor(path):
    assert dangling_links(path) == []


def test_readme_names_only_config_groups_options_and_keys_that_exist():
    assert unknown_config_names(README.read_text(encoding="utf-8")) == []


def test_the_trl_and_verl_mapping_names_only_our_keys_that_exist():
    text = (ROOT / "docs" / "from_trl_verl.md").read_text(encoding="utf-8")
    assert unknown_config_names(our_columns(text)) == []


def test_our_columns_keeps_only_the_columns_with_our_names():
    table = "| what | TRL | lit-entropy |\n|---|---|---|\n| clip | `epsilon` | `algo.eps_lowww` |\n\nprose `algo.kl_coef`"
    kept = our_columns(table)
    assert "epsilon" not in kept and "algo.eps_lowww" in kept and "prose" in kept
    assert [p.split(": ")[1] for p in unknown_config_names(kept)] == ["algo.eps_lowww"]


def test_the_new_pages_exist_and_are_linked_from_the_readme():
    text = README.read_text(encoding="utf-8")
    for page in ("docs/from_trl_verl.md", "docs/custom_task.md", "docs/results.md", "docs/design.md"):
        assert (ROOT / page).is_file(), page
        assert f"]({page}" in text, f"README does not link {page}"


def test_no_user_facing_page_names_a_path_of_a_particular_machine():
    for path in markdown_files():
        text = path.read_text(encoding="utf-8")
        for marker in ("/work/", "/home/", "/Users/", "shared/data"):
            assert marker not in text, f"{path.relative_to(ROOT)} mentions {marker!r}"


# ---- the checkers catch what they are meant to catch ----------------------------------------------------
@pytest.mark.parametrize(("heading", "slug"), [
    ("The default run", "the-default-run"),
    ("Entrocraft's lever in the lab", "entrocrafts-lever-in-the-lab"),
    ("Evaluation (pass@k)", "evaluation-passk"),
    ("6.1 The rollout batch", "61-the-rollout-batch"),
    ("The default run after the redesign (2026-11-23)", "the-default-run-after-the-redesign-2026-11-23"),
    ("Overlong filtering (`batch.mask_truncated_completions`)", "overlong-filtering-batchmask_truncated_completions"),
    ("GPPO β — CE-GPPO's gradient scales", "gppo-β--ce-gppos-gradient-scales"),
    ("See [the lab](countdown_lab.md)", "see-the-lab"),
])
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_anchors_number_repeated_headings_and_skip_code_blocks():
    text = "# A\n## Usage\n```bash\n# not a heading\n```\n## Usage\n<a name=\"here\"></a>\n"
    assert anchors(text) == {"a", "usage", "usage-1", "here"}


def test_dangling_links_are_reported(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other page\n## A section\n")
    page = tmp_path / "docs" / "page.md"
    text = "\n".join([
        "# Page",
        "[fine](other.md#a-section) [fine too](#page) [web](https://example.org/x#y) `[code](missing.md)`",
        "[missing file](nothing.md)",
        "[missing anchor](other.md#no-such-section)",
        "[missing local anchor](#nowhere)",
        "```",
        "[in a code block](nothing-either.md)",
        "```",
    ])
    page.write_text(text)
    problems = dangling_links(page, root=tmp_path)
    assert len(problems) == 3, problems
    assert "nothing.md: no such file" in problems[0]
    assert "#no-such-section" in problems[1] and "#nowhere" in problems[2]


def test_unknown_config_names_are_reported():
    groups = config_groups()
    keys = known_keys()
    good = "\n".join([
        "`algo=dapo` and `callbacks/entropy=none`, `'logger=[tensorboard,csv]'`, `experiment=countdown_*`",
        "`algo.kl_coef` / `rollout.engine.dtype=bfloat16`, `model.name_or_path`, `seed=1`, `algo=<preset>`",
        "```bash",
        "python scripts/train.py -m callbacks/entropy=none,entrocraft 'experiment=glob(study_*)'  # a comment",
        "python scripts/evaluate.py eval.n=16 ckpt_path=<run>/checkpoints/last.ckpt",
        "make train ARGS=\"correction=tis\"",
        "```",
    ])
    assert unknown_config_names(good, groups, keys) == []
    bad = "\n".join([
        "`algo=dapo_v2` and `callbacks/entropy=entrocraft_soft`",  # no such option
        "`algo.micro_batch_size`",  # a key that moved to batch/
        "`callbacks/entropee=none`",  # no such group
        "```bash",
        "python scripts/train.py rollout.temprature=0.8 'experiment=glob(nothing_*)'",
        "make train ARGS=\"correction=tls\"",
        "```",
    ])
    problems = unknown_config_names(bad, groups, keys)
    assert len(problems) == 7, problems
    for fragment in ("algo=dapo_v2", "callbacks/entropy=entrocraft_soft", "algo.micro_batch_size",
                     "callbacks/entropee", "rollout.temprature", "nothing_*", "correction=tls"):
        assert any(fragment in p for p in problems), (fragment, problems)


def test_markdown_files_cover_readme_and_every_docs_page():
    files = markdown_files()
    assert files[0] == README and Path(ROOT / "docs" / "design.md") in files


def _table_rows(text: str, heading: str) -> dict[str, list[str]]:
    """First cell -> the other cells, for the table rows of the section under ``heading``."""
    section = text.split(heading + "\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and not set(cells[0]) <= set("-: ") and cells[0]:
            rows[cells[0]] = cells[1:]
    return rows


def test_readme_default_run_table_repeats_results_md():
    readme = _table_rows(README.read_text(encoding="utf-8"), "## What the default run shows")
    results = _table_rows((ROOT / "docs" / "results.md").read_text(encoding="utf-8"), "## The default run")
    figures = {k: v for k, v in readme.items() if k}
    assert len(figures) >= 3
    for name, cells in figures.items():
        if not any(ch.isdigit() for ch in "".join(cells)):
            continue  # the header row
        assert results.get(name) == cells, f"README's {name!r} row differs from docs/results.md's"
