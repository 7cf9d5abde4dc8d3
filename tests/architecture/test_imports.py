"""The import rules of docs/architecture.md, checked on the source (``tests.architecture.imports``).

Floors (lowest first): ``models`` (ground) < ``rrl``, ``device_sim`` (side by side, neither
imports the other) < ``gateway`` < ``benchmarks`` < the CLI (``gateway.cli``, the roof).

- Floor rules hold for every import, lazy ones included: a function-level import still ties the
  importer to what it imports, it only runs later. ``TYPE_CHECKING`` imports count too.
- Cycles are checked on the imports that run at import time (module level). Lazy and
  typing-only imports cannot leave a module half-initialised, so they may close a circle only if
  the circle is listed in ``KNOWN_DEFERRED_CIRCLES`` with the way to break it; the list must only
  shrink (a listed edge that no longer closes a circle fails the test too).
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Callable, Iterable

from tests.architecture.imports import (
    MODULES,
    Edge,
    all_edges,
    module_path,
    package_of,
    syntax_tree,
)

ROOF = "gateway.cli"

# Package -> the packages its modules may import (its own included).
MAY_IMPORT: dict[str, frozenset[str]] = {
    "models": frozenset({"models"}),
    "rrl": frozenset({"rrl", "models"}),
    "device_sim": frozenset({"device_sim", "models"}),
    "gateway": frozenset({"gateway", "rrl", "models"}),
    "benchmarks": frozenset({"benchmarks", "gateway", "rrl", "device_sim", "models"}),
}

# Modules any package may import: they import nothing of the project (but each other).
GROUND_FLOOR = ("models.machine", "models.reporting", "models.tf_env")

# Deferred edges (importer, imported) that close a circle -> the fix that would remove it.
KNOWN_DEFERRED_CIRCLES: dict[tuple[str, str], str] = {}

EDGES = all_edges()
# What the import statements name (the packages they run on the way are the same package).
STATED = [edge for edge in EDGES if not edge.implied]


def _breaking(rule: Callable[[Edge], bool], what: str) -> str:
    """An empty string when no stated import breaks ``rule``, else what and where."""
    bad = [edge for edge in STATED if rule(edge)]
    return f"{what} (see docs/architecture.md):\n" + "\n".join(map(str, bad)) if bad else ""


def test_no_import_up_the_floors() -> None:
    def up(edge: Edge) -> bool:
        allowed = MAY_IMPORT[package_of(edge.importer)]
        return edge.importer != ROOF and package_of(edge.imported) not in allowed

    assert not (message := _breaking(up, "imports up the floors")), message


def test_benchmarks_imported_only_by_benchmarks_and_the_cli() -> None:
    def into_benchmarks(edge: Edge) -> bool:
        outside = package_of(edge.importer) != "benchmarks" and edge.importer != ROOF
        return outside and package_of(edge.imported) == "benchmarks"

    message = _breaking(into_benchmarks, "benchmarks is the top floor; move shared helpers down")
    assert not message, message


def test_device_sim_talks_wire_protocols_only() -> None:
    def into_gateway(edge: Edge) -> bool:
        return package_of(edge.importer) == "device_sim" and package_of(edge.imported) in {
            "gateway",
            "rrl",
            "benchmarks",
        }

    message = _breaking(into_gateway, "device_sim must not import the gateway (or the tuner)")
    assert not message, message


# Inside rrl, by purpose (lowest first): the tuners know nothing of where they run; the offline
# tools (profiling, testbed, replay, evaluation, priors) use the tuners; the online agent uses
# both (the replay's batcher model, the profile priors). rrl's own command sits on top.
RRL_FLOORS = ("rrl.tuners", "rrl.offline", "rrl.agent", "rrl.cli")


def _rrl_floor(module: str) -> int | None:
    for floor, prefix in enumerate(RRL_FLOORS):
        if module == prefix or module.startswith(prefix + "."):
            return floor
    return None


def test_rrl_imports_go_down_its_purposes() -> None:
    def up(edge: Edge) -> bool:
        importer, imported = _rrl_floor(edge.importer), _rrl_floor(edge.imported)
        return importer is not None and imported is not None and imported > importer

    message = _breaking(up, "rrl: tuners < offline < agent < cli")
    assert not message, message


def test_every_rrl_module_has_a_purpose() -> None:
    loose = [m for m in MODULES if m.startswith("rrl.") and _rrl_floor(m) is None]
    assert not loose, f"rrl modules outside {RRL_FLOORS}: {loose}"


def test_ground_floor_modules_are_leaves() -> None:
    def out_of_leaf(edge: Edge) -> bool:
        return edge.importer in GROUND_FLOOR and edge.imported not in {*GROUND_FLOOR, "models"}

    message = _breaking(out_of_leaf, "a ground-floor module imports the project")
    assert not message, message


def _first_cycle(edges: Iterable[Edge]) -> list[str] | None:
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.importer, set()).add(edge.imported)
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        # graphlib lists each node before the ones that need it: reversed, it reads as imports.
        cycle: list[str] = exc.args[1]
        return cycle[::-1]
    return None


def test_no_import_cycle_at_import_time() -> None:
    cycle = _first_cycle(edge for edge in EDGES if edge.when == "module")
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_deferred_imports_close_only_the_known_circles() -> None:
    def known(edge: Edge) -> bool:
        return (edge.importer, edge.imported) in KNOWN_DEFERRED_CIRCLES and edge.when != "module"

    rest = [edge for edge in EDGES if not known(edge)]
    cycle = _first_cycle(rest)
    assert cycle is None, "import circle (lazy and typing imports included): " + " -> ".join(
        cycle or []
    )
    for importer, imported in KNOWN_DEFERRED_CIRCLES:
        listed = [e for e in EDGES if (e.importer, e.imported) == (importer, imported)]
        assert _first_cycle(rest + listed) is not None, (
            f"{importer} -> {imported} no longer closes a circle: "
            "drop it from KNOWN_DEFERRED_CIRCLES"
        )


def _imports_tensorflow(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] in {"tensorflow", "keras"} for alias in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in {"tensorflow", "keras"}
    return False


def _imports_tf_env(node: ast.AST) -> bool:
    if isinstance(node, ast.ImportFrom) and node.module == "models":
        return any(alias.name == "tf_env" for alias in node.names)
    return isinstance(node, ast.Import) and any(a.name == "models.tf_env" for a in node.names)


def test_tensorflow_is_imported_after_its_environment() -> None:
    """TensorFlow reads TF_OVERRIDE_GLOBAL_THREADPOOL once, at its first import: a module that
    imports it (or Keras) imports ``models.tf_env`` first, at module level."""
    late: list[str] = []
    for module in sorted(MODULES):
        tree = syntax_tree(module)
        first_tf = next((n for n in ast.walk(tree) if _imports_tensorflow(n)), None)
        if first_tf is None:
            continue
        env = next((n for n in tree.body if _imports_tf_env(n)), None)
        line = getattr(first_tf, "lineno", 0)
        if env is None or env.lineno > line:
            late.append(f"{module_path(module)}:{line}: {module}")
    assert not late, "imports TensorFlow before models.tf_env:\n" + "\n".join(late)
