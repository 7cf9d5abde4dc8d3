"""How much the MQTT benchmark measures (``FULL`` for the committed figures, ``QUICK`` for CI)
and the one request it sends."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.common import MIN_FULL_RUNS
from benchmarks.loadgen import encode_request
from gateway.codecs.oip import frame

MODEL = "sensor_mlp"
LOW_LOAD_KNOBS = {"batch_timeout_ms": 0, "max_batch_size": 1}
SATURATION_KNOBS = {"batch_timeout_ms": 1, "max_batch_size": 32}


@dataclass(frozen=True)
class Plan:
    runs: int
    low_load_requests: int
    low_load_warmup_s: float
    saturation_s: float
    saturation_warmup_s: float
    processes: int  # load-client processes, the same for MQTT and HTTP
    in_flight: int  # requests outstanding per client process
    timeout_s: float  # a request without a reply after this long is lost


FULL = Plan(
    runs=MIN_FULL_RUNS,
    low_load_requests=400,
    low_load_warmup_s=0.5,
    saturation_s=4.0,
    saturation_warmup_s=1.0,
    processes=2,
    # Enough that the gateway's event loop, not the round trip through the broker, limits the
    # rate (16 left it partly idle over MQTT), and still well inside the model's 100 ms SLO.
    in_flight=32,
    timeout_s=10.0,
)
QUICK = Plan(
    runs=1,
    low_load_requests=30,
    low_load_warmup_s=0.1,
    saturation_s=0.8,
    saturation_warmup_s=0.2,
    processes=2,
    in_flight=4,
    timeout_s=10.0,
)


@dataclass(frozen=True, slots=True)
class Request:
    """The MLP request (1x32 FP32, binary framing): as an MQTT frame, and as an HTTP body with
    its JSON header length."""

    frame: bytes
    body: bytes
    header_length: int


def request(rng: np.random.Generator, rid: str) -> Request:
    x = rng.standard_normal((1, 32)).astype("<f4")
    body, header_length = encode_request("features", x, request_id=rid)
    return Request(frame(body, header_length), body, header_length)
