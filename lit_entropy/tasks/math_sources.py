"""Prompt sources for math word problems: any JSONL file, and the named sets in a local data folder.

``JSONLPrompts`` reads a JSONL file once (one JSON object per line), validates every row and serves
prompts deterministically per (iteration, round), scored by its ``answer_rule``: ``math_verify`` (the
default: `math_reward`) or ``integer`` (the generated arithmetic task's verifier, `arithmetic_reward`:
the last ``\\boxed{}`` else the last number, compared as an integer; the gold answers must be integers).

``MathDataset(name)`` knows the field names of the shipped files (``question``/``problem``, answers as
strings, ints or floats; GSM8K answers end with ``#### <number>``) and normalises answers to strings
(``27.0`` -> ``"27"``). Where the files are looked for, first match wins:

1. the ``data_dir`` argument;
2. the ``LIT_ENTROPY_DATA`` environment variable;
3. ``data/`` in the current folder.

The data is never copied into the repository. With ``source="auto"`` (the presets' default) a set whose
file is not found is loaded through Hugging Face ``datasets`` from the hub by its usual id (the optional
``hf`` extra; cached where ``datasets`` caches, ``HF_DATASETS_CACHE``); ``source="hf"`` always loads from
the hub, ``source="local"`` never. ``hub`` overrides the hub id, config, split and fields of the set
(e.g. a local folder of parquet files as ``hub.path``, or ``hub.data_files``).
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

from lit_entropy.tasks.arithmetic import MAX_ANSWER_DIGITS, arithmetic_reward
from lit_entropy.tasks.math_answers import extract_gsm8k, math_reward
from lit_entropy.tasks.prompts import Prompt, PromptSource

__all__ = ["ANSWER_RULES", "DEFAULT_TEMPLATE", "MATH_DATASETS", "JSONLPrompts", "MathDataset", "default_data_dir"]

DEFAULT_TEMPLATE = "{question}\nPut the final answer in \\boxed{}."
"""Prompt template; ``{question}`` is replaced by the question (no other braces are interpreted)."""

R1_ZERO_TEMPLATE = (
    "The user asks a math question and the assistant answers it. The assistant reasons step by step "
    "inside <think> </think>, then writes the final answer in \\boxed{}.\nUser: {question}\nAssistant: <think>"
)
"""A base-model (R1-Zero-style) template: plain text the model continues, no chat template needed."""

NAMED_TEMPLATES = {"boxed": DEFAULT_TEMPLATE, "r1_zero": R1_ZERO_TEMPLATE}
"""``template: r1_zero`` (or ``boxed``) picks one of these by name."""

ANSWER_TRANSFORMS = (None, "gsm8k")
SOURCES = ("auto", "local", "hf")
HUB_KEYS = ("path", "config", "split", "question_field", "answer_field", "answer_transform", "data_files")
DATA_ENV = "LIT_ENTROPY_DATA"


def default_data_dir() -> Path:
    """``$LIT_ENTROPY_DATA`` if set, else ``data/`` in the current folder."""
    env = os.environ.get(DATA_ENV)
    return Path(env).expanduser() if env else Path.cwd() / "data"


_INTEGER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.0+)?")


def _integer_reference(answer: str) -> int:
    """A gold answer as an int (``"1,200"``, ``"-7"``, ``"12.0"`` accepted); ValueError if it is not one."""
    if not _INTEGER.fullmatch(answer):
        raise ValueError("is not an integer")
    value = int(answer.replace(",", "").split(".")[0])
    if len(str(abs(value))) > MAX_ANSWER_DIGITS:
        raise ValueError(f"has more than {MAX_ANSWER_DIGITS} digits, more than the integer verifier reads")
    return value


class _Rule(NamedTuple):
    reward_fn: Callable[..., float]
    """Top-level (picklable) reward."""
    reference: Callable[[str], Any]
    """Gold answer text -> the reference the reward compares with; ValueError when it cannot be one."""
    kwargs: tuple[str, ...] | None
    """The reward_kwargs it takes (None: any)."""


ANSWER_RULES: dict[str, _Rule] = {
    "math_verify": _Rule(math_reward, str, None),
    "integer": _Rule(arithmetic_reward, _integer_reference, ("require_boxed",)),
}
"""``answer_rule`` -> how a source scores: math-verify on the last box (or ``####``), or the arithmetic
task's verifier (the last box else the last number, as an integer)."""
MATH_VERIFY_KWARGS = ("verifier_timeout_s",)
"""math-verify's own reward_kwargs (the presets set them); a rule that does not take them drops them."""


def _rule_kwargs(rule: str, reward_kwargs: dict | None) -> dict:
    """``reward_kwargs`` for ``rule``: math-verify's own dropped where the rule does not take them, any other
    kwarg the rule does not take refused (it would fail every reward call)."""
    kwargs = dict(reward_kwargs or {})
    takes = ANSWER_RULES[rule].kwargs
    if takes is None:
        return kwargs
    kwargs = {k: v for k, v in kwargs.items() if k not in MATH_VERIFY_KWARGS}
    unknown = sorted(set(kwargs) - set(takes))
    if unknown:
        raise ValueError(f"reward_kwargs {unknown} do not apply to answer_rule {rule!r}; it takes {list(takes)}")
    return kwargs


def _normalize_answer(value: Any, transform: str | None) -> str | None:
    """Answer text or None when the value is unusable. Integral floats lose their ``.0``."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return None
        text = str(int(value)) if value.is_integer() else repr(value)
    elif isinstance(value, str):
        text = value.strip()
    else:
        return None
    if transform == "gsm8k":
        return extract_gsm8k(text)
    return text or None


class JSONLPrompts(PromptSource):
    """Questions and gold answers from a JSONL file, scored by math-verify (`math_reward`) or, with
    ``answer_rule="integer"``, by the arithmetic task's verifier (`arithmetic_reward`, int references).

    ``sample`` walks through the rows in a seeded order, epoch after epoch (every row once per pass),
    deterministic in (``seed``, ``iteration``, ``n``): iteration ``i`` takes positions ``[i*n, (i+1)*n)``
    of the stream. Refill rounds (``round > 0``, dynamic sampling) draw a seeded random subset.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        question_field: str = "question",
        answer_field: str = "answer",
        answer_transform: str | None = None,
        template: str = DEFAULT_TEMPLATE,
        seed: int = 1234,
        shuffle: bool = True,
        reward_kwargs: dict | None = None,
        answer_rule: str = "math_verify",
    ) -> None:
        if answer_rule not in ANSWER_RULES:
            raise ValueError(f"answer_rule must be one of {sorted(ANSWER_RULES)}, got {answer_rule!r}")
        if answer_transform not in ANSWER_TRANSFORMS:
            raise ValueError(f"answer_transform must be one of {ANSWER_TRANSFORMS}, got {answer_transform!r}")
        template = NAMED_TEMPLATES.get(template, template)
        if not isinstance(template, str) or "{question}" not in template:
            raise ValueError(f"template must contain '{{question}}', got {template!r}")
        self.path = Path(path)
        self.question_field = question_field
        self.answer_field = answer_field
        self.answer_transform = answer_transform
        self.template = template
        self.seed = seed
        self.shuffle = shuffle
        self.answer_rule = answer_rule
        self.reward_fn = ANSWER_RULES[answer_rule].reward_fn
        self.reward_kwargs = _rule_kwargs(answer_rule, reward_kwargs)
        self._rows = self._load()
        if not self._rows:
            raise ValueError(f"{self.origin}: no rows")
        self._perm_cache: dict[int, list[int]] = {}

    # ---- loading ---------------------------------------------------------------------------------
    @property
    def origin(self) -> str:
        """Where the rows come from (used in error messages)."""
        return str(self.path)

    def _load(self) -> list[tuple[str, Any]]:
        if not self.path.is_file():
            raise FileNotFoundError(f"JSONL file not found: {self.path}")
        with self.path.open(encoding="utf-8") as fh:
            return self._validate(self._json_lines(fh))

    def _json_lines(self, lines: Iterable[str]) -> Iterable[tuple[int, Any]]:
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{self.origin}, line {lineno}: bad JSON ({err.msg})") from None

    def _validate(self, records: Iterable[tuple[int, Any]], where: str = "line") -> list[tuple[str, Any]]:
        rows = []
        for lineno, row in records:
            at = f"{self.origin}, {where} {lineno}"
            if not isinstance(row, dict):
                raise ValueError(f"{at}: expected a JSON object, got {type(row).__name__}")
            for name in (self.question_field, self.answer_field):
                if name not in row:
                    raise ValueError(f"{at}: missing field {name!r} (has {sorted(row)})")
            question = row[self.question_field]
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"{at}: field {self.question_field!r} must be a non-empty string")
            answer = _normalize_answer(row[self.answer_field], self.answer_transform)
            if answer is None:
                why = "has no '#### <answer>' line" if self.answer_transform == "gsm8k" else "is not a usable answer"
                raise ValueError(f"{at}: field {self.answer_field!r} {why}: {str(row[self.answer_field])[:80]!r}")
            try:
                reference = ANSWER_RULES[self.answer_rule].reference(answer)
            except ValueError as err:
                raise ValueError(f"{at}: field {self.answer_field!r} {err} "
                                 f"(answer_rule: {self.answer_rule}): {answer[:80]!r}") from None
            rows.append((question.strip(), reference))
        return rows

    # ---- access ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._rows)

    def _prompt(self, index: int) -> Prompt:
        question, answer = self._rows[index]
        return Prompt(text=self.template.replace("{question}", question), reference=answer)

    def all_prompts(self) -> list[Prompt]:
        """Every row in file order (for evaluation)."""
        return [self._prompt(i) for i in range(len(self._rows))]

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self._rows)))
        if epoch not in self._perm_cache:
            order = list(range(len(self._rows)))
            random.Random(f"{self.seed}:epoch:{epoch}").shuffle(order)
            if len(self._perm_cache) > 4:
                self._perm_cache.clear()
            self._perm_cache[epoch] = order
        return self._perm_cache[epoch]

    def sample(self, n: int, iteration: int, round: int = 0) -> list[Prompt]:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        size = len(self._rows)
        if round > 0:
            rng = random.Random(f"{self.seed}:{iteration}:{round}")
            picks: list[int] = []
            while len(picks) < n:
                picks.extend(rng.sample(range(size), min(size, n - len(picks))))
            return [self._prompt(i) for i in picks]
        start = iteration * n
        out = []
        for pos in range(start, start + n):
            epoch, offset = divmod(pos, size)
            out.append(self._prompt(self._epoch_order(epoch)[offset]))
        return out


