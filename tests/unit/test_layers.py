"""The worker package's shape (README, Architecture): each layer imports only from the layers
below it, siblings in one layer not from each other, and no module imports itself round a cycle.

Every import counts, the ones inside functions and under TYPE_CHECKING too: a lazy import is for
an optional dependency, not for hiding an upward edge. The checker is tried on a small tree of
its own first, so a check that cannot fail would fail here.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: worker's layers, top to bottom: a module may import from its own unit (a package, or a
#: module of the bottom layer) and from the layers below its own
LAYERS: tuple[tuple[str, ...], ...] = (
    ("cli",),
    ("explorer", "transfer"),
    ("runtime",),
    ("search",),
    ("intake",),
    ("organise",),
    ("store",),
    ("context",),
    ("index", "models"),
    ("daemon", "connection", "bulk"),
    ("metrics", "tracing"),
    ("settings", "errors", "text", "readable", "vectors"),
)


def modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(path: Path, names: set[str]) -> Iterator[str]:
    """The modules of ``names`` that ``path`` imports, anywhere in it."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name in names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module not in names:
                continue
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                yield child if child in names else node.module


def graph(package: Path) -> dict[str, set[str]]:
    mods = modules(package)
    names = set(mods)
    return {m: set(imported(p, names)) - {m} for m, p in mods.items()}


def unit_of(module: str) -> str:
    """The unit a module belongs to: ``worker.store.notes`` -> ``store``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def layer_of(unit: str, layers: Sequence[Sequence[str]]) -> int | None:
    return next((depth for depth, units in enumerate(layers) if unit in units), None)


def upward(edges: dict[str, set[str]], layers: Sequence[Sequence[str]]) -> list[str]:
    """Each import of a module from its own layer's sibling or from a layer above, and each
    module that no layer holds."""
    found = []
    for module, targets in sorted(edges.items()):
        unit = unit_of(module)
        if not unit:
            continue
        depth = layer_of(unit, layers)
        if depth is None:
            found.append(f"{module} is in no layer")
            continue
        for target in sorted(targets):
            to = unit_of(target)
            there = layer_of(to, layers)
            if to != unit and there is not None and there <= depth:
                found.append(f"{module} imports {target}")
    return found


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = list(edges.get(start, ()))
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(edges.get(node, ()))
    return seen


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or round a longer loop."""
    reach = {node: reachable(edges, node) for node in edges}
    looped = [node for node in sorted(edges) if node in reach[node]]
    groups = {tuple(n for n in looped if n in reach[node] and node in reach[n]) for node in looped}
    return [list(group) for group in sorted(groups)]


def test_the_worker_imports_only_downward() -> None:
    assert upward(graph(ROOT / "worker"), LAYERS) == []


def test_the_worker_has_no_import_cycle() -> None:
    assert cycles(graph(ROOT / "worker")) == []


def test_the_producer_does_not_import_the_worker() -> None:
    for path in modules(ROOT / "producer").values():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("worker"), path
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("worker") for a in node.names), path


def test_every_package_says_what_it_owns() -> None:
    for path in (ROOT / "worker").rglob("__init__.py"):
        assert ast.get_docstring(ast.parse(path.read_text())), path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    package = tmp_path / "worker"
    for name, body in {
        "__init__.py": "",
        "settings.py": "",
        "top/__init__.py": "",
        "top/a.py": "from worker.low import b\n",
        "low/__init__.py": "",
        "low/b.py": "from worker import settings\n",
        "low/c.py": "",
        "side/__init__.py": "",
    }.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(body)
    return package


LAYERS_OF_TREE = (("top",), ("low", "side"), ("settings",))


def test_a_downward_tree_passes(tree: Path) -> None:
    assert upward(graph(tree), LAYERS_OF_TREE) == []
    assert cycles(graph(tree)) == []


def test_an_upward_import_fails_even_inside_a_function(tree: Path) -> None:
    (tree / "low" / "c.py").write_text("def f():\n    from worker.top import a\n")
    assert upward(graph(tree), LAYERS_OF_TREE) == ["worker.low.c imports worker.top.a"]


def test_a_sibling_import_fails(tree: Path) -> None:
    (tree / "side" / "d.py").write_text("from worker.low import c\n")
    assert upward(graph(tree), LAYERS_OF_TREE) == ["worker.side.d imports worker.low.c"]


def test_a_module_in_no_layer_fails(tree: Path) -> None:
    (tree / "stray.py").write_text("")
    assert upward(graph(tree), LAYERS_OF_TREE) == ["worker.stray is in no layer"]


def test_a_cycle_behind_type_checking_fails(tree: Path) -> None:
    (tree / "low" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from worker.low import b\n"
    )
    (tree / "low" / "b.py").write_text("from worker.low import c\n")
    assert cycles(graph(tree)) == [["worker.low.b", "worker.low.c"]]


def test_the_readme_draws_every_layer_and_names_only_real_files() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Architecture\n", 1)[1].split("\n## ", 1)[0]
    for units in LAYERS:
        for unit in units:
            shown = f"{unit}/" if (ROOT / "worker" / unit).is_dir() else f"{unit}.py"
            assert shown in section, unit
    for path in re.findall(r"`((?:worker|producer)/[\w/]+\.py)`", section):
        assert (ROOT / path).is_file(), path
