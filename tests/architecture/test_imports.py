"""The import rules of docs/architecture.md, checked on the source (``tests.architecture.imports``).

Floors (lowest first): ``models`` (ground) < ``rrl``, ``device_sim`` (side by side, neither
imports the other) < ``gateway`` < ``benchmarks`` < the CLI (``gateway.cli``, the roof).

- Floor rules hold for every import, lazy ones included: a function-level import still ties the
  importer to what it imports, it only runs later. ``TYPE_CHECKING`` imports count too.
- Cycles are checked on the imports that run at import time (module level). Lazy and
  typing-only imports cannot leave a module half-initialised, so they may close a circle only if
  the circle is listed in ``KNOWN_DEFERRED_CIRCLES`` with the way to break it; the list must only
  shrink (a listed edge that no longer closes a circle fails the test too).
- Inside ``gateway``, by purpose: the transport-free contract, the batching, the settings, the
  transports and the one module that hosts the tuner each import only what their place allows;
  an import that breaks one of these rules stays only while ``GATEWAY_CROSSINGS`` lists it with
  its reason (a listed import that is gone, or breaks no rule any more, fails the test too).
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Callable, Iterable

import pytest

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

# Modules any package may import: they import nothing of the project (but each other), so
# importing one loads no backend, no TensorFlow and nothing of another package.
GROUND_FLOOR = (
    "models.machine",
    "models.reporting",
    "models.tf_env",
    "models.knobs",
    "models.window_stats",
    "models.serving_plan",
    "models.runtime",
    "models.batching_rule",
    "models.datatypes",
)

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


def test_device_sim_takes_only_ground_floor_models() -> None:
    """A virtual device must start as fast and as light as a real one: of ``models`` it may take
    the leaves (the wire datatypes), never a backend or the repository."""

    def into_models(edge: Edge) -> bool:
        return (
            package_of(edge.importer) == "device_sim"
            and package_of(edge.imported) == "models"
            and edge.imported not in {*GROUND_FLOOR, "models"}
        )

    message = _breaking(into_models, "device_sim imports more of models than its leaves")
    assert not message, message


def test_ground_floor_modules_are_leaves() -> None:
    gone = [module for module in GROUND_FLOOR if module not in MODULES]
    assert not gone, f"GROUND_FLOOR names modules that no longer exist: {gone}"

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


# Inside gateway, by purpose. The contract every transport shares (the request and response
# types, the error root, the codecs, the decode limits, what a transport needs from the serving
# side, the edge that applies them, request validation, the metrics registry they count in): an
# ingest process serves its transports over a RemoteService with this contract and nothing of
# the service, so it must stay free of the serving side and of every transport.
GATEWAY_CONTRACT = (
    "gateway.types",
    "gateway.errors",
    "gateway.metrics",
    "gateway.codecs",
    "gateway.core",
    "gateway.edge",
    "gateway.validation",
)
BATCHING = "gateway.batching"
SETTINGS = "gateway.settings"
# One package per protocol, side by side.
PROTOCOLS = ("gateway.http", "gateway.grpc", "gateway.mqtt")
# What faces the outside: the protocols, the embedded brokers, the ingest processes.
TRANSPORTS = (*PROTOCOLS, "gateway.brokers", "gateway.ingest")
# Where the process is put together and reports on itself: the only modules that wire the
# transports to the service.
ASSEMBLY = ("gateway.main", "gateway.cli", "gateway.startup_log")
# An ingest process runs the HTTP app and the MQTT adapter themselves, over a RemoteService;
# gRPC stays on the serving process's loop (docs/architecture.md says why).
INGEST_HOSTS = frozenset({"gateway.http", "gateway.mqtt"})
TUNER_HOST = "gateway.tuning"

# Stated imports (importer, imported) that break a gateway rule below -> why they stay, and the
# change that would remove them. Only shrinks: an entry that no longer breaks a rule fails.
GATEWAY_CROSSINGS: dict[tuple[str, str], str] = {
    ("gateway.settings.schema", "gateway.mqtt.trust"): (
        "the schema refuses a bad reply-topic pattern at load with MQTT's own rule "
        "(check_pattern), so a typo fails at start, not at a device's first request; trust.py "
        "imports only gateway.errors and gateway/mqtt/__init__.py nothing, so no adapter loads"
    ),
}


def _within(module: str, packages: Iterable[str]) -> str | None:
    """The entry of ``packages`` that is ``module`` or a package above it."""
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def _gateway_edge(edge: Edge) -> bool:
    return package_of(edge.importer) == "gateway" and package_of(edge.imported) == "gateway"


def _contract_reaches_out(edge: Edge) -> bool:
    return (
        _gateway_edge(edge)
        and _within(edge.importer, GATEWAY_CONTRACT) is not None
        and _within(edge.imported, GATEWAY_CONTRACT) is None
        and edge.imported != "gateway"
    )


def _batching_reaches_out(edge: Edge) -> bool:
    return (
        _gateway_edge(edge)
        and _within(edge.importer, (BATCHING,)) is not None
        and _within(edge.imported, (BATCHING, *GATEWAY_CONTRACT)) is None
        and edge.imported != "gateway"
    )


def _settings_reach_out(edge: Edge) -> bool:
    return (
        _gateway_edge(edge)
        and _within(edge.importer, (SETTINGS,)) is not None
        and _within(edge.imported, (SETTINGS, *GATEWAY_CONTRACT)) is None
        and edge.imported != "gateway"
    )


def _reaches_a_transport(edge: Edge) -> bool:
    transport = _within(edge.imported, TRANSPORTS)
    if transport is None or not _gateway_edge(edge):
        return False
    own = _within(edge.importer, TRANSPORTS)
    hosted = own == "gateway.ingest" and transport in INGEST_HOSTS
    return own != transport and not hosted and _within(edge.importer, ASSEMBLY) is None


def _transport_skips_the_service(edge: Edge) -> bool:
    return (
        _within(edge.importer, TRANSPORTS) is not None
        and _within(edge.imported, (BATCHING, "gateway.model_host")) is not None
    )


def _rrl_outside_the_tuner_host(edge: Edge) -> bool:
    return (
        package_of(edge.importer) == "gateway"
        and edge.importer not in {TUNER_HOST, ROOF}
        and package_of(edge.imported) == "rrl"
    )


GATEWAY_RULES: dict[str, Callable[[Edge], bool]] = {
    "the contract (types, errors, metrics, codecs, core, edge, validation) imports nothing of "
    "the gateway but itself": _contract_reaches_out,
    "batching imports nothing of the gateway but itself and the contract": _batching_reaches_out,
    "the settings import nothing of the gateway but themselves and the contract": (
        _settings_reach_out
    ),
    "a transport (http, grpc, mqtt, brokers, ingest) is imported only by itself, the assembly "
    "(main, cli, startup_log) and, for http and mqtt, ingest": _reaches_a_transport,
    "a transport reaches a model through the service, never its host or batcher": (
        _transport_skips_the_service
    ),
    "of the gateway, only gateway.tuning (the tuner's host) imports rrl": (
        _rrl_outside_the_tuner_host
    ),
}


@pytest.mark.parametrize("rule", GATEWAY_RULES)
def test_gateway_imports_by_purpose(rule: str) -> None:
    def breaks(edge: Edge) -> bool:
        listed = (edge.importer, edge.imported) in GATEWAY_CROSSINGS
        return GATEWAY_RULES[rule](edge) and not listed

    message = _breaking(breaks, f"gateway: {rule}")
    assert not message, message


def test_gateway_crossings_are_still_needed() -> None:
    for (importer, imported), why in GATEWAY_CROSSINGS.items():
        stated = [e for e in STATED if (e.importer, e.imported) == (importer, imported)]
        assert stated, f"{importer} -> {imported} is no longer imported: drop it ({why})"
        broken = [rule for rule, check in GATEWAY_RULES.items() if any(map(check, stated))]
        assert broken, f"{importer} -> {imported} breaks no rule any more: drop it ({why})"


def test_every_gateway_rule_names_existing_modules() -> None:
    named = [*GATEWAY_CONTRACT, BATCHING, SETTINGS, *TRANSPORTS, *ASSEMBLY, TUNER_HOST]
    gone = [module for module in named if module not in MODULES]
    assert not gone, f"the gateway rules name modules that no longer exist: {gone}"
