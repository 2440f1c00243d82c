"""Checks that keep the documentation true to the repository: links, anchors and config names.

* Every relative Markdown link in ``README.md`` and ``docs/**/*.md`` points at a file or folder that
  exists, and its ``#anchor`` (when the target is a Markdown file) matches one of that file's headings,
  slugged the way GitHub slugs them.
* Every config name the README uses in a code span or in a command of a fenced shell block exists:
  ``group=option`` (and ``group/sub=option``) names a file of ``conf/<group>/``, and a dotted key
  ``group.key.sub`` is a key of the composed config with some option of its group.

Pure functions over text, so that a test can feed them a deliberately broken string.
"""

from __future__ import annotations

import fnmatch
import functools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from tests.helpers import CONF, ROOT

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SKIP_SCHEMES = ("http://", "https://", "mailto:", "ftp://")

# Tokens that look like config names: `group=option`, `group/sub=option`, `group.key(.sub)*(=value)`.
OPTION = re.compile(r"^\+{0,2}([a-z_]+(?:/[a-z_]+)*)=(.+)$")
DOTTED = re.compile(r"^\+{0,2}([a-z_]+(?:\.[A-Za-z_0-9]+)+)(?:=(.*))?$")
FILE_SUFFIXES = (".py", ".md", ".yaml", ".yml", ".json", ".jsonl", ".png", ".ckpt", ".txt", ".toml", ".sh", ".cfg")
COMMANDS = ("scripts/train.py", "scripts/evaluate.py", "lit-entropy-train", "lit-entropy-eval", "make train",
            "make smoke", "lit_entropy.cli.train")


# ---- headings and anchors ----------------------------------------------------------------------------
def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text (links and inline markup reduced to their text),
    lower-cased, punctuation removed (letters, digits, ``_``, ``-`` and spaces stay), spaces as ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line that is not inside a fenced code block."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def fenced_blocks(text: str) -> Iterator[tuple[str, list[tuple[int, str]]]]:
    """(info string, [(line number, line)]) of every fenced code block."""
    info, lines = None, []
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if match:
            if info is None:
                info, lines = line.strip()[3:].strip(), []
            else:
                yield info, lines
                info = None
            continue
        if info is not None:
            lines.append((number, line))


def anchors(text: str) -> set[str]:
    """Every anchor a Markdown text defines: its headings' slugs (a repeated slug gets ``-1``, ``-2``, …
    as on GitHub) and explicit ``<a name=...>`` / ``<a id=...>`` tags."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    for _, line in outside_fences(text):
        out.update(HTML_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        if slug in seen:
            seen[slug] += 1
            out.add(f"{slug}-{seen[slug]}")
        else:
            seen[slug] = 0
            out.add(slug)
    return out


# ---- links ---------------------------------------------------------------------------------------------
def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every Markdown link or image outside code blocks and code spans."""
    for number, line in outside_fences(text):
        for match in LINK.finditer(CODE_SPAN.sub("", line)):
            yield number, match.group(1)


def dangling_links(path: Path, text: str | None = None, root: Path = ROOT) -> list[str]:
    """Problems with the relative links of one Markdown file, as ``file:line: target: why``."""
    text = path.read_text(encoding="utf-8") if text is None else text
    problems = []
    for number, target in links(text):
        if target.startswith(SKIP_SCHEMES):
            continue
        where = f"{path.relative_to(root) if path.is_relative_to(root) else path}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path.resolve()
        if file_part.startswith("/"):
            problems.append(f"{where}: an absolute path")
            continue
        if not dest.exists():
            problems.append(f"{where}: no such file or folder")
            continue
        if not dest.is_relative_to(root.resolve()):
            problems.append(f"{where}: points outside the repository")
            continue
        if anchor:
            if dest.suffix != ".md":
                problems.append(f"{where}: an anchor into a file that is not Markdown")
                continue
            own = text if dest == path.resolve() else dest.read_text(encoding="utf-8")
            if anchor not in anchors(own):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def markdown_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


# ---- config names ----------------------------------------------------------------------------------------
def config_groups(conf: Path = CONF) -> dict[str, set[str]]:
    """Each config group (a folder of ``conf/``, nested ones as ``callbacks/entropy``) -> its options."""
    return {
        str(folder.relative_to(conf)): {p.stem for p in folder.glob("*.yaml")}
        for folder in sorted(p for p in conf.rglob("*") if p.is_dir())
        if any(folder.glob("*.yaml"))
    }


def _key_paths(node: object, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield from _key_paths(value, path)


def _package(path: Path, conf: Path) -> str:
    """Where a group file's keys land: its ``# @package`` header, else its folder (``callbacks.entropy``)."""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"#\s*@package\s+(\S+)", line)
        if match:
            return "" if match.group(1) == "_global_" else match.group(1)
        if line.strip() and not line.startswith("#"):
            break
    return ".".join(path.parent.relative_to(conf).parts)


