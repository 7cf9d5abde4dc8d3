"""The parts of ``iotgw bench peers``: the cached environments (built offline from their
wheelhouse, reused as they are, and a clear refusal when nothing is cached and no registry can
be reached), the load generator's JSON requests against a real aiohttp server, the windows,
Triton's configuration, the capacity search, the noise floors and the summaries. No timing is
asserted: benchmarks are not tests (see benchmarks.md)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import math
import os
import subprocess
import zipfile
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiohttp import web

from benchmarks.judging import pair_floor
from benchmarks.loadgen import LoadJob, run_load
from benchmarks.peers import servers as peer_servers
from benchmarks.peers.capacity import search, step_verdict
from benchmarks.peers.grpc_points import GATEWAY_COUNTER, TRITON_COUNTER, counted
from benchmarks.peers.measure import interleaved_point
from benchmarks.peers.peer_env import (
    PeerEnv,
    PeerUnavailable,
    ensure_env,
    mlserver_env,
    triton_env,
)
from benchmarks.peers.plan import (
    FULL,
    GATEWAY,
    GATEWAY_BINARY,
    GATEWAY_GRPC,
    GATEWAY_STATIC,
    GATEWAY_STATIC_GRPC,
    MLSERVER,
    TRITON,
    TRITON_GRPC,
    windows,
)
from benchmarks.peers.report import model_summary
from benchmarks.peers.servers import write_triton_config
from benchmarks.peers.triton_report import SEARCH_RESOLUTION, grpc_summary, triton_summary
from gateway.codecs.oip import HEADER_LENGTH


def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """pip with no index, no configuration file and no extra wheel folder: nothing but what
    the test hands it."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)


