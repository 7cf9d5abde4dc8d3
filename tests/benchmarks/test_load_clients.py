"""The load clients the benchmarks share, against the bare echo servers they are held to:
every request of a bounded run is answered and counted, over HTTP (aiohttp and the raw client,
in this process and split over processes) and over MQTT (QoS 0 and 1 through Mosquitto)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.clients import ClientProcesses
from benchmarks.loadgen import (
    LoadJob,
    decode_response,
    encode_request,
    merge_load,
    run_http_job,
    run_load,
    split_job,
)
from benchmarks.mqtt_clients import MqttJob, run_mqtt_load
from benchmarks.servers import MQTT_ECHO_READY, start_http_echo, start_mosquitto, start_mqtt_echo
from gateway.codecs.oip import frame

pytestmark = pytest.mark.slow

ROW = np.arange(32, dtype=np.float32).reshape(1, 32)


@pytest.fixture(scope="module")
def http_echo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server, base = start_http_echo(tmp_path_factory.mktemp("echo"), timeout_s=60)
    with server:
        yield f"{base}/v2/models/m/versions/1/infer"


def _job(url: str, client: str, requests: int, concurrency: int = 2) -> LoadJob:
    body, header_length = encode_request("features", ROW)
    return LoadJob(
        url=url,
        body=body,
        header_length=header_length,
        rows_per_request=1,
        concurrency=concurrency,
        duration_s=60.0,
        max_requests=requests,
        warmup_s=0.0,
        timeout_s=30.0,
        client=client,
    )


def test_the_request_is_the_binary_tensor_framing() -> None:
    body, header_length = encode_request("features", ROW, request_id="r1")
    header = json.loads(body[:header_length])
    assert header["id"] == "r1" and header["parameters"] == {"binary_data_output": True}
    (tensor,) = header["inputs"]
    assert (tensor["shape"], tensor["datatype"]) == ([1, 32], "FP32")
    assert tensor["parameters"]["binary_data_size"] == ROW.nbytes
    assert body[header_length:] == ROW.astype("<f4").tobytes()


def test_a_binary_reply_is_read_back() -> None:
    header = json.dumps(
        {
            "outputs": [
                {
                    "name": "y",
                    "shape": [1, 32],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": ROW.nbytes},
                }
            ]
        }
    ).encode()
    outputs = decode_response(header + ROW.tobytes(), len(header))
    np.testing.assert_array_equal(outputs["y"], ROW)


@pytest.mark.parametrize("client", ["aiohttp", "raw"])
def test_a_bounded_http_run_answers_every_request(http_echo: str, client: str) -> None:
    result = asyncio.run(run_load(_job(http_echo, client, requests=50)))
    assert (result["issued"], result["answered"], result["lost"]) == (50, 50, 0)
    assert result["errors"] == {}
    assert len(result["latencies_s"]) == 50 and result["rows_per_s"] > 0


def test_an_unknown_client_is_refused(http_echo: str) -> None:
    with pytest.raises(ValueError, match="unknown client"):
        asyncio.run(run_load(_job(http_echo, "curl", requests=1)))


def test_a_run_split_over_processes_adds_up(http_echo: str) -> None:
    jobs = split_job(_job(http_echo, "raw", requests=40, concurrency=3), 2)
    assert [j.concurrency for j in jobs] == [2, 1]
    assert [j.max_requests for j in jobs] == [20, 20]
    assert len({j.start_at for j in jobs}) == 1
    with ClientProcesses(2, run_http_job) as clients:
        merged = merge_load(clients.run(jobs, timeout_s=120))
    assert (merged["issued"], merged["answered"], merged["lost"]) == (40, 40, 0)
    with pytest.raises(ValueError, match="cannot be split"):
        split_job(dataclasses.replace(jobs[1], concurrency=1), 2)


@pytest.mark.parametrize("qos", [0, 1])
def test_a_bounded_mqtt_run_answers_every_request(tmp_path: Path, qos: int) -> None:
    broker, port = start_mosquitto(tmp_path)
    with broker, start_mqtt_echo(tmp_path, port) as echo:
        echo.wait_for_log(MQTT_ECHO_READY, 60)
        body, header_length = encode_request("features", ROW)
        job = MqttJob(
            port=port,
            topics=("echo/req",),
            client_id="load-test",
            qos=qos,
            payload=frame(body, header_length),
            concurrency=2,
            duration_s=60.0,
            max_requests=30,
            warmup_s=0.0,
            timeout_s=30.0,
        )
        result = run_mqtt_load(job)
    assert (result["issued"], result["answered"], result["lost"]) == (30, 30, 0)
    assert result["errors"] == {} and result["unexpected_replies"] == 0
