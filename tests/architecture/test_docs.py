"""docs/architecture.md names only what exists.

The page is read to find where things live, so a file path, a folder or a dotted module name
(``models.knobs.Knobs``) that no longer exists sends its reader nowhere. Paths are checked on
disk; a dotted name's module must exist and its next part must be defined at the module's top
level (a class, function, assignment or import), and the part after that in the class's body.
"""

from __future__ import annotations

import ast
import re

from tests.architecture.imports import MODULES, PACKAGES, ROOT, syntax_tree

DOC = ROOT / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")
TOP = (*PACKAGES, "tests", "docs", "scripts")

# A path starts a word (not the middle of a URL such as /v2/models/{m}) and may end in a folder.
PATH = re.compile(rf"(?<![\w/.-])((?:{'|'.join(TOP)})/[\w./-]*)")
DOTTED = re.compile(rf"(?<![\w/.-])((?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+)")


def _named(nodes: list[ast.stmt]) -> set[str]:
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.If | ast.Try):
            names |= _named(node.body) | _named(getattr(node, "orelse", []))
    return names


def _missing(dotted: str) -> str | None:
    """What of ``dotted`` does not exist, or None."""
    parts = dotted.split(".")
    end = next((n for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in MODULES), 0)
    if end == 0:
        return f"no module {parts[0]}"
    module, rest = ".".join(parts[:end]), parts[end:]
    body = syntax_tree(module).body
    for depth, name in enumerate(rest[:2]):
        if name not in _named(body):
            return f"{module} defines no {'.'.join(rest[: depth + 1])}"
        cls = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == name), None)
        if cls is None:
            break
        body = cls.body
    return None


def test_every_path_in_the_architecture_page_exists() -> None:
    paths = {m.rstrip(".,;:") for m in PATH.findall(TEXT)}
    gone = sorted(p for p in paths if not (ROOT / p).exists())
    assert not gone, f"{DOC.relative_to(ROOT)} names paths that do not exist: {gone}"


def test_every_dotted_name_in_the_architecture_page_exists() -> None:
    names = {m for m in DOTTED.findall(TEXT)}
    gone = sorted(f"{name} ({why})" for name in names if (why := _missing(name)))
    assert not gone, f"{DOC.relative_to(ROOT)} names what does not exist: {gone}"
