"""Sizes a newcomer can read (docs/architecture.md): no module of the five packages over
``MAX_MODULE_LINES`` lines and no function over ``MAX_FUNCTION_LINES``, read with ``ast``.

A module may be longer only if it is listed in ``LONG_MODULES`` with the reason it is one unit
(a split would cut one idea in two, which costs a reader more than its length). A function may
be longer only if it is listed in ``LONG_FUNCTIONS`` with the reason: a declarative table (a
literal that reads row by row and splits into nothing shorter), or the split that would bring it
under the limit. Both lists only shrink: a listed entry that is gone or back under the limit
fails the test too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from tests.architecture.imports import MODULES, ROOT, module_path, syntax_tree

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 60

# "path" -> why the module is one unit although it is longer.
LONG_MODULES: dict[str, str] = {
    "rrl/agent/policy.py": "the online agent's decision rule: choose, learn, rest and wake, read "
    "top to bottom in one place, with the state only it changes",
    "rrl/agent/queueing.py": "the queueing model: the service times and loop cost it is fed, the "
    "two predictions made from them (an open loop replayed, a closed loop simulated) and the "
    "caches both drop when what they were fed moves",
    "rrl/offline/evaluate.py": "the offline evaluation: the runs, the figures each run yields and "
    "the same figures aggregated over seeds and workloads, key by key, so a figure's per-run and "
    "pooled definitions are read side by side",
}

# "path::Qualified.name" -> why it may be longer (a declarative table, or the fix to make).
LONG_FUNCTIONS: dict[str, str] = {}


def _functions(
    node: ast.AST, prefix: str = ""
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method under ``node``, nested ones included, by qualified name."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}{child.name}", child
            yield from _functions(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def _lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or ``def``) to the last line of the body."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def _relative(module: str) -> str:
    return module_path(module).relative_to(ROOT).as_posix()


def function_lengths() -> dict[str, int]:
    """``path::qualname`` -> lines, for every function of the five packages."""
    return {
        f"{_relative(module)}::{name}": _lines(node)
        for module in sorted(MODULES)
        for name, node in _functions(syntax_tree(module))
    }


def test_no_module_over_the_limit_but_the_listed() -> None:
    lengths = {
        _relative(module): len(module_path(module).read_text(encoding="utf-8").splitlines())
        for module in sorted(MODULES)
    }
    long = {
        path: n for path, n in lengths.items() if n > MAX_MODULE_LINES and path not in LONG_MODULES
    }
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split by role): {long}"
    settled = [path for path in LONG_MODULES if lengths.get(path, 0) <= MAX_MODULE_LINES]
    assert not settled, (
        f"no longer over {MAX_MODULE_LINES} lines, drop from LONG_MODULES: {settled}"
    )


def test_no_function_over_the_limit_but_the_listed() -> None:
    lengths = function_lengths()
    long = {
        name: n
        for name, n in lengths.items()
        if n > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS
    }
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
    settled = [name for name in LONG_FUNCTIONS if lengths.get(name, 0) <= MAX_FUNCTION_LINES]
    assert not settled, (
        f"no longer over {MAX_FUNCTION_LINES} lines, drop from LONG_FUNCTIONS: {settled}"
    )
