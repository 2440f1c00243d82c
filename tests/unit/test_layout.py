"""The package's shape: no import cycles between its modules; the studies and the benchmarks outside the wheel,
reading the package through its public surface.

An import inside a function (a lazy import) runs later but still makes its module depend on the target, and an
import under ``if TYPE_CHECKING:`` never runs but still says the module knows the target's types: a cycle through
either is rejected too (it only hides the cycle). The iteration's spine has a direction besides: the loop
(``lit_entropy.iteration``) imports nothing of what calls it or what it calls through a protocol.

All of it reads the source with ``ast`` (nothing is imported). The package is ``lit_entropy/``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from tests.helpers import ROOT

PACKAGE = "lit_entropy"
SOURCES = {PACKAGE: ROOT / "lit_entropy", "studies": ROOT / "studies", "benchmarks": ROOT / "benchmarks"}
STUDIES_MAY_IMPORT = {
    "lit_entropy.analysis.runs",  # finished runs' TensorBoard scalars
    "lit_entropy.analysis.tfevents",  # event files' scalars, read and written (records rebuilt as runs)
    "lit_entropy.callbacks",  # CONTROLLERS and their Dose
    "lit_entropy.cli.train",  # FIT_FINISHED: the line scripts/train.py prints once a run's fit returned
    "lit_entropy.utils.config_path",
    "lit_entropy.diagnostics.entropy_law",
    "lit_entropy.dose",  # Dose, what every kind of method declares
    "lit_entropy.objectives.losses",  # LOSSES and their Dose
    "lit_entropy.utils.log_steps",
    "lit_entropy.objectives.registry",  # SELECTION_RULES
    "lit_entropy.train",  # instantiate_callbacks, for a protocol's preview
    "lit_entropy.policy.precision",  # the slow-half-precision warning, for a study's start-up check
    "lit_entropy.callbacks.evaluation",  # CHUNKS: where a final evaluation keeps its finished chunks (--progress)
}
"""What ``studies/`` may import of the package (docs/design.md §4): the rest is training internals."""


def package_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (a package is its ``__init__``)."""
    modules: dict[str, Path] = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("").parts
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            modules[".".join((prefix, *parts))] = path
    return modules


def module_level_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements that run when the module is imported: not inside functions or classes, and not
    under ``if TYPE_CHECKING:``."""
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test)
            if test not in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                stack += node.body
            stack += node.orelse
        elif isinstance(node, ast.Try | ast.With):
            for block in ("body", "orelse", "finalbody", "handlers"):
                stack += getattr(node, block, [])
        elif isinstance(node, ast.ExceptHandler):
            stack += node.body


def all_imports(tree: ast.Module, type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement of the module, function-level (lazy) ones included; those under
    ``if TYPE_CHECKING:``, which never run, only with ``type_checking``."""
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            type_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom) and (type_checking or id(node) not in type_only):
            yield node


