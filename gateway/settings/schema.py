"""Typed settings, one model per component, read once by the CLI and passed down.

Sources, strongest first: command-line options, ``IOTGW_*`` environment variables (nested with
``__``, e.g. ``IOTGW_HTTP__PORT=8081``), a TOML file (``--config``), the defaults below.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from gateway.codecs.limits import DecodeLimits
from gateway.mqtt.trust import check_pattern
from gateway.settings.security import (
    check_admin_exposure,
    check_tls_pair,
    resolve_secret_files,
)
from models.serving_plan import DEFAULT_WEIGHT_MEMORY_BUDGET


class HttpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field("127.0.0.1", description="Address the HTTP server listens on.")
    port: int = Field(8080, ge=0, le=65535, description="HTTP port (0 picks a free one).")
    max_body_bytes: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body; bigger ones get 413."
    )
    admin_token: SecretStr | None = Field(
        None,
        description="When set, the /admin endpoints require 'Authorization: Bearer <token>'.",
    )
    admin_token_file: Path | None = Field(
        None,
        description="File holding admin_token (trailing newline stripped); read once at start.",
    )
    inference_token: SecretStr | None = Field(
        None,
        description="When set, /v2/models/..., /v2/repository/... and /v1/... require "
        "'Authorization: Bearer <token>'; the health endpoints stay open for probes.",
    )
    inference_token_file: Path | None = Field(
        None, description="File holding inference_token (trailing newline stripped)."
    )
    metrics_token: SecretStr | None = Field(
        None, description="When set, /metrics requires 'Authorization: Bearer <token>'."
    )
    metrics_token_file: Path | None = Field(
        None, description="File holding metrics_token (trailing newline stripped)."
    )
    allow_unauthenticated_admin: bool = Field(
        False,
        description="Start even though host is not a loopback address and admin_token is "
        "unset (anyone who reaches the port can change knobs and the tuner).",
    )
    tls_cert_file: Path | None = Field(
        None, description="PEM certificate chain: with tls_key_file, serve HTTPS (TLS 1.2+)."
    )
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    max_connections: int = Field(
        1024,
        ge=1,
        description="Open HTTP connections served at once; a request on a connection beyond "
        "them gets 503 (reason connection_limit) and the connection is closed.",
    )
    read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Time a request body may take to arrive in full; a slower one gets 408 and "
        "its connection is closed.",
    )
    keepalive_timeout_s: float = Field(
        60.0,
        gt=0,
        description="An idle connection is closed after this long; also the time a new "
        "connection has to send its first request head.",
    )
    refusal_pace_s: float = Field(
        0.25,
        ge=0,
        description="A connection refused for load (a full queue, an unmeetable deadline, the "
        "byte budget: 503 with Retry-After) and refused again less than this after is "
        "sent that refusal only this long after the first: clients that send again at once "
        "cannot take the cores from the batches with refusals (0: every refusal at once).",
    )

    @model_validator(mode="after")
    def _check_security(self) -> HttpSettings:
        resolve_secret_files(
            self, ("admin_token", "inference_token", "metrics_token"), section="http"
        )
        check_tls_pair(self.tls_cert_file, self.tls_key_file)
        check_admin_exposure(
            self.host,
            admin_token_set=self.admin_token is not None,
            allowed=self.allow_unauthenticated_admin,
        )
        return self


class GrpcSettings(BaseModel):
    """gRPC listens on http.host, with http's TLS files and tokens (gateway/grpc/server.py)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True,
        description="Serve gRPC: the Open Inference Protocol, TF Serving's Predict, "
        "grpc.health.v1 and reflection.",
    )
    port: int = Field(8001, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    max_message_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest request (and reply) message; a bigger one gets RESOURCE_EXHAUSTED.",
    )
    max_concurrent_rpcs: int = Field(
        1024, ge=1, description="Calls served at once; one more gets RESOURCE_EXHAUSTED."
    )
    max_streams_per_connection: int = Field(
        128, ge=1, description="Calls open at once on one connection (HTTP/2 streams)."
    )
    stream_max_in_flight: int = Field(
        64,
        ge=1,
        le=4096,
        description="Requests of one ModelStreamInfer stream answered at once; the next is "
        "read when one is answered.",
    )


class ServingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_repo: Path | None = Field(
        None,
        description="Model repository to serve, or one block-quantized checkpoint file "
        "(served on onnxruntime as model <file name without .safetensors>, version 1); the "
        "bundled demo repository when unset.",
    )
    cache_dir: Path = Field(
        Path.home() / ".cache" / "iotgw",
        description="Folder of what the gateway keeps between runs: the bundled demo repository "
        "(built here on first use), the embedded Mosquitto's configuration and persistent store "
        "(mosquitto/<port>/, one per listener port: requests queued while the gateway is "
        "down), the serving plans' "
        "measured costs (plans/) and the one-model repositories of checkpoint files given as "
        "model_repo (checkpoint-repos/).",
    )
    executor_threads: int = Field(
        32,
        ge=2,
        le=1024,
        description="Threads of the executor that runs backend calls and model loads.",
    )
    max_concurrency: int = Field(
        16, ge=1, le=64, description="Upper bound of the concurrency knob (instances per model)."
    )
    weight_memory_budget: float = Field(
        DEFAULT_WEIGHT_MEMORY_BUDGET,
        ge=0.0,
        le=1.0,
        description="Weight memory a quantized checkpoint may use, as a fraction of its fp32 "
        "weights, where its config.toml sets none: within it each quantized tensor runs the way "
        "measured fastest on this machine (0: every tensor at its smallest).",
    )
    ingest_processes: int = Field(
        0,
        ge=0,
        le=64,
        description="Processes that take HTTP connections (one shared port) and, with a broker "
        "that has shared subscriptions, MQTT requests, and decode them for the serving process; "
        "0: the serving process does all protocol work itself.",
    )
    shutdown_grace_s: float = Field(
        25.0,
        ge=0,
        description="On SIGTERM/SIGINT, how long requests already taken may take to be answered "
        "before the gateway stops anyway: HTTP requests get all of it, MQTT requests the shorter "
        "of this and mqtt.drain_timeout_s (--mqtt-drain-timeout-s); 25 s fits Kubernetes' "
        "default 30 s.",
    )
    max_inputs: int = Field(
        64, ge=1, le=4096, description="Most tensors (inputs, requested outputs) in a request."
    )
    max_dims: int = Field(
        8, ge=1, le=32, description="Most dimensions of a tensor (and nesting of its JSON data)."
    )
    max_elements: int = Field(
        16 * 1024 * 1024, ge=1, description="Most tensor elements in one request, all inputs."
    )

    def decode_limits(self) -> DecodeLimits:
        return DecodeLimits(
            max_inputs=self.max_inputs, max_dims=self.max_dims, max_elements=self.max_elements
        )

    batch_watchdog_s: float = Field(
        30.0,
        gt=0,
        description="Longest a runtime call may run before its batch is failed with 504 and its "
        "instance replaced. Batches here take milliseconds and first-call graph builds a few "
        "seconds, so 30 s is only reached by a hung backend, and it answers before the usual "
        "30-60 s client timeouts do.",
    )
    batch_watchdog_max_stuck: int = Field(
        2,
        ge=1,
        description="Stuck runtime calls a model may leave running (Python cannot stop a "
        "thread; each holds an executor thread until it returns). At this many the model is "
        "marked unavailable instead of getting another instance. Whatever this says, stuck "
        "calls never hold more than half of executor_threads across all models.",
    )
    max_queued_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1,
        description="Bytes of request tensors that may wait in the model queues or run at once, "
        "across all models; a request that does not fit gets 503 (reason memory), one larger "
        "than the whole budget 413.",
    )
    event_loop: Literal["auto", "uvloop", "asyncio"] = Field(
        "auto",
        description="The event loop: uvloop where it is installed (auto), or the one named "
        "(gateway/event_loop.py); uvloop costs the gateway less CPU per request.",
    )
    json_codec: Literal["orjson", "stdlib"] = Field(
        "orjson",
        description="JSON of inference requests and replies: orjson, or the standard library "
        "(the same replies, slower; kept to measure the difference).",
    )


class MqttSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(True, description="Serve inference requests over MQTT.")
    broker: str | None = Field(
        None,
        description="External broker, mqtt://host:port or mqtts://host:port; unset: start the "
        "embedded broker on 127.0.0.1.",
    )
    embedded_port: int = Field(
        1883, ge=0, le=65535, description="Port of the embedded broker (0 picks a free one)."
    )
    embedded_broker: Literal["auto", "mosquitto", "amqtt"] = Field(
        "auto",
        description="Embedded broker: mosquitto (a managed child process, MQTT 5), amqtt "
        "(in-process, MQTT 3.1.1), or auto = mosquitto when installed, else amqtt.",
    )
    embedded_password_file: Path | None = Field(
        None,
        description="Password file of the embedded broker (mosquitto_passwd's format); when set, "
        "anonymous clients are refused and the gateway connects with username/password.",
    )
    protocol: Literal["5", "3.1.1"] = Field(
        "5",
        description="MQTT version towards an external broker (the embedded one: 5 with "
        "mosquitto, 3.1.1 with amqtt).",
    )
    client_id: str = Field(
        default_factory=lambda: f"iotgw-{socket.gethostname()}"[:64],
        description="Client id; stable across restarts so the broker keeps the session.",
    )
    username: str | None = Field(None, description="Broker user name.")
    password: SecretStr | None = Field(None, description="Broker password.")
    password_file: Path | None = Field(
        None, description="File holding password (trailing newline stripped); read once at start."
    )
    ca_file: Path | None = Field(None, description="CA bundle for mqtts:// (system CAs if unset).")
    cert_file: Path | None = Field(None, description="Client certificate for mqtts://.")
    key_file: Path | None = Field(None, description="Client key for mqtts://.")
    tls_insecure: bool = Field(False, description="Skip broker certificate host name checks.")
    qos: int = Field(1, ge=0, le=1, description="QoS of the subscription and of the replies.")
    topic_prefix: str = Field("iotgw", pattern=r"^[^#+]+$", description="Topic prefix.")
    shared_subscription: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Subscribe as $share/<group>/...: auto = when the broker speaks MQTT 5 and "
        "grants it.",
    )
    share_group: str = Field("iotgw", pattern=r"^[^/#+]+$", description="Shared group name.")
    session_expiry_s: int = Field(
        3600, ge=0, description="How long the broker keeps the session (and queued requests)."
    )
    receive_maximum: int = Field(
        64, ge=1, le=65535, description="Most unacknowledged requests the broker sends at once."
    )
    max_payload_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="Largest request payload; bigger ones get 413. Under MQTT 5 the broker is "
        "told (Maximum Packet Size) to drop packets above twice this, unanswered.",
    )
    max_backlog: int = Field(
        1024,
        ge=0,
        description="Requests held waiting for an in-flight slot when the broker sends more "
        "than receive_maximum (MQTT 3.1.1 brokers do); beyond it they get a 503 error reply.",
    )
    max_unsent_packets: int = Field(
        4096,
        ge=16,
        description="Packets (replies, acknowledgements) waiting to be written to the broker "
        "at most: beyond it the gateway stops reading requests until half are written, so a "
        "flood answered faster than the broker reads holds bounded memory here (the broker "
        "queues the rest within its own limits).",
    )
    dedupe_window_s: float = Field(
        60.0,
        ge=0,
        description="A request with the (device, reply topic, correlation data or id) of one "
        "seen this recently is a redelivery and is not answered again.",
    )
    response_topic_pattern: str = Field(
        "{prefix}/infer/+/res/{device}/#",
        description="MQTT topic filter a request's Response Topic must match, with {prefix}, "
        "{model} and {device} filled in ('#' also matches its parent level). A Response Topic "
        "outside it gets a 403 error reply on the device's own reply topic instead. '#' lets "
        "a device make the gateway publish on any topic the gateway's account may write.",
    )
    device_identity: Literal["topic", "user_property"] = Field(
        "topic",
        description="topic: the request topic's device level is the device (bound to the "
        "publisher's account only by the broker's ACL, deploy/mosquitto/acl); user_property: "
        "also require the MQTT 5 user property identity_property, stamped by the broker, to "
        "name the same device (403 otherwise).",
    )
    identity_property: str = Field(
        "iotgw-sender",
        min_length=1,
        description="User property a broker plugin or rule sets to the publisher's "
        "authenticated id (device_identity = user_property).",
    )
    drain_timeout_s: float = Field(
        10.0,
        ge=0,
        description="How long MQTT requests already taken may take to be answered when the "
        "gateway shuts down (or its broker connection is lost); at shutdown the shorter of this "
        "and serving.shutdown_grace_s (--shutdown-grace) applies. Requests left unanswered are "
        "not acknowledged, so the broker redelivers them to the next session.",
    )
    keepalive_s: int = Field(30, ge=5, le=3600, description="MQTT keep-alive.")
    reconnect_min_s: float = Field(0.2, gt=0, description="First reconnect delay.")
    reconnect_max_s: float = Field(10.0, gt=0, description="Longest reconnect delay.")

    @field_validator("response_topic_pattern")
    @classmethod
    def _valid_topic_filter(cls, pattern: str) -> str:
        return check_pattern(pattern)

    @model_validator(mode="after")
    def _identity_needs_mqtt5(self) -> MqttSettings:
        if self.device_identity == "user_property" and self.protocol != "5":
            raise ValueError("device_identity = user_property needs protocol 5 (user properties)")
        return self

    @model_validator(mode="after")
    def _read_password_file(self) -> MqttSettings:
        resolve_secret_files(self, ("password",), section="mqtt")
        return self


class TunerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        True, description="Run the online tuner, which retunes each model's knobs under load."
    )
    algorithm: Literal["rrl", "adaptive-rrl", "bo", "hill-climb", "aimd", "inflight"] = Field(
        "adaptive-rrl", description="Tuning algorithm (rrl/README.md)."
    )
    objective: Literal["latency", "cost"] = Field(
        "latency",
        description="latency: lowest p95 with an SLO-violation penalty; cost: fewest cores "
        "that meet the SLO.",
    )
    models: list[str] | None = Field(
        None, description="Models to tune (default: every served model, once it has traffic)."
    )
    interval_s: float = Field(0.5, gt=0, description="Shortest decision interval.")
    max_interval_s: float = Field(
        10.0, gt=0, description="Longest wait for min_requests before an interval is idle."
    )
    min_requests: int = Field(40, ge=1, description="Requests an interval needs to count.")
    min_rebuild_gap_s: float = Field(
        1.0, ge=0, description="Least time between two thread/concurrency changes of a model."
    )
    rebuild_duty: float = Field(
        0.1,
        gt=0,
        le=1,
        description="Most of a model's time its session rebuilds may take: after a thread or "
        "concurrency change whose rebuild took t seconds, the next one waits t / this "
        "(min_rebuild_gap_s at least), unless the model violates its SLO meanwhile.",
    )
    unsafe_violation_fraction: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Safety limit of a trial: a candidate configuration whose window scores "
        "worse than one with p95 at the SLO and this fraction of its requests over the SLO is "
        "reverted at once, whatever the comparison with the running configuration says (0.5: "
        "as bad as half the requests late).",
    )
    explore_regret: float = Field(
        2.0,
        gt=1,
        description="A configuration is not tried when the tuner's own estimates (profile "
        "prior, what it measured) put its objective above this many times the running "
        "configuration's (2: twice as bad).",
    )
    profiles: bool = Field(
        True,
        description="Warm-start each workload state from the model's profile (iotgw profile) "
        "when one matches the model's name, runtime and this machine's cores.",
    )
    profiles_dir: Path | None = Field(
        None, description="Where profiles are read (default: the bundled rrl/profiles)."
    )
    max_batch_size: int = Field(128, ge=1, description="Largest batch size the tuner tries.")
    max_batch_timeout_ms: float = Field(
        8.0, ge=1, description="Longest batch timeout the tuner tries."
    )
    seed: int = Field(0, description="Seed of the tuners' random choices.")
    start: Literal["expert", "configured"] = Field(
        "expert",
        description="Where each agent starts: expert (eager batching, instances sized to the "
        "model's share of the cores; rrl.tuners.space.expert_default) or configured (the model's "
        "config.toml knobs).",
    )


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="IOTGW_",
        env_nested_delimiter="__",
        extra="forbid",
        nested_model_default_partial_update=True,
    )

    http: HttpSettings = HttpSettings()
    grpc: GrpcSettings = GrpcSettings()
    serving: ServingSettings = ServingSettings()
    mqtt: MqttSettings = MqttSettings()
    tuner: TunerSettings = TunerSettings()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO",
        description="Least severe log lines printed. INFO: the start-up on one screen, ending "
        "with one 'ready:' line once the gateway takes requests. Only DEBUG adds each model's, "
        "instance's, backend's and tuner decision's detail and the INFO lines of the libraries "
        "underneath (TensorFlow, amqtt, ...); at WARNING and ERROR the libraries log errors "
        "only (TensorFlow's import banners none).",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="Log lines as text, or one JSON object per line for log shippers."
    )

    @classmethod
    def load(cls, toml_file: Path | None = None, **overrides: Any) -> GatewaySettings:
        """Settings from every source; ``overrides`` (nested dicts) win over all of them."""

        class _Sourced(cls):  # type: ignore[valid-type, misc]
            @classmethod
            def settings_customise_sources(
                cls_,
                settings_cls: type[BaseSettings],
                init_settings: PydanticBaseSettingsSource,
                env_settings: PydanticBaseSettingsSource,
                dotenv_settings: PydanticBaseSettingsSource,
                file_secret_settings: PydanticBaseSettingsSource,
            ) -> tuple[PydanticBaseSettingsSource, ...]:
                sources: tuple[PydanticBaseSettingsSource, ...] = (init_settings, env_settings)
                if toml_file is not None:
                    sources += (TomlConfigSettingsSource(settings_cls, toml_file=toml_file),)
                return sources

        if toml_file is not None and not toml_file.is_file():
            raise FileNotFoundError(f"settings file {toml_file} not found")
        loaded = _Sourced(**overrides)
        return cls.model_validate(loaded.model_dump())
