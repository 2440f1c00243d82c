"""The README's commands compose as printed: every ``scripts/train.py`` line of its shell blocks (continuation lines
joined, ``-m`` sweeps expanded) and every ``make train`` with its ``ARGS``, in a block or a code span, goes through the
command line's override check (what ``scripts/train.py`` runs first), Hydra's composition of the full command line
and the start-up checks a run makes before its warm start: the model, objective, optimizer, batch, correction,
engine and callbacks built from the config, and the checks across them. Stronger than the check that each name
exists (tests/docs/test_docs.py): a combination that cannot compose, or a value a class refuses, fails here.
Nothing is trained, so the commands for a GPU or several processes are checked too."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest

from tests.doc_checks import CODE_SPAN, fenced_blocks, outside_fences
from tests.helpers import ROOT, compose_train

README = ROOT / "README.md"
MAKE_TRAIN = re.compile(r"^make train\b(?:\s+ARGS=(\"[^\"]*\"|'[^']*'|\S+))?")


def readme_commands(text: str) -> list[tuple[int, list[str]]]:
    """(line number, the Hydra arguments) of every training command of ``text``: ``python scripts/train.py ...``
    lines of shell blocks (with their continuation lines, comments dropped) and ``make train [ARGS="..."]`` in a
    shell block or a code span."""
    found = []
    for info, body in fenced_blocks(text):
        if info not in ("bash", "sh", "shell", "console"):
            continue
        joined: list[tuple[int, str]] = []
        for number, line in body:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((number, line.strip()))
        for number, line in joined:
            words = shlex.split(line, comments=True)
            if "scripts/train.py" in words:
                found.append((number, words[words.index("scripts/train.py") + 1:]))
            elif (args := _make_train_args(line)) is not None:
                found.append((number, args))
    for number, line in outside_fences(text):
        for match in CODE_SPAN.finditer(line):
            if (args := _make_train_args(match.group(2).strip())) is not None:
                found.append((number, args))
    return found


def _make_train_args(line: str) -> list[str] | None:
    match = MAKE_TRAIN.match(line)
    if not match:
        return None
    return shlex.split(shlex.split(match.group(1))[0]) if match.group(1) else []


def expand_sweeps(args: list[str]) -> list[list[str]]:
    """The runs of a command line: itself, or with ``-m`` each combination of its comma sweeps."""
    if "-m" not in args and "--multirun" not in args:
        return [args]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = [a for a in args if a not in ("-m", "--multirun")]
    choices = []
    for item, override in zip(items, OverridesParser.create().parse_overrides(items), strict=True):
        if override.is_sweep_override():
            choices.append([f"{override.get_key_element()}={v}" for v in override.sweep_string_iterator()])
        else:
            choices.append([item])
    return [list(run) for run in itertools.product(*choices)]


def start_up_checks(args: list[str], output_dir: str) -> None:
    """What ``scripts/train.py`` does with ``args`` before anything is started or downloaded."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from lit_entropy.cli import config_dir
    from lit_entropy.cli.overrides import check
    from lit_entropy.objectives.rollout_correction import check_with_algo
    from lit_entropy.train import (
        build_sampler,
        check_batch_and_algo,
        check_controllers_and_algo,
        check_knob_owners,
        instantiate_callbacks,
    )

    check(args, config_dir(), "train")
    cfg = compose_train([*args, f"paths.output_dir={output_dir}"])
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
    instantiate(cfg.model)
    algo, _, batch = instantiate(cfg.algo), instantiate(cfg.optim), instantiate(cfg.batch)
    check_batch_and_algo(batch, algo)
    if "correction" in cfg:
        check_with_algo(instantiate(cfg.correction), algo)
    build_sampler(cfg)
    callbacks = instantiate_callbacks(cfg.get("callbacks"))
    check_knob_owners(callbacks, algo)
    check_controllers_and_algo(callbacks, algo)


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))


def test_the_readme_has_its_composing_examples():
    lines = [" ".join(args) for _, args in COMMANDS]
    assert len(COMMANDS) >= 12, lines
    for expected in ("callbacks/entropy=none", "debug=smoke", "trainer=fsdp trainer.accelerator=gpu trainer.devices=8",
                     "-m callbacks/entropy=none,entrocraft_hard,entrocraft", "experiment=real_lm"):
        assert any(expected in line for line in lines), expected


@pytest.mark.parametrize(("line", "args"), COMMANDS, ids=[f"line{n}" for n, _ in COMMANDS])
def test_a_readme_command_composes_and_passes_the_start_up_checks(line, args, tmp_path):
    for run in expand_sweeps(args):
        try:
            start_up_checks(run, str(tmp_path))
        except (Exception, SystemExit) as err:
            pytest.fail(f"README.md:{line}: python scripts/train.py {shlex.join(run)}\n{type(err).__name__}: {err}")


# ---- the extraction and the checks catch what they are meant to catch ---------------------------------------
def test_readme_commands_joins_continuations_drops_comments_and_finds_make_train():
    text = "\n".join([
        "Try `make train ARGS=\"algo=dapo seed=1\"` or `make train`.",
        "```bash",
        "python scripts/train.py algo=kl_cov   # a comment",
        "python scripts/train.py 'model.lora={r: 8, alpha: 16}' \\",
        "    optim.lr=1e-3 # LoRA",
        "make train ARGS='callbacks/entropy=none'",
        "make test",
        "```",
        "```python",
        "python scripts/train.py not=this",
        "```",
    ])
    assert readme_commands(text) == [(3, ["algo=kl_cov"]), (4, ["model.lora={r: 8, alpha: 16}", "optim.lr=1e-3"]),
                                      (6, ["callbacks/entropy=none"]), (1, ["algo=dapo", "seed=1"]), (1, [])]


def test_expand_sweeps():
    assert expand_sweeps(["algo=dapo"]) == [["algo=dapo"]]
    assert expand_sweeps(["-m", "callbacks/entropy=none,adapo", "seed=0,1"]) == [
        ["callbacks/entropy=none", "seed=0"], ["callbacks/entropy=none", "seed=1"],
        ["callbacks/entropy=adapo", "seed=0"], ["callbacks/entropy=adapo", "seed=1"]]


@pytest.mark.parametrize(("args", "message"), [
    (["algo=kl_covv"], "the group algo has no option 'kl_covv'"),
    (["rollout.temprature=0.8"], "unknown key 'rollout.temprature'"),
    (["batch.group_size=abc"], "group baselines need an integer"),  # a value the class refuses
    (["algo=w_reinforce", "batch.dynamic_sampling=true"], "has no baseline"),  # a combination refused at start-up
])
def test_start_up_checks_refuse_a_broken_command(args, message, tmp_path):
    with pytest.raises((Exception, SystemExit), match=message):
        start_up_checks(args, str(tmp_path))