def every_import(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: module-level, function-level and under ``if TYPE_CHECKING:``."""
    return all_imports(tree, type_checking=True)


def imported_modules(name: str, path: Path, modules: dict[str, Path], lazy: bool = False,
                     types: bool = False) -> set[str]:
    """The package modules that importing ``name`` imports directly (their parent packages included,
    except the ones ``name`` itself sits in, which are already being imported); with ``lazy``, also those
    its functions import when they run; with ``types`` too, those it imports for type checking only."""
    own_package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in (every_import if types else all_imports if lazy else module_level_imports)(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        base = node.module or ""
        if node.level:
            anchor = own_package.split(".")[: len(own_package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        targets.add(base)
        targets |= {f"{base}.{alias.name}" for alias in node.names}
    found: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            module = ".".join(parts[:i])
            if module in modules and module != name and not (own_package + ".").startswith(module + "."):
                found.add(module)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def import_graph(lazy: bool = False, types: bool = False) -> dict[str, set[str]]:
    """Module -> the package modules it imports when it is imported (with ``lazy``, or when its functions run;
    with ``types``, also for type checking only)."""
    modules = package_modules()
    return {name: imported_modules(name, path, modules, lazy, types) for name, path in modules.items()}


def part(module: str) -> str:
    """The part of the package a module belongs to: ``lit_entropy.objectives.kl`` -> ``lit_entropy.objectives``."""
    return ".".join(module.split(".")[:2])


def parts_graph(lazy: bool = False, types: bool = False) -> dict[str, set[str]]:
    """The import graph with each sub-package (and each top-level module) collapsed into one node."""
    graph: dict[str, set[str]] = {}
    for module, targets in import_graph(lazy, types).items():
        graph.setdefault(part(module), set())
        for target in targets:
            graph.setdefault(part(target), set())
            if part(target) not in (part(module), PACKAGE):
                graph[part(module)].add(part(target))
    return graph


def describe(found: list[list[str]]) -> str:
    return "\n".join(" <-> ".join(c) for c in found)


def test_the_graph_sees_real_imports():
    graph = import_graph()
    assert "lit_entropy.callbacks.base" in graph and "benchmarks.report" in graph
    assert "lit_entropy.diagnostics.entropy" in graph["lit_entropy.policy.passes"]
    assert "lit_entropy.objectives.policy_loss" in graph["lit_entropy.objectives.kl"]
    assert "lit_entropy.objectives" not in graph["lit_entropy.objectives.kl"]  # its own package: no edge
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles_between_modules():
    found = cycles(import_graph())
    assert not found, f"modules that import each other (directly or around a loop):\n{describe(found)}"


def test_no_import_cycles_between_parts():
    """One direction between sub-packages and top-level modules: if ``a`` uses ``b``, nothing in ``b`` uses ``a``."""
    found = cycles(parts_graph())
    assert not found, f"parts of the package that import each other:\n{describe(found)}"


def test_the_lazy_graph_sees_function_level_imports():
    eager, lazy = import_graph(), import_graph(lazy=True)
    assert "lit_entropy.evaluation_run" in lazy["lit_entropy.cli.evaluate"]  # imported inside main()
    assert "lit_entropy.evaluation_run" not in eager["lit_entropy.cli.evaluate"]
    assert all(eager[m] <= lazy[m] for m in eager)
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef f():\n    import b\n")
    assert [ast.unparse(n) for n in all_imports(tree)] == ["from typing import TYPE_CHECKING", "import b"]


def test_no_lazy_import_closes_a_cycle_between_parts():
    """An import inside a function that would close a cycle between parts hides it rather than removing it: put
    what both sides need on the floor below them instead (e.g. ``RolloutBatch`` in ``lit_entropy.rollout``)."""
    found = cycles(parts_graph(lazy=True))
    assert not found, f"parts of the package that import each other through function-level imports:\n{describe(found)}"


def test_no_import_cycle_of_any_kind():
    """Module-level, function-level and type-checking imports together: no two modules, and no two parts, import
    each other, around a loop or not."""
    found = cycles(import_graph(types=True)) + cycles(parts_graph(types=True))
    assert not found, f"modules or parts that import each other (any kind of import):\n{describe(found)}"


def test_the_type_checking_graph_sees_type_only_imports():
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\ndef f():\n    import b\n")
    assert [ast.unparse(n) for n in every_import(tree)] == ["from typing import TYPE_CHECKING", "import a", "import b"]
    assert cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]


ITERATION_NEVER_IMPORTS = ("lit_entropy.data", "lit_entropy.module", "lit_entropy.callbacks", "lit_entropy.train",
                           "lit_entropy.cli", "lit_entropy.policy")
"""What calls the loop (the DataModule, the module, the entry points) or what it reaches through a protocol
(``RolloutSource``, ``TrainablePolicy``, ``DrawRequest``): an import of them would be an arrow running back up."""


def test_the_iteration_imports_nothing_that_calls_it():
    graph = import_graph(types=True)
    back = sorted(t for t in graph["lit_entropy.iteration"] if t.startswith(ITERATION_NEVER_IMPORTS))
    assert not back, f"lit_entropy.iteration imports {back}: reach them through a protocol the iteration defines"
    callers = sorted(m for m, targets in graph.items() if m.startswith("lit_entropy.data")
                     and any(t.startswith(("lit_entropy.iteration", "lit_entropy.module")) for t in targets))
    assert not callers, f"the rollout source imports the loop: {callers} (the loop calls it, not the other way round)"


def test_no_callback_reaches_around_the_loop():
    """Callbacks get what they read at build (the evaluation's rollout source) or ask ``run`` for it (a draw
    request): none reads ``trainer.datamodule``."""
    found = []
    for path in sorted((ROOT / PACKAGE / "callbacks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "datamodule":
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not found, f"callbacks read the DataModule: {found}"


REGISTRY_FOLDERS = ("objectives/advantages", "objectives/changes", "objectives/losses", "objectives/reward_transforms",
                    "objectives/selection", "objectives/terms", "objectives/token_shaping")
"""Folders of one file per method: a test in the mirrored folder covers every file, discovering them from their
registry."""

TESTED_BY = {
    # a frozen dataclass with no logic of its own: the studies read the doses every method declares with it
    "dose.py": "unit/studies/test_dose.py",
    # its one test checks the library's refusal (export_checkpoint) and the command's answer to the same case on
    # the real run's checkpoint that test_export.py's module fixtures fit: a file of its own would fit it again
    "cli/export.py": "unit/test_export.py",
    # builds the tiny Hugging Face models tests stand on; the export tests check what it writes (the tokenizer's
    # ids, the chat template, the special ids) through the exported folder
    "policy/hf_tiny.py": "unit/test_export.py",
    # its checks run with every config group's values in one test (test_values_are_checked_with_their_config_keys)
    "rewards/config.py": "unit/test_train_config.py",
}
"""The modules without a test at their mirrored path, each with the test file that tests it and why it has none
of its own (every other module has its test at the mirrored path)."""


def test_every_module_has_its_test_where_a_reader_looks():
    """``lit_entropy/a/b.py`` is tested in ``tests/{unit,integration,models}/a/test_b*.py``, by a test beside its
    registry folder, or where :data:`TESTED_BY` says; a new module gets a mirrored test or an entry here."""
    tests = sorted(t.relative_to(ROOT / "tests").as_posix() for t in (ROOT / "tests").rglob("test_*.py"))
    under = [t.split("/", 1)[1] for t in tests if t.split("/", 1)[0] in ("unit", "integration", "models")]
    missing = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        rel = path.relative_to(ROOT / PACKAGE)
        if rel.name == "__init__.py":
            continue
        folder = rel.parent.as_posix()
        mirrored = ("" if folder == "." else folder + "/") + "test_" + rel.stem
        if any(t.startswith(mirrored) for t in under):
            continue
        if folder in REGISTRY_FOLDERS and any(t.startswith(folder + "/") for t in under):
            continue
        if rel.as_posix() in TESTED_BY:
            continue
        missing.append(rel.as_posix())
    assert not missing, f"modules with no test at their mirrored path nor in TESTED_BY: {missing}"
    gone = [f"{m} -> {t}" for m, t in TESTED_BY.items() if t not in tests or not (ROOT / PACKAGE / m).is_file()]
    assert not gone, f"TESTED_BY names files that are not there: {gone}"


def test_the_package_imports_neither_the_studies_nor_the_benchmarks():
    """They are not in the wheel (pyproject's packages): an import of them from the package would fail installed."""
    graph = import_graph(lazy=True)
    found = {(m, t) for m, targets in graph.items() if m.startswith(PACKAGE + ".") or m == PACKAGE
             for t in targets if not t.startswith(PACKAGE)}
    assert not found, f"the package imports outside itself: {sorted(found)}"
    packages = (ROOT / "pyproject.toml").read_text()
    assert '"studies' not in packages and '"benchmarks' not in packages


def test_the_studies_read_the_package_through_its_public_surface():
    graph = import_graph(lazy=True)
    used = {t for m, targets in graph.items() if m.startswith("studies") for t in targets if t.startswith(PACKAGE)}
    allowed = {m for m in used if any(m == a or a.startswith(m + ".") for a in STUDIES_MAY_IMPORT)}
    assert used - allowed == set(), f"studies/ imports training internals: {sorted(used - allowed)}"


def test_the_files_dealt_first_exist():
    """``make test`` deals ``tests/conftest.py``'s ``DEALT_FIRST`` files first: a renamed file would silently fall
    back into the general order."""
    from tests.conftest import DEALT_FIRST

    missing = [name for name in DEALT_FIRST if not (ROOT / name).is_file()]
    assert not missing, f"tests/conftest.py's DEALT_FIRST names files that are not there: {missing}"
