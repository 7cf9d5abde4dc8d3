"""The transport-free inference service: model lookup, request checks, batching, control.

HTTP and MQTT adapters call ``infer``; the tuner calls the control methods (``knobs``,
``set_knobs``, ``stats``). Nothing here knows about a wire format.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Iterable
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from gateway.codecs.datatypes import dtype_label
from gateway.errors import BadRequest, ModelUnavailable, NotFound
from gateway.knobs import KnobLimits, Knobs
from gateway.metrics import GatewayMetrics
from gateway.model_host import ModelHost, ModelState, WindowStats
from gateway.types import InferenceRequest, InferenceResponse
from models.repository import BrokenVersion, ModelVersion
from models.runtime import ModelMetadata, RuntimeError_

log = logging.getLogger("gateway.service")


@dataclass(frozen=True, slots=True)
class VersionStatus:
    name: str
    version: int
    state: str
    reason: str


class InferenceService:
    def __init__(
        self, *, executor: Executor, metrics: GatewayMetrics, max_concurrency: int = 16
    ) -> None:
        self._executor = executor
        self._max_concurrency = max_concurrency
        self.metrics = metrics
        self._hosts: dict[str, dict[int, ModelHost]] = {}
        self._broken: dict[str, dict[int, BrokenVersion]] = {}

    # -- lifecycle -------------------------------------------------------------------------

    def add_versions(self, found: Iterable[ModelVersion | BrokenVersion]) -> list[ModelHost]:
        from models.backends import load_runtime  # backends import TF lazily

        added: list[ModelHost] = []
        for entry in found:
            if isinstance(entry, BrokenVersion):
                self._broken.setdefault(entry.name, {})[entry.version] = entry
                log.error(
                    "model %s version %d unavailable: %s", entry.name, entry.version, entry.reason
                )
                continue
            host = ModelHost(
                name=entry.name,
                version=entry.version,
                config=entry.config,
                factory=functools.partial(load_runtime, entry),
                executor=self._executor,
                metrics=self.metrics,
                limits=KnobLimits(
                    max_batch_size=entry.config.max_batch_size,
                    max_concurrency=self._max_concurrency,
                ),
            )
            self._hosts.setdefault(entry.name, {})[entry.version] = host
            added.append(host)
        return added

    async def load_all(self) -> None:
        """Load every version; one that fails is marked unavailable, the rest serve."""
        hosts = [h for versions in self._hosts.values() for h in versions.values()]
        # Loads run one at a time: loading several TF models at once on a small edge box only
        # makes all of them late.
        for host in hosts:
            if host.state is ModelState.LOADING:
                await host.load()

    async def close(self) -> None:
        hosts = [h for versions in self._hosts.values() for h in versions.values()]
        await asyncio.gather(*(h.unload() for h in hosts), return_exceptions=True)

    # -- queries ---------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        """Ready when every model that could be read has finished loading (ready or failed)."""
        hosts = [h for versions in self._hosts.values() for h in versions.values()]
        return (
            bool(hosts)
            and all(h.state is not ModelState.LOADING for h in hosts)
            and any(h.ready for h in hosts)
        )

    def statuses(self) -> list[VersionStatus]:
        out = [
            VersionStatus(h.name, h.version, h.state.value, h.reason)
            for versions in self._hosts.values()
            for h in versions.values()
        ]
        out += [
            VersionStatus(b.name, b.version, ModelState.UNAVAILABLE.value, b.reason)
            for versions in self._broken.values()
            for b in versions.values()
        ]
        return sorted(out, key=lambda s: (s.name, s.version))

    def model_names(self) -> list[str]:
        return sorted(set(self._hosts) | set(self._broken))

    def host(self, model: str, version: int | str | None = None) -> ModelHost:
        """The host of ``model`` at ``version`` (default: highest ready, else highest)."""
        versions = self._hosts.get(model)
        if version is not None and version != "":
            v = _parse_version(model, version)
            if versions is not None and v in versions:
                return versions[v]
            broken = self._broken.get(model, {}).get(v)
            if broken is not None:
                raise ModelUnavailable(f"model {model} version {v} is unavailable: {broken.reason}")
            if versions is None and model not in self._broken:
                raise NotFound(f"unknown model {model!r}")
            raise NotFound(f"model {model!r} has no version {v}")
        if not versions:
            if model in self._broken:
                reasons = "; ".join(b.reason for b in self._broken[model].values())
                raise ModelUnavailable(f"model {model} is unavailable: {reasons}")
            raise NotFound(f"unknown model {model!r}")
        ready = [v for v, h in versions.items() if h.ready]
        return versions[max(ready) if ready else max(versions)]

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata:
        return self.host(model, version).metadata

    # -- inference -------------------------------------------------------------------------

    async def infer(self, request: InferenceRequest, *, transport: str) -> InferenceResponse:
        started = time.monotonic()
        outcome = "error"
        host: ModelHost | None = None
        try:
            host = self.host(request.model, request.version)
            metadata = host.metadata
            rows = validate_request(
                request, metadata, host.config.max_batch_size, host.config.allow_nonfinite
            )
            try:
                outputs, queue_s, compute_s = await host.infer(
                    request.inputs,
                    rows=rows,
                    timeout_s=request.timeout_s,
                    priority=request.priority,
                )
            except RuntimeError_ as exc:  # backend failure surfaced outside a batch
                raise ModelUnavailable(str(exc)) from exc
            if request.outputs is not None:
                outputs = {name: outputs[name] for name in request.outputs}
            outcome = "ok"
            return InferenceResponse(
                model=host.name,
                version=host.version,
                outputs=outputs,
                id=request.id,
                timings={"queue_s": queue_s, "compute_s": compute_s},
            )
        except Exception as exc:
            outcome = getattr(exc, "reason", "internal")
            raise
        finally:
            if host is not None:
                host.record_request(transport, outcome, time.monotonic() - started)
            elif outcome != "not_found":
                # Unknown model names are not counted: a label per name a client invents
                # would grow the metrics without bound.
                self.metrics.requests.labels(request.model, "", transport, outcome).inc()

    # -- control (the tuner's surface) -----------------------------------------------------

    def knobs(self, model: str, version: int | str | None = None) -> Knobs:
        return self.host(model, version).knobs

    async def set_knobs(
        self, model: str, version: int | str | None, changes: dict[str, object]
    ) -> Knobs:
        host = self.host(model, version)
        if not host.ready:
            raise ModelUnavailable(f"model {model} version {host.version} is not ready")
        return await host.set_knobs(changes)

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats:
        return self.host(model, version).stats(window_s)


def _parse_version(model: str, version: int | str) -> int:
    try:
        v = int(version)
    except ValueError:
        raise NotFound(f"model {model!r} has no version {version!r}") from None
    return v


def validate_request(
    request: InferenceRequest, metadata: ModelMetadata, max_rows: int, allow_nonfinite: bool
) -> int:
    """Check names, dtypes, shapes and values against the model; returns the batch rows."""
    expected = {spec.name: spec for spec in metadata.inputs}
    given = request.inputs
    missing = [n for n in expected if n not in given]
    if missing:
        raise BadRequest(f"model {metadata.name}: missing input(s) {missing}")
    unexpected = [n for n in given if n not in expected]
    if unexpected:
        raise BadRequest(
            f"model {metadata.name}: unexpected input(s) {unexpected}; expected {list(expected)}"
        )
    rows: int | None = None
    for name, arr in given.items():
        spec = expected[name]
        if arr.dtype != np.dtype(spec.dtype):
            raise BadRequest(
                f"input {name!r}: datatype {dtype_label(arr.dtype)} does not match the model's "
                f"{dtype_label(np.dtype(spec.dtype))}"
            )
        if arr.ndim != len(spec.shape) or any(
            want != -1 and got != want for got, want in zip(arr.shape, spec.shape, strict=True)
        ):
            raise BadRequest(
                f"input {name!r}: shape {list(arr.shape)} does not match the model's "
                f"{list(spec.shape)}"
            )
        if rows is None:
            rows = arr.shape[0]
        elif arr.shape[0] != rows:
            raise BadRequest(
                f"inputs disagree on the batch dimension ({rows} vs {arr.shape[0]} for {name!r})"
            )
        if not allow_nonfinite and arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise BadRequest(f"input {name!r} contains NaN or infinity, which the model forbids")
    assert rows is not None
    if rows < 1:
        raise BadRequest("the batch dimension must be at least 1")
    if rows > max_rows:
        raise BadRequest(f"batch of {rows} rows exceeds the model's limit of {max_rows}")
    if request.outputs is not None:
        known = {spec.name for spec in metadata.outputs}
        unknown = [n for n in request.outputs if n not in known]
        if unknown:
            raise BadRequest(
                f"model {metadata.name}: unknown output(s) {unknown}; known: {sorted(known)}"
            )
    return rows
