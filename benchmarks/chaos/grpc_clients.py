"""gRPC clients for ``iotgw bench chaos``: ModelInfer calls beside the MQTT devices, with a ledger
of the same form, so that each call ends as answered (200), answered with an error (by reason),
or lost.

The clients are written as a gRPC user would write them against a gateway that may die or drain:
one channel over every gateway's gRPC port (``round_robin``, with gRPC's client-side health
checking, so a draining replica's NOT_SERVING takes it out of the rotation), ``wait_for_ready``
(a call made while no gateway is up waits for one instead of failing), gRPC's own retry policy
on UNAVAILABLE (a call whose gateway was killed under it is sent again; the gateway's refusals
carry ``grpc-retry-pushback-ms``, which the policy obeys), and short reconnect backoffs. Every
call carries the model's SLO as its ``timeout`` parameter (as each device stamps it on its
requests) and the end of the settle period as its gRPC deadline.

- a call that returned OK is answered (status 200);
- a call refused by a gateway is an error by the gateway's reason (the ``iotgw-reason``
  trailer), one that failed in the transport with no gateway's word is an error named
  ``grpc_<code>`` (the client was told at once: nothing was silent);
- a call still unanswered when its deadline, the end of the settle period, passed is lost.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import grpc

_INFER = "/inference.GRPCInferenceService/ModelInfer"
_SERVICE_CONFIG = json.dumps(
    {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ""},
        "methodConfig": [
            {
                "name": [{"service": "inference.GRPCInferenceService"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }
)
_CHANNEL_OPTIONS = (
    ("grpc.service_config", _SERVICE_CONFIG),
    ("grpc.enable_retries", 1),
    # A restarted gateway is found within a second, not after grpc's default backoff (up to
    # two minutes after a few failed connects).
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


@dataclass(frozen=True, slots=True)
class GrpcJob:
    """The gRPC clients' share of a case's load."""

    targets: tuple[str, ...]  # "127.0.0.1:<port>" of every gateway
    model: str
    input_name: str
    shape: tuple[int, ...]
    tensor: bytes  # raw little-endian FP32, batch 1
    rate: float  # requests per second, open loop
    duration_s: float
    settle_s: float
    start_at: float  # time.monotonic() at which the load starts (the devices' too)
    slo_s: float


def target(addresses: tuple[str, ...]) -> str:
    """One channel target naming every address (grpc's ``ipv4:`` list)."""
    return "ipv4:" + ",".join(addresses)


def request_bytes(job: GrpcJob, rid: str) -> bytes:
    from gateway.grpc.messages import message

    request = message("inference.ModelInferRequest")(model_name=job.model, id=rid)
    request.parameters["timeout"].int64_param = max(1, round(job.slo_s * 1e6))
    request.inputs.add(name=job.input_name, datatype="FP32", shape=list(job.shape))
    request.raw_input_contents.append(job.tensor)
    return bytes(request.SerializeToString())


class _Ledger:
    def __init__(self) -> None:
        self.sent_at: list[float] = []
        self.replied_at: list[float] = []  # NaN: no answer
        self.status: list[int] = []  # 0: no answer, 200: OK, -1: an error
        self.reasons: dict[int, str] = {}
        self.unmatched = 0

    def sent(self) -> int:
        """A call about to leave; returns its place in the ledger."""
        self.sent_at.append(time.monotonic())
        self.replied_at.append(math.nan)
        self.status.append(0)
        return len(self.sent_at) - 1

    def record(self, i: int, status: int, reason: str | None = None) -> None:
        self.replied_at[i] = time.monotonic()
        self.status[i] = status
        if reason is not None:
            self.reasons[i] = reason


async def _one(infer: Any, job: GrpcJob, ledger: _Ledger, i: int, end: float) -> None:
    from gateway.grpc.messages import message

    rid = f"grpc-{i}"
    body = request_bytes(job, rid)
    try:
        reply = await infer(body, timeout=max(0.001, end - time.monotonic()), wait_for_ready=True)
    except grpc.aio.AioRpcError as err:
        reason = dict(err.trailing_metadata() or ()).get("iotgw-reason")
        if reason is None and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
            return  # the client's own deadline, the end of the settle period: lost
        ledger.record(i, -1, str(reason) if reason else f"grpc_{err.code().name.lower()}")
        return
    ledger.record(i, 200)
    if message("inference.ModelInferResponse").FromString(reply).id != rid:
        ledger.unmatched += 1


async def _run(job: GrpcJob) -> dict[str, Any]:
    ledger = _Ledger()
    end = job.start_at + job.duration_s + job.settle_s
    async with grpc.aio.insecure_channel(target(job.targets), options=_CHANNEL_OPTIONS) as channel:
        # Bytes in, bytes out: the ledger parses only the reply's id.
        infer: Any = channel.unary_unary(_INFER)
        await asyncio.sleep(max(0.0, job.start_at - time.monotonic()))
        calls = []
        for i in range(int(job.rate * job.duration_s)):
            await asyncio.sleep(max(0.0, job.start_at + i / job.rate - time.monotonic()))
            calls.append(asyncio.create_task(_one(infer, job, ledger, ledger.sent(), end)))
        load_end = time.monotonic()
        await asyncio.gather(*calls)
    return {
        "sent_at": ledger.sent_at,
        "replied_at": [None if math.isnan(t) else t for t in ledger.replied_at],
        "status": ledger.status,
        "reasons": ledger.reasons,
        "duplicates": 0,  # a unary call has one answer
        "unmatched": ledger.unmatched,
        "load_end": load_end,
    }


def run_grpc_clients(job: GrpcJob) -> dict[str, Any]:
    """The job's calls, open loop at ``job.rate``; returns the ledger (a client process's job
    runner)."""
    return asyncio.run(_run(job))
