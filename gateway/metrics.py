"""Prometheus metrics of the gateway, in a registry per gateway instance (several can live in one
process, as in the tests)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

# The *_created series double the output and no dashboard of ours reads them.
disable_created_metrics()

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class GatewayMetrics:
    """Every metric of a gateway, declared by area: requests and batches, the guards that bound
    them, the online tuner, the transports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._requests(self.registry)
        self._batches_and_models(self.registry)
        self._guards(self.registry)
        self._tuner(self.registry)
        self._transports(self.registry)
        self._grpc(self.registry)

    def _requests(self, r: CollectorRegistry) -> None:
        self.requests = Counter(
            "iotgw_requests",
            "Inference requests by model, transport and outcome.",
            ["model", "version", "transport", "outcome"],
            registry=r,
        )
        self.rejections = Counter(
            "iotgw_rejections",
            "Requests refused before computing, by reason.",
            ["model", "version", "reason"],
            registry=r,
        )
        self.error_replies = Counter(
            "iotgw_error_replies",
            "Requests answered with an error reply, by transport and reason (malformed, "
            "too large, unknown model, overload, ...).",
            ["transport", "reason"],
            registry=r,
        )
        self.refusals_paced = Counter(
            "iotgw_refusals_paced",
            "Refusals for load held before they were sent, because the same connection was "
            "refused less than http.refusal_pace_s before (a client ignoring Retry-After).",
            ["transport"],
            registry=r,
        )
        self.queue_seconds = Histogram(
            "iotgw_queue_seconds",
            "Time a request waited in its model's queue.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "iotgw_compute_seconds",
            "Backend time of one batch.",
            ["model", "version"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.latency_seconds = Histogram(
            "iotgw_request_latency_seconds",
            "Gateway time of one request, decode to reply.",
            ["model", "version", "transport"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def _batches_and_models(self, r: CollectorRegistry) -> None:
        self.batch_size = Histogram(
            "iotgw_batch_rows",
            "Rows per batch.",
            ["model", "version"],
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "iotgw_queue_depth",
            "Requests waiting in the model's queue.",
            ["model", "version"],
            registry=r,
        )
        self.knob = Gauge(
            "iotgw_knob",
            "Current value of each parallelism knob (batch_timeout in ms).",
            ["model", "version", "knob"],
            registry=r,
        )
        self.model_ready = Gauge(
            "iotgw_model_ready",
            "1 when the model version serves.",
            ["model", "version"],
            registry=r,
        )

    def _guards(self, r: CollectorRegistry) -> None:
        self.batch_watchdog = Counter(
            "iotgw_batch_watchdog",
            "Batches the watchdog gave up on (runtime call past serving.batch_watchdog_s); each "
            "abandons its runtime instance.",
            ["model", "version"],
            registry=r,
        )
        self.abandoned_calls = Gauge(
            "iotgw_abandoned_calls",
            "Executor threads still held by backend calls the watchdog gave up on (a thread "
            "cannot be stopped; it frees itself if the call ever returns).",
            registry=r,
        )
        self.queued_bytes = Gauge(
            "iotgw_queued_bytes",
            "Bytes of request tensors waiting in the model queues or running, charged against "
            "serving.max_queued_bytes.",
            registry=r,
        )

    def _tuner(self, r: CollectorRegistry) -> None:
        """The online tuner's state (gateway.tuning), per tuned model."""
        self.tuner_decisions = Counter(
            "iotgw_tuner_decisions",
            "Tuner decisions by kind (explore, exploit, backoff, veto, hold, drain, idle, "
            "workload, failed).",
            ["model", "version", "kind"],
            registry=r,
        )
        self.tuner_config = Gauge(
            "iotgw_tuner_config",
            "Knobs of the configuration running now (which=current) and of the best known one "
            "(which=best); batch_timeout in ms.",
            ["model", "version", "which", "knob"],
            registry=r,
        )
        self.tuner_objective = Gauge(
            "iotgw_tuner_objective",
            "Objective of the last measured interval (which=last) and the best known "
            "configuration's estimate (which=best).",
            ["model", "version", "which"],
            registry=r,
        )
        self.tuner_workload = Gauge(
            "iotgw_tuner_workload",
            "Workload state: rate_level (log2 of requests/s), size_level (log2 of rows per "
            "request), rate_per_s (the monitor's estimate).",
            ["model", "version", "field"],
            registry=r,
        )
        self.tuner_configurations = Gauge(
            "iotgw_tuner_configurations",
            "Configurations the current workload's table has measured or estimated.",
            ["model", "version", "kind"],
            registry=r,
        )

    def _transports(self, r: CollectorRegistry) -> None:
        """The MQTT adapter's connection (gateway.mqtt; refusals are iotgw_error_replies_total
        with transport="mqtt") and the ingest processes (gateway.ingest)."""
        self.mqtt_connected = Gauge(
            "iotgw_mqtt_connected",
            "1 while the gateway is connected to its broker and subscribed to the requests.",
            ["broker"],
            registry=r,
        )
        self.mqtt_reconnects = Counter(
            "iotgw_mqtt_reconnects",
            "Reconnection attempts after a broker connection was lost or refused.",
            registry=r,
        )
        self.mqtt_in_flight = Gauge(
            "iotgw_mqtt_in_flight",
            "MQTT requests taken from the broker and not yet answered and acknowledged.",
            registry=r,
        )
        self.mqtt_backlog = Gauge(
            "iotgw_mqtt_backlog",
            "MQTT requests received beyond the in-flight limit, waiting to be taken.",
            registry=r,
        )
        self.mqtt_duplicates = Counter(
            "iotgw_mqtt_duplicates",
            "Redelivered MQTT requests recognised as already answered (acknowledged, not run).",
            registry=r,
        )
        self.mqtt_read_pauses = Counter(
            "iotgw_mqtt_read_pauses",
            "Times the gateway stopped reading MQTT requests because more than "
            "mqtt.max_unsent_packets waited to be written to the broker (a flood answered "
            "faster than the broker reads).",
            registry=r,
        )
        self.ingest_mqtt = Gauge(
            "iotgw_ingest_mqtt",
            "Each ingest process's MQTT session, as it last reported (every 0.5 s): connected "
            "(1/0), requests in flight, requests in its backlog.",
            ["process", "state"],
            registry=r,
        )
        self.ingest_requests = Counter(
            "iotgw_ingest_requests",
            "Inference requests the serving process took from each ingest process.",
            ["process"],
            registry=r,
        )
        self.ingest_restarts = Counter(
            "iotgw_ingest_restarts",
            "Ingest processes restarted after they exited on their own.",
            registry=r,
        )

    def _grpc(self, r: CollectorRegistry) -> None:
        """The gRPC server (gateway.grpc; refusals are iotgw_error_replies_total with
        transport="grpc")."""
        self.grpc_listening = Gauge(
            "iotgw_grpc_listening",
            "1 while the gRPC server listens on address (host:port), with TLS when scheme is "
            "grpcs.",
            ["address", "scheme"],
            registry=r,
        )
        self.grpc_in_flight = Gauge(
            "iotgw_grpc_in_flight",
            "gRPC requests taken and not yet answered (a ModelStreamInfer stream's one by one).",
            registry=r,
        )
        self.grpc_streams = Gauge(
            "iotgw_grpc_streams",
            "ModelStreamInfer streams open.",
            registry=r,
        )

    def watch_mqtt(
        self,
        broker: str,
        *,
        connected: Callable[[], bool],
        in_flight: Callable[[], int],
        backlog: Callable[[], int],
    ) -> None:
        """Read the MQTT adapter's state when scraped (no update on the request path)."""
        self.mqtt_connected.labels(broker).set_function(lambda: float(connected()))
        self.mqtt_in_flight.set_function(in_flight)
        self.mqtt_backlog.set_function(backlog)

    def watch_grpc(
        self,
        address: str,
        *,
        tls: bool,
        listening: Callable[[], bool],
        in_flight: Callable[[], int],
        streams: Callable[[], int],
    ) -> None:
        """Read the gRPC server's state when scraped, as ``watch_mqtt`` does the adapter's."""
        scheme = "grpcs" if tls else "grpc"
        self.grpc_listening.labels(address, scheme).set_function(lambda: float(listening()))
        self.grpc_in_flight.set_function(in_flight)
        self.grpc_streams.set_function(streams)

    def render(self) -> bytes:
        return generate_latest(self.registry)