@functools.cache
def known_keys(conf: Path = CONF) -> frozenset[str]:
    """Every dotted key a run can have: those of ``train.yaml`` and ``evaluate.yaml`` composed with their
    defaults, and those of every option file of every group, each at its package (a key such as
    ``model.name_or_path`` exists only with ``model=hf``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    keys: set[str] = set()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        for config_name in ("train", "evaluate"):
            cfg = compose(config_name=config_name, overrides=["paths.output_dir=/tmp/docs-check"])
            keys.update(_key_paths(OmegaConf.to_container(cfg, resolve=False, throw_on_missing=False)))
    for group in config_groups(conf):
        if group in ("hydra",):
            continue
        for path in sorted((conf / group).glob("*.yaml")):
            node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
            if not isinstance(node, dict):
                continue
            node.pop("defaults", None)
            package = _package(path, conf)
            for part in reversed(package.split(".") if package else []):
                node = {part: node}
            keys.update(_key_paths(node))
    return frozenset(keys)


def _tokens(fragment: str) -> Iterator[str]:
    for token in fragment.split():
        token = token.strip("'\"`,;").rstrip(":")
        while token.endswith(")") and token.count(")") > token.count("("):
            token = token[:-1]
        while token.startswith("(") and token.count("(") > token.count(")"):
            token = token[1:]
        if token.startswith("ARGS="):  # make train ARGS="group=option ..."
            token = token[len("ARGS="):].strip("'\"")
        if token:
            yield token


def readme_config_tokens(text: str) -> Iterator[tuple[int, str]]:
    """(line number, token) of every whitespace-separated token of the README that may be a config name:
    tokens of inline code spans, and of the commands in fenced shell blocks that run a training or
    evaluation entry point."""
    for number, line in outside_fences(text):
        for match in CODE_SPAN.finditer(line):
            for token in _tokens(match.group(2)):
                yield number, token
    for info, lines in fenced_blocks(text):
        if info not in ("", "bash", "sh", "shell", "console"):
            continue
        for number, line in lines:
            command = line.split("  #", 1)[0].split(" # ", 1)[0]
            if any(name in command for name in COMMANDS):
                for token in _tokens(command):
                    yield number, token


def _values(value: str) -> list[str]:
    value = value.strip("'\"[]")
    return [v.strip() for v in re.split(r"[,|]", value) if v.strip()]


def unknown_config_names(text: str, groups: dict[str, set[str]] | None = None,
                         keys: Iterable[str] | None = None) -> list[str]:
    """Config names in ``text`` (README-style Markdown) that do not exist, as ``line N: token: why``."""
    groups = config_groups() if groups is None else groups
    keys = known_keys() if keys is None else frozenset(keys)
    roots = {k.split(".", 1)[0] for k in keys}
    problems = []
    for number, token in readme_config_tokens(text):
        if "<" in token or "..." in token or "…" in token or token.endswith(FILE_SUFFIXES):
            continue
        option = OPTION.match(token)
        if option and option.group(1) in groups:
            group, value = option.group(1), option.group(2)
            glob = re.fullmatch(r"glob\((.*)\)", value.strip("'\""))
            for name in _values(glob.group(1) if glob else value):
                if name in ("null", "none") and name not in groups[group] and group in ("experiment", "debug"):
                    continue
                if not fnmatch.filter(groups[group], name):
                    problems.append(f"line {number}: {token}: {group}={name} names no file conf/{group}/{name}.yaml")
            continue
        dotted = DOTTED.match(token)
        if dotted and dotted.group(1).split(".", 1)[0] in roots:
            key = dotted.group(1)
            if key not in keys:
                problems.append(f"line {number}: {token}: {key} is not a key of the composed config")
            continue
        if option and "/" not in option.group(1) and "." not in option.group(1) and option.group(1) in roots:
            if option.group(1) not in keys:  # a top-level key such as seed= or ckpt_path=
                problems.append(f"line {number}: {token}: {option.group(1)} is not a key of the composed config")
        elif option and option.group(1).split("/", 1)[0] in roots and option.group(1) not in groups:
            problems.append(f"line {number}: {token}: {option.group(1)} is not a config group")
    return problems


def our_columns(text: str) -> str:
    """``text`` with each Markdown table cut to the columns that hold our names: those whose header says
    ``lit-entropy`` or starts with ``our`` (a page that maps other projects' keys to ours). Tables without
    such a column and lines outside tables are kept whole."""
    out: list[str] = []
    keep: list[int] | None = None
    for line in text.splitlines():
        if not line.lstrip().startswith("|"):
            keep = None
            out.append(line)
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if keep is None:  # a header row
            ours = [i for i, c in enumerate(cells) if "lit-entropy" in c or c.lower().startswith("our")]
            keep = ours or list(range(len(cells)))
        out.append(" | ".join(cells[i] for i in keep if i < len(cells)))
    return "\n".join(out)