@dataclass(frozen=True)
class _Spec:
    file: str
    question_field: str
    answer_field: str
    answer_transform: str | None
    hf_path: str
    hf_config: str | None
    hf_split: str
    hf_question_fields: tuple[str, ...]


MATH_DATASETS: dict[str, _Spec] = {
    "gsm8k_train": _Spec("gsm8k_train.jsonl", "question", "answer", "gsm8k",
                         "openai/gsm8k", "main", "train", ("question",)),
    "gsm8k": _Spec("gsm8k_test.jsonl", "question", "answer", "gsm8k", "openai/gsm8k", "main", "test", ("question",)),
    "math500": _Spec("math500_test.jsonl", "problem", "answer", None,
                     "HuggingFaceH4/MATH-500", None, "test", ("problem",)),
    "aime2024": _Spec("aime2024_test.jsonl", "problem", "answer", None,
                      "HuggingFaceH4/aime_2024", None, "train", ("problem", "question")),
    "aime2025": _Spec("aime2025_test.jsonl", "problem", "answer", None,
                      "math-ai/aime25", None, "test", ("problem", "question")),
    "amc2023": _Spec("amc2023_test.jsonl", "problem", "answer", None,
                     "math-ai/amc23", None, "test", ("question", "problem")),
}
"""Named sets: the file in the data folder, its fields, and the same set on the Hugging Face hub."""


