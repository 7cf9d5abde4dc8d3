"""What ``iotgw serve`` tells its operator once the models are loaded: one line saying that the
gateway is ready, written when ``/v2/health/ready`` turns 200 (HTTP listening, the models
loaded, MQTT subscribed) and naming where devices publish and where they read replies; or a
warning saying what it still waits for, at once when waiting cannot end by itself (no model,
a required model that failed to load) and after ``patience_s`` otherwise (a broker that does
not answer), followed by the ready line if it comes after all."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from gateway.lifecycle import Readiness
from gateway.model_registry import ModelRegistry, VersionStatus
from gateway.mqtt.session import BrokerAddress
from gateway.mqtt.trust import ReplyNamespace
from gateway.settings.schema import GatewaySettings

log = logging.getLogger("gateway")

READY_PATIENCE_S = 10.0
_POLL_S = 0.05  # how soon after readiness the line is written
_SLOW_POLL_S = 0.1  # once the warning is out (a cheap check, yet not 20 a second for good)


@dataclass(frozen=True, slots=True)
class Endpoints:
    """Where clients reach the gateway: ``http`` is the OIP root (``http://host:port/v2``);
    ``mqtt`` the broker (None when MQTT is off), with the topics devices use there."""

    http: str
    mqtt: str | None = None
    topic_prefix: str = "iotgw"
    reply_pattern: str = "{prefix}/infer/+/res/{device}/#"
    grpc: str | None = None  # host:port, when gRPC is on


def endpoints(
    settings: GatewaySettings,
    http_port: int,
    broker: BrokerAddress | None,
    grpc_port: int | None = None,
) -> Endpoints:
    """Where clients reach a gateway listening on ``http_port`` (and ``grpc_port``) and serving
    MQTT on ``broker``."""
    scheme = "https" if settings.http.tls_cert_file else "http"
    http = f"{scheme}://{settings.http.host}:{http_port}/v2"
    grpc = f"{settings.http.host}:{grpc_port}" if grpc_port is not None else None
    if broker is None:
        return Endpoints(http, grpc=grpc)
    url = f"{'mqtts' if broker.tls else 'mqtt'}://{broker.host}:{broker.port}"
    mqtt = settings.mqtt
    return Endpoints(http, url, mqtt.topic_prefix, mqtt.response_topic_pattern, grpc)


def serving(registry: ModelRegistry) -> int:
    """Model versions serving now."""
    return sum(s.state == "READY" for s in registry.statuses())


async def until_loaded(
    loaded: Awaitable[None], stop: asyncio.Event, registry: ModelRegistry
) -> bool:
    """Wait for the models (a signal during the load stops at once: False), then log what
    serves; the ready line waits for readiness (``announce_ready``)."""
    waits = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(loaded)}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiting in waits:
            waiting.cancel()
    if stop.is_set():
        return False
    # Everything allocated so far (TF, sessions, modules) lives as long as the process: moved
    # out of the collector's reach, a full collection no longer walks it (~0.25 s with TF
    # loaded, a pause every device would feel).
    gc.collect()
    gc.freeze()
    statuses = registry.statuses()
    log.log(*loaded_line(statuses))
    for s in statuses:  # each model's detail is at DEBUG: the ones not serving are named here
        if s.state != "READY":
            log.warning(
                "  %s v%d: %s%s", s.name, s.version, s.state, f" ({s.reason})" * bool(s.reason)
            )
    return True


def ready_line(endpoints: Endpoints, serving: int) -> str:
    """The ready line; it starts ``ready: <http>/v2`` (tools wait for that)."""
    models = f"{serving} model version{'s' * (serving != 1)}"
    grpc = f", gRPC {endpoints.grpc}" if endpoints.grpc is not None else ""
    if endpoints.mqtt is None:
        return f"ready: {endpoints.http}{grpc} serve{'s' * (not grpc)} {models} (MQTT off)"
    prefix = endpoints.topic_prefix.rstrip("/")
    replies = ReplyNamespace(endpoints.reply_pattern, prefix).for_device("<model>", "<device_id>")
    return (
        f"ready: {endpoints.http}{grpc} and {endpoints.mqtt} serve {models}; devices publish to "
        f"{prefix}/infer/<model>/req/<device_id> and read replies on "
        f"{prefix}/infer/<model>/res/<device_id> (an MQTT 5 Response Topic must match {replies})"
    )


def loaded_line(statuses: Sequence[VersionStatus]) -> tuple[int, str]:
    """(level, line) once the models are loaded: INFO when every version is ready."""
    ready = sum(s.state == "READY" for s in statuses)
    if not statuses:
        return logging.WARNING, "the model repository holds no model version"
    level = logging.INFO if ready == len(statuses) else logging.WARNING
    return level, f"{ready} of {len(statuses)} model versions loaded"


def _permanent(waiting: Sequence[str]) -> bool:
    """Whether the gateway waits for something that will not come by itself: once the models
    are loaded, a model reason only changes when an operator changes the repository."""
    return any(w.startswith(("model ", "models: ")) for w in waiting)


async def announce_ready(
    readiness: Readiness, line: Callable[[], str], *, patience_s: float = READY_PATIENCE_S
) -> None:
    """Log ``line()`` once ``readiness`` is ready (made then: the models serving then, one
    loaded into an empty repository included); warn once meanwhile if it is not, saying what
    it waits for. Returns after the ready line (cancel it at shutdown)."""
    started = time.monotonic()
    warned = False
    readiness.when_ready(lambda: log.info("%s", line()))
    while True:
        waiting = readiness.waiting_for()  # the first answer with nothing waiting logs the line
        if not waiting:
            return
        if not warned and (_permanent(waiting) or time.monotonic() - started >= patience_s):
            warned = True
            log.warning(
                "not ready: /v2/health/ready answers 503 while it waits for: %s%s",
                "; ".join(waiting),
                _hint(waiting),
            )
        await asyncio.sleep(_SLOW_POLL_S if warned else _POLL_S)


def _hint(waiting: Sequence[str]) -> str:
    if any(w == "models: the repository is empty" for w in waiting):
        return (
            " (put <model>/<version>/ folders in the repository, then POST "
            "/v2/repository/models/<model>/load; or leave out --model-repo to serve the demo "
            "models)"
        )
    if any(w.startswith("model ") for w in waiting):
        return (
            " (fix the model, or set required = false in its config.toml to serve without "
            "it; then POST /v2/repository/models/<model>/load)"
        )
    if any(w.startswith("mqtt:") for w in waiting):
        return " (check --broker and that the broker is up; the gateway keeps retrying)"
    return ""