def _write_wheel(folder: Path) -> None:
    """A one-module pure-Python wheel, ``peersprobe`` 1.0 (``VALUE = 42``)."""
    files = {
        "peersprobe.py": b"VALUE = 42\n",
        "peersprobe-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: peersprobe\n"
        b"Version: 1.0\n",
        "peersprobe-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("peersprobe-1.0.dist-info/RECORD,,")
    folder.mkdir(parents=True)
    with zipfile.ZipFile(folder / "peersprobe-1.0-py3-none-any.whl", "w") as whl:
        for name, data in files.items():
            whl.writestr(name, data)
        whl.writestr("peersprobe-1.0.dist-info/RECORD", "\n".join(record) + "\n")


def test_environment_built_offline_from_the_wheelhouse_then_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline(monkeypatch)
    env = PeerEnv(tmp_path / "env", ("peersprobe==1.0",), "Probe")
    _write_wheel(env.wheels)
    (env.wheels / "iotgw-peers.json").write_text('{"requirements": ["peersprobe==1.0"]}')
    said: list[str] = []
    assert ensure_env(env, said.append) == env
    assert said == [f"building Probe's environment {env.venv} (offline, from {env.wheels})"]
    probe = [str(env.python), "-c", "import peersprobe; print(peersprobe.VALUE)"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "42\n"

    said.clear()
    assert ensure_env(env, said.append) == env  # complete: used as it is, pip not run
    assert said == []

    (env.venv / "iotgw-peers.json").unlink()  # as a build interrupted before its end leaves it
    ensure_env(env, said.append)
    assert said == [f"building Probe's environment {env.venv} (offline, from {env.wheels})"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout == "42\n"


@pytest.mark.parametrize(
    ("where", "pinned"),
    [(mlserver_env, "mlserver==1.7.1"), (triton_env, "nvidia-pytriton==0.7.0 numpy<2")],
)
def test_nothing_cached_and_no_registry_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: Any, pinned: str
) -> None:
    _offline(monkeypatch)
    env = where(tmp_path)
    with pytest.raises(PeerUnavailable) as caught:
        ensure_env(env, lambda _: None)
    message = str(caught.value)
    assert pinned in message and str(env.root) in message
    assert f"onnxruntime=={importlib.metadata.version('onnxruntime')}" in message
    assert not env.wheels.exists() and not env.venv.exists()


def test_each_peer_has_its_own_environment() -> None:
    mls, tri = mlserver_env(Path("/c")), triton_env(Path("/c"))
    assert mls.root != tri.root and (mls.label, tri.label) == ("MLServer", "Triton")
    assert tri.root.name.startswith("pytriton-0.7.0-ort-")


async def _json_echo(request: web.Request) -> web.Response:
    """Answers a JSON request with JSON whose length changes from reply to reply, as floats
    printed as text do; anything else is refused."""
    if request.content_type != "application/json" or HEADER_LENGTH in request.headers:
        return web.json_response({"error": "not a JSON request"}, status=400)
    doc = await request.json()
    served = request.app[SERVED]
    served.append(len(served))
    return web.json_response({"outputs": doc["inputs"], "pad": "x" * (len(served) % 7)})


SERVED = web.AppKey("served", list[int])


@pytest.mark.parametrize("client", ["raw", "aiohttp"])
async def test_load_generator_sends_plain_json(client: str) -> None:
    app = web.Application()
    app[SERVED] = []
    app.router.add_post("/v2/models/m/versions/1/infer", _json_echo)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        body = b'{"inputs":[{"name":"x","shape":[1,2],"datatype":"FP32","data":[1.5,2.5]}]}'
        job = LoadJob(
            url=f"http://127.0.0.1:{port}/v2/models/m/versions/1/infer",
            body=body,
            header_length=0,
            rows_per_request=1,
            concurrency=3,
            duration_s=60.0,
            max_requests=40,
            warmup_s=0.0,
            timeout_s=30.0,
            client=client,
        )
        result = await run_load(job)
    finally:
        await runner.cleanup()
    assert (result["answered"], result["lost"], result["errors"]) == (40, 0, {})


def test_windows_follow_the_wait_for_a_reply() -> None:
    assert windows(FULL, None) == (FULL.warmup_s, FULL.run_s)
    assert windows(FULL, 0.001) == (FULL.warmup_s, FULL.run_s)  # at least the plan's
    assert windows(FULL, 1.0) == (0.0, 4.0)  # 4 replies per client; a warm-up would wait
    assert windows(FULL, 60.0) == (0.0, FULL.max_run_s)  # within its bounds


def _point(rows: int, concurrency: int, ratios: dict[str, float]) -> dict[str, Any]:
    def rep(x: float) -> dict[str, Any]:
        return {"median": x, "min": x, "max": x, "runs": 1, "values": [x]}

    arm = {"rows_per_s": rep(100.0), "p50_ms": rep(5.0), "p99_ms": rep(9.0), "lost": 0}
    return {
        "model": "vision_cnn",
        "rows_per_request": rows,
        "concurrency": concurrency,
        "arms": {MLSERVER: arm, GATEWAY: arm, GATEWAY_BINARY: arm},
        "vs_mlserver": {
            name: {k: rep(v * scale) for k, v in ratios.items()}
            for name, scale in ((GATEWAY, 1.0), (GATEWAY_BINARY, 2.0))
        },
    }


def test_summary_takes_each_ratio_at_its_point_and_holds_it_to_its_target() -> None:
    ratios = {"throughput_ratio": 1.6, "p50_ratio": 0.9, "p99_ratio": 1.1}
    points = [
        _point(1, 1, {**ratios, "p50_ratio": 0.7}),
        _point(1, 32, ratios),
        _point(8, 32, {**ratios, "throughput_ratio": 3.0}),
    ]
    s = model_summary(points, "vision_cnn")
    assert s["vs_mlserver_throughput_ratio_c32"] == 1.6
    assert s["vs_mlserver_p99_ratio_c32"] == 1.1
    assert s["vs_mlserver_p50_ratio_c1"] == 0.7
    assert s["meets_targets"] == {
        "vs_mlserver_throughput_ratio_c32": True,
        "vs_mlserver_p99_ratio_c32": False,
        "vs_mlserver_p50_ratio_c1": True,
    }
    assert s["binary_vs_mlserver_throughput_ratio_c32"] == 3.2
    assert s["vs_mlserver_throughput_ratio_c32_rows8"] == 3.0
    assert s["vs_mlserver_p50_ratio_c1_rows8"] is None  # not measured


def test_pair_floor_is_what_two_consecutive_repeats_differ_by() -> None:
    assert pair_floor([100.0, 110.0, 99.0]) == round((1.1 + 110.0 / 99.0) / 2, 4)
    assert pair_floor([100.0, None, 100.0]) is None  # no two consecutive figures
    assert pair_floor([100.0]) is None
    assert pair_floor([80.0, 80.0]) == 1.0


def test_triton_gets_the_gateways_knobs(tmp_path: Path) -> None:
    version = SimpleNamespace(directory=tmp_path / "m" / "1", config=SimpleNamespace(path="x.onnx"))
    model = SimpleNamespace(version=version)
    knobs = {
        "max_batch_size": 32,
        "batch_timeout_ms": 1.5,
        "concurrency": 2,
        "intra_op_threads": 3,
        "inter_op_threads": 1,
    }
    config = write_triton_config(tmp_path / "t", {"m": model}, {"m": knobs})  # type: ignore[dict-item]
    assert json.loads((tmp_path / "t" / "config.json").read_text()) == config
    (spec,) = config["models"]
    assert spec == {
        "name": "m",
        "path": str(tmp_path / "m" / "1" / "x.onnx"),
        "max_batch_size": 32,
        "max_queue_delay_us": 1500,
        "instances": 2,
        "intra_op_threads": 3,
        "inter_op_threads": 1,
    }
    ports = {config["http_port"], config["grpc_port"], config["metrics_port"]}
    assert len(ports) == 3 and config["host"] == "127.0.0.1"


def _starts_failing(
    monkeypatch: pytest.MonkeyPatch, folder: Path, failures: list[str]
) -> list[int]:
    """``_start_triton_once`` replaced by one that writes a log and fails with each of
    ``failures`` in turn, then starts; returns the list its calls are counted in."""
    calls: list[int] = []

    def once(*_: Any) -> tuple[Any, str, dict[str, Any]]:
        calls.append(1)
        (folder.parent / "triton.log").write_text(f"start {len(calls)}\n")
        (folder / "workspace").mkdir(parents=True, exist_ok=True)
        if len(calls) <= len(failures):
            raise RuntimeError(f"Triton did not get ready:\n{failures[len(calls) - 1]}")
        return "server", "http://127.0.0.1:1", {}

    monkeypatch.setattr(peer_servers, "_start_triton_once", once)
    return calls


def _start(folder: Path) -> tuple[Any, str, dict[str, Any]]:
    return peer_servers.start_triton(None, folder, {}, {}, 1.0)  # type: ignore[arg-type]


RACE = "File model.py, in get_config_from_handshake_server\nConnectionRefusedError: [Errno 111]"


def test_a_triton_start_lost_to_the_handshake_race_is_started_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "triton"
    calls = _starts_failing(monkeypatch, folder, [RACE, RACE])
    assert _start(folder)[1] == "http://127.0.0.1:1"
    assert len(calls) == 3
    for lost in (1, 2):
        log = tmp_path / f"triton-lost-start-{lost}.log"
        assert log.read_text() == f"start {lost}\n"


def test_a_triton_start_fails_at_once_on_anything_but_the_race(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "triton"
    calls = _starts_failing(monkeypatch, folder, ["onnxruntime: model file is corrupt"])
    with pytest.raises(RuntimeError, match="corrupt"):
        _start(folder)
    assert len(calls) == 1


def test_triton_starts_are_bounded_when_the_race_keeps_being_lost(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "triton"
    calls = _starts_failing(monkeypatch, folder, [RACE] * 10)
    with pytest.raises(RuntimeError, match="get_config_from_handshake_server"):
        _start(folder)
    assert len(calls) == peer_servers.TRITON_START_ATTEMPTS


def _step(p99_ms: float | None, *, lost: int = 0, achieved: float = 1.0) -> dict[str, Any]:
    return {
        "lost": lost,
        "errors": 0,
        "p99_ms": p99_ms,
        "offered_rps": 100.0,
        "achieved_rps": 100.0 * achieved,
    }


def test_a_step_fails_over_the_slo_on_a_loss_or_when_the_client_falls_behind() -> None:
    assert step_verdict(_step(99.0), 100.0) is None
    assert "SLO" in str(step_verdict(_step(101.0), 100.0))
    assert "SLO" in str(step_verdict(_step(None), 100.0))
    assert "1 lost" in str(step_verdict(_step(5.0, lost=1), 100.0))
    assert "client-bound" in str(step_verdict(_step(5.0, achieved=0.5), 100.0))


def _server_with_capacity(limit: float) -> tuple[Any, list[tuple[float, bool]]]:
    """A measure that passes up to ``limit`` req/s, and the (rate, warm-up) it was asked."""
    asked: list[tuple[float, bool]] = []

    def measure(rate: float, warm: bool) -> dict[str, Any]:
        asked.append((rate, warm))
        return _step(10.0 if rate <= limit else 500.0)

    return measure, asked


def test_capacity_search_climbs_then_splits_the_last_step() -> None:
    measure, asked = _server_with_capacity(300.0)
    found = search(measure, 200.0, 100.0, max_steps=10)
    assert [round(r, 1) for r, _ in asked] == [
        200.0,
        250.0,
        312.5,
        round(math.sqrt(250 * 312.5), 1),
    ]
    assert [w for _, w in asked] == [True, False, False, False]  # a warm-up on the first only
    assert found["capacity_rps"] == round(math.sqrt(250 * 312.5), 1)
    assert found["bounded_above"] is True
    assert [s["passed"] for s in found["steps"]] == [True, True, False, True]


def test_capacity_search_goes_down_when_the_first_rate_fails() -> None:
    measure, asked = _server_with_capacity(270.0)
    found = search(measure, 400.0, 100.0, max_steps=10)
    assert [round(r, 1) for r, _ in asked] == [400.0, 320.0, 256.0, round(math.sqrt(256 * 320), 1)]
    assert found["capacity_rps"] == 256.0 and found["bounded_above"] is True


def test_capacity_search_stops_at_its_step_budget() -> None:
    measure, _ = _server_with_capacity(1e9)
    found = search(measure, 100.0, 100.0, max_steps=2)
    assert found["capacity_rps"] == 125.0 and found["bounded_above"] is False
    measure, _ = _server_with_capacity(1.0)
    assert search(measure, 100.0, 100.0, max_steps=2)["capacity_rps"] is None


def _wrk_point(c: int, ratios: dict[str, float], floors: dict[str, float]) -> dict[str, Any]:
    """A wrk point: the gateway's ratios to Triton; ``floors``: by arm, every figure's."""

    def rep(x: float) -> dict[str, Any]:
        return {"median": x, "min": x, "max": x, "runs": 2, "values": [x, x]}

    def arm(floor: float) -> dict[str, Any]:
        keys = ("requests_per_s", "p50_ms", "p99_ms")
        return {"floors": dict.fromkeys(keys, floor)}

    return {
        "model": "sensor_mlp",
        "connections": c,
        "arms": {name: arm(f) for name, f in floors.items()},
        "vs_triton": {
            GATEWAY: {k: rep(v) for k, v in ratios.items()},
            GATEWAY_STATIC: {k: rep(2 * v) for k, v in ratios.items()},
        },
    }


def test_triton_summary_judges_each_ratio_against_its_noise_floor() -> None:
    floors = {TRITON: 1.05, GATEWAY: 1.1, GATEWAY_STATIC: 1.0}
    wrk = [
        _wrk_point(1, {"throughput_ratio": 3.0, "p50_ratio": 0.3, "p99_ratio": 0.4}, floors),
        _wrk_point(8, {"throughput_ratio": 1.25, "p50_ratio": 0.5, "p99_ratio": 0.9}, floors),
        _wrk_point(32, {"throughput_ratio": 1.5, "p50_ratio": 0.8, "p99_ratio": 1.2}, floors),
    ]
    capacity = [
        {"model": "sensor_mlp", "arm": arm, "round": r, "capacity_rps": cap}
        for arm, caps in ((GATEWAY, (300.0, 330.0)), (TRITON, (200.0, 200.0)))
        for r, cap in enumerate(caps)
    ]
    s = triton_summary([], wrk, capacity, "sensor_mlp")
    assert (
        s["vs_triton_throughput_ratio_c32"],
        s["vs_triton_throughput_ratio_c32_noise_floor"],
    ) == (
        1.5,
        1.1,
    )
    assert s["vs_triton_throughput_ratio_c32_judged"] == "met"  # 1.5 / 1.1 >= 1.2
    assert s["vs_triton_throughput_ratio_c8_judged"].startswith("unresolved")  # 1.25 / 1.1 < 1.2
    assert s["vs_triton_throughput_ratio_c128_judged"] == "missed: no figure"
    assert s["vs_triton_p99_ratio_c32_judged"] == "missed"  # 1.2 / 1.1 > 1.0
    assert s["vs_triton_p50_ratio_c1_judged"] == "met"  # 0.3 x 1.1 <= 0.5
    assert s["vs_triton_capacity_ratio"] == round((1.5 + 1.65) / 2, 4)
    assert s["vs_triton_capacity_ratio_noise_floor"] == round(SEARCH_RESOLUTION, 4)
    assert s["vs_triton_capacity_ratio_judged"] == "met"
    assert s["static_vs_triton_throughput_ratio_c32"] == 3.0
    assert s["loadgen_vs_triton_throughput_ratio_c32"] is None  # no such point measured
    assert s["capacity_rps"] == {GATEWAY: [300.0, 330.0], TRITON: [200.0, 200.0]}


def test_one_capacity_search_per_arm_has_no_floor() -> None:
    capacity = [
        {"model": "sensor_mlp", "arm": arm, "round": 0, "capacity_rps": cap}
        for arm, cap in ((GATEWAY, 300.0), (TRITON, 200.0))
    ]
    s = triton_summary([], [], capacity, "sensor_mlp")
    assert s["vs_triton_capacity_ratio"] == 1.5
    assert s["vs_triton_capacity_ratio_judged"] == "unresolved: no noise floor measured"


def test_grpc_summary_judges_the_gateways_grpc_against_tritons() -> None:
    """The closed-loop figures over gRPC against Triton's gRPC arm, each beside the larger of
    the two arms' floors; issue 33's target (throughput at 32 calls >= 1.0) judged; the static
    gateway's beside them."""
    floors = {TRITON_GRPC: 1.02, GATEWAY_GRPC: 1.05, GATEWAY_STATIC_GRPC: 1.0}
    point = _wrk_point(32, {"throughput_ratio": 1.04, "p50_ratio": 0.8, "p99_ratio": 0.9}, floors)
    point["vs_triton_grpc"] = {
        GATEWAY_GRPC: point.pop("vs_triton")[GATEWAY],
        GATEWAY_STATIC_GRPC: {"throughput_ratio": {"median": 1.6}},
    }
    s = grpc_summary([point], "sensor_mlp")
    key = "grpc_vs_triton_grpc_throughput_ratio_c32"
    assert (s[key], s[f"{key}_noise_floor"]) == (1.04, 1.05)
    assert s[f"{key}_judged"].startswith("unresolved")  # 1.04 / 1.05 < 1.0 <= 1.04
    assert s["grpc_vs_triton_grpc_p99_ratio_c32"] == 0.9
    assert "grpc_vs_triton_grpc_p99_ratio_c32_judged" not in s  # no target set for it
    assert s["grpc_vs_triton_grpc_throughput_ratio_c8"] is None  # not measured
    assert s["static_grpc_vs_triton_grpc_throughput_ratio_c32"] == 1.6
    point["vs_triton_grpc"][GATEWAY_GRPC]["throughput_ratio"]["median"] = 1.2
    assert grpc_summary([point], "sensor_mlp")[f"{key}_judged"] == "met"  # 1.2 / 1.05 >= 1.0


def test_a_servers_success_count_is_read_from_its_metrics() -> None:
    """Over gRPC the benchmark trusts a call only as far as the server counted it a success:
    Triton's counter (no ``_total`` in its exposition) and the gateway's, by model, summed over
    versions, the gateway's over gRPC with outcome ok only."""
    triton = (
        "# TYPE nv_inference_request_success counter\n"
        'nv_inference_request_success{model="vision_cnn",version="1"} 3\n'
        'nv_inference_request_success{model="sensor_mlp",version="1"} 785\n'
    )
    sample, labels = TRITON_COUNTER
    assert counted(triton, sample, {**labels, "model": "sensor_mlp"}) == 785
    gateway = (
        "# TYPE iotgw_requests counter\n"
        'iotgw_requests_total{model="sensor_mlp",version="1",transport="grpc",outcome="ok"} 40\n'
        'iotgw_requests_total{model="sensor_mlp",version="2",transport="grpc",outcome="ok"} 2\n'
        'iotgw_requests_total{model="sensor_mlp",version="1",transport="http",outcome="ok"} 9\n'
        'iotgw_requests_total{model="sensor_mlp",version="1",transport="grpc",outcome="error"} 5\n'
    )
    sample, labels = GATEWAY_COUNTER
    assert counted(gateway, sample, {**labels, "model": "sensor_mlp"}) == 42


def test_an_interleaved_point_rotates_the_arms_and_takes_ratios_within_rounds() -> None:
    """wrk's and h2load's points: every arm once a round, the first arm rotating, each run
    recorded; per arm the medians and floors, the calls failed summed, and the gateway's
    ratio to the peer taken round by round."""
    rates = {TRITON_GRPC: [100.0, 110.0, 90.0], GATEWAY_GRPC: [150.0, 121.0, 180.0]}
    order: list[str] = []

    def run_one(arm: SimpleNamespace) -> dict[str, Any]:
        order.append(arm.name)
        rate = rates[arm.name][sum(name == arm.name for name in order) - 1]
        return {
            "requests_per_s": rate,
            "p50_ms": 1000.0 / rate,
            "p99_ms": 2000.0 / rate,
            "failed": 1,
            "server_cpu_ms_per_request": 0.5,
        }

    recorded: list[dict[str, Any]] = []
    arms = [SimpleNamespace(name=TRITON_GRPC), SimpleNamespace(name=GATEWAY_GRPC)]
    plan = replace(FULL, repeats=3)
    p = interleaved_point(
        plan,
        arms,
        {"model": "m", "connections": 8},
        "peer_grpc",
        run_one,
        recorded.append,
        peers=(TRITON_GRPC,),
    )
    first, second = TRITON_GRPC, GATEWAY_GRPC
    assert order == [first, second, second, first, first, second]  # rounds 0, 1, 2
    assert [r["figure"] for r in recorded] == ["peer_grpc_run"] * 6
    assert p["figure"] == "peer_grpc_point" and p["connections"] == 8
    mine = p["arms"][GATEWAY_GRPC]
    assert mine["requests_per_s"] == 150.0 and mine["failed"] == 3 and "lost" not in mine
    assert mine["floors"]["requests_per_s"] == pair_floor([150.0, 121.0, 180.0])
    ratio = p["vs_triton_grpc"][GATEWAY_GRPC]["throughput_ratio"]
    assert ratio["median"] == 1.5 and ratio["min"] == 1.1 and ratio["max"] == 2.0