def _with_hub(spec: _Spec, hub: dict, name: str) -> _Spec:
    """``spec`` with the hub settings of a preset (``path``, ``config``, ``split``, fields) replacing its own."""
    unknown = sorted(set(hub) - set(HUB_KEYS))
    if unknown:
        raise ValueError(f"{name}: unknown hub keys {unknown}; known: {list(HUB_KEYS)}")
    if hub.get("answer_transform", spec.answer_transform) not in ANSWER_TRANSFORMS:
        raise ValueError(f"{name}: hub.answer_transform must be one of {ANSWER_TRANSFORMS}")
    q = hub.get("question_field")
    return replace(
        spec,
        hf_path=str(hub.get("path") or spec.hf_path),
        hf_config=hub.get("config", spec.hf_config),
        hf_split=hub.get("split") or spec.hf_split,
        hf_question_fields=(q,) if q else spec.hf_question_fields,
        answer_field=hub.get("answer_field") or spec.answer_field,
        answer_transform=hub.get("answer_transform", spec.answer_transform),
    )


class MathDataset(JSONLPrompts):
    """A named math set (``gsm8k_train``, ``gsm8k`` (test), ``math500``, ``aime2024``, ``aime2025``,
    ``amc2023``) from the shared data folder (see the module docstring) or, with ``source="hf"``,
    from the Hugging Face hub."""

    def __init__(
        self,
        name: str,
        data_dir: str | os.PathLike | None = None,
        template: str = DEFAULT_TEMPLATE,
        seed: int = 1234,
        shuffle: bool = True,
        source: str = "local",
        reward_kwargs: dict | None = None,
        hub: dict | None = None,
        answer_rule: str = "math_verify",
    ) -> None:
        if name not in MATH_DATASETS:
            raise ValueError(f"unknown math dataset {name!r}; choose one of {sorted(MATH_DATASETS)}")
        if source not in SOURCES:
            raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
        self.name = name
        self.spec = _with_hub(MATH_DATASETS[name], hub or {}, name)
        self.data_files = (hub or {}).get("data_files")
        self.data_dir = Path(data_dir).expanduser() if data_dir else default_data_dir()
        path = self.data_dir / self.spec.file
        if source == "auto":
            source = "local" if path.is_file() else "hf"
        self.source = source
        if source == "local" and not path.is_file():
            raise FileNotFoundError(
                f"{name}: {path} not found. Pass data_dir=..., set ${DATA_ENV}, or use source='hf'."
            )
        super().__init__(
            path, question_field=self.spec.question_field, answer_field=self.spec.answer_field,
            answer_transform=self.spec.answer_transform, template=template, seed=seed, shuffle=shuffle,
            reward_kwargs=reward_kwargs, answer_rule=answer_rule,
        )

    @property
    def origin(self) -> str:
        if self.source == "hf":
            return f"hf://{self.spec.hf_path}[{self.spec.hf_split}]"
        return str(self.path)

    def _load(self) -> list[tuple[str, Any]]:
        if self.source == "local":
            return super()._load()
        try:
            import datasets
        except ImportError as err:
            raise ImportError(
                f"MathDataset({self.name!r}, source='hf') needs the `datasets` package "
                "(pip install datasets), or use the local files (source='local')"
            ) from err
        spec = self.spec
        try:
            ds = datasets.load_dataset(spec.hf_path, spec.hf_config, split=spec.hf_split,
                                       data_files=self.data_files)
        except Exception as err:  # datasets raises many kinds; name the set and how to get it locally
            raise RuntimeError(
                f"{self.name}: could not load {self.origin} with `datasets` ({type(err).__name__}: {err}). "
                f"Offline, put {spec.file} in data_dir (or ${DATA_ENV}) or point hub.path at a local copy."
            ) from err
        columns = set(ds.column_names)
        found = [f for f in spec.hf_question_fields if f in columns]
        if not found or spec.answer_field not in columns:
            raise ValueError(f"{self.origin}: expected columns {spec.hf_question_fields} and "
                             f"{spec.answer_field!r}, got {sorted(columns)}")
        self.question_field = found[0]
        return self._validate(enumerate(ds), where="row")
