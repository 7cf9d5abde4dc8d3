"""Cases drawn by hypothesis in chunks, reproducibly: chunk ``i`` of a run with seed ``s`` is
the same list every time (``@seed``, no example database, generation phase only). Runs in a
worker process so that drawing overlaps sending."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from benchmarks.fuzz.cases import Case
from benchmarks.fuzz.grpc_strategies import grpc_cases
from benchmarks.fuzz.mqtt_strategies import mqtt_cases
from benchmarks.fuzz.strategies import http_cases


def chunk_seed(run_seed: int, transport: str, index: int) -> int:
    base = (run_seed * 1_000_003 + index) * 2
    # HTTP and MQTT keep the seeds they had before gRPC was fuzzed; gRPC's are negative.
    return {"http": base, "mqtt": base + 1}.get(transport, -base - 1)


def generate_chunk(run_seed: int, transport: str, index: int, count: int) -> list[Case]:
    """``count`` cases for ``transport`` ("http", "mqtt" or "grpc"), chunk ``index`` of the
    run."""
    strategies: dict[str, Callable[[], st.SearchStrategy[Case]]] = {
        "http": http_cases,
        "mqtt": mqtt_cases,
        "grpc": grpc_cases,
    }
    strategy = strategies[transport]()
    out: list[Case] = []

    @seed(chunk_seed(run_seed, transport, index))
    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def collect(data: st.DataObject) -> None:
        out.append(data.draw(strategy))

    collect()
    return out
