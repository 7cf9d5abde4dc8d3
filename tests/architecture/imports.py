"""The project's import graph, read from the source with ``ast`` (nothing is imported).

Every ``import``/``from ... import`` statement in the five packages becomes an edge from the
importing module to the module it names, tagged with *when* it runs:

- ``module``: at import time (module body, class bodies, ``try``/``if`` at module level);
- ``function``: inside a function or lambda, so it runs on first call (a lazy import, the
  project's way to keep TensorFlow, ONNX Runtime and matplotlib off paths that do not need them);
- ``typing``: under ``if TYPE_CHECKING:``, so it never runs.

``importlib.import_module("literal")`` counts as a ``function`` edge when its argument is a
literal string; a computed name (the CLI's ``benchmarks.<name>``) cannot be read statically.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("models", "rrl", "device_sim", "gateway", "benchmarks")

When = Literal["module", "function", "typing"]


@dataclass(frozen=True, slots=True)
class Edge:
    importer: str
    imported: str
    when: When
    line: int
    # Implied by importing a submodule: ``import a.b.c`` runs the package ``a.b`` first.
    implied: bool = False

    def __str__(self) -> str:
        path = module_path(self.importer).relative_to(ROOT)
        return f"{path}:{self.line}: {self.importer} -> {self.imported} ({self.when})"


def package_of(module: str) -> str:
    return module.split(".", 1)[0]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    """Every module of the five packages, by dotted name (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


MODULES = project_modules()


def module_path(module: str) -> Path:
    return MODULES[module]


@functools.cache
def syntax_tree(module: str) -> ast.Module:
    """The module's parsed source (parsed once per test run)."""
    return ast.parse(module_path(module).read_text(encoding="utf-8"))


def _resolve(dotted: str) -> str | None:
    """The deepest project module a dotted name reaches (``a.b.attr`` -> ``a.b``)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _absolute(node: ast.ImportFrom, importer: str) -> str:
    if not node.level:
        return node.module or ""
    is_package = module_path(importer).name == "__init__.py"
    base = importer.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(node: ast.AST, importer: str) -> Iterator[str]:
    """Dotted names an import statement (or ``importlib.import_module`` call) brings in."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
        source = _absolute(node, importer)
        # ``from pkg import name``: ``name`` may be a submodule or an attribute of ``pkg``.
        yield from (f"{source}.{alias.name}" for alias in node.names)
    elif isinstance(node, ast.Call) and _is_import_module(node.func):
        arg = node.args[0] if node.args else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            yield arg.value


def _is_import_module(func: ast.expr) -> bool:
    return isinstance(func, ast.Attribute) and func.attr == "import_module"


def _is_type_checking(test: ast.expr) -> bool:
    name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
    return name == "TYPE_CHECKING"


def _walk(node: ast.AST, when: When) -> Iterator[tuple[ast.AST, When]]:
    """Each node with when it runs; a function body is ``function`` unless inside typing."""
    for child in ast.iter_child_nodes(node):
        inner = when
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            inner = "typing" if when == "typing" else "function"
        if isinstance(node, ast.If) and _is_type_checking(node.test) and child in node.body:
            inner = "typing"
        yield child, inner
        yield from _walk(child, inner)


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:end]) for end in range(1, len(parts))]


def edges_of(importer: str) -> Iterator[Edge]:
    tree = syntax_tree(importer)
    running = {importer, *_ancestors(importer)}
    for node, when in _walk(tree, "module"):
        for dotted in _targets(node, importer):
            target = _resolve(dotted)
            if target is None or target == importer:
                continue
            line = getattr(node, "lineno", 0)
            yield Edge(importer, target, when, line)
            # Importing ``a.b.c`` runs ``a`` and ``a.b`` first; the importer and its own parents
            # are running already (they were imported before it), so only the others count.
            for parent in _ancestors(target):
                if parent in MODULES and parent not in running:
                    yield Edge(importer, parent, when, line, implied=True)


def all_edges() -> list[Edge]:
    return [edge for module in MODULES for edge in edges_of(module)]
