"""The transport-free inference service: model lookup, request checks (``gateway.validation``),
batching, queries, control.

The HTTP, gRPC and MQTT adapters call ``infer``; the tuner calls the control methods
(``knobs``, ``set_knobs``, ``stats``). Nothing here knows about a wire format.

Process-wide bounds live here: the bytes of request tensors queued or running
(``serving.max_queued_bytes``) and the executor threads stuck runtime calls may hold (half of
``serving.executor_threads``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gateway.batching.instances import StuckCalls
from gateway.errors import (
    BadRequest,
    MemoryBudgetExceeded,
    ModelUnavailable,
    NotFound,
    PayloadTooLarge,
)
from gateway.inference_stats import InferenceStatistics
from gateway.metrics import GatewayMetrics
from gateway.model_host import (
    Fingerprint,
    ModelHost,
    ModelState,
    Watchdog,
    folder_fingerprint,
)
from gateway.settings.schema import ServingSettings
from gateway.types import InferenceRequest, InferenceResponse
from gateway.validation import validate_request
from gateway.versions import Catalog, CatalogEntry, pick_version, unloaded
from models.knobs import KnobLimits, Knobs
from models.repository import BrokenVersion, ModelVersion, with_plan_defaults
from models.runtime import BackendError, ModelMetadata, Runtime, Threads
from models.window_stats import WindowStats

log = logging.getLogger("gateway.service")


@dataclass(frozen=True, slots=True)
class VersionStatus:
    name: str
    version: int
    state: str
    reason: str
    required: bool = True  # holds readiness back until it is READY (config key ``required``)


@dataclass(frozen=True, slots=True)
class ModelView:
    """One model version as the transports describe it, read at one moment: plain data, so no
    adapter holds (or reaches into) the live host. ``metadata`` is None until it is loaded."""

    name: str
    version: int
    versions: tuple[int, ...]  # every version of the model, usable or not
    state: str
    reason: str
    ready: bool
    runtime: str
    max_batch_size: int
    slo_ms: float
    max_queue_size: int
    knobs: Knobs
    metadata: ModelMetadata | None


RuntimeLoader = Callable[[ModelVersion, Threads], Runtime]


class ByteBudget:
    """Bytes of request tensors charged while they wait in a queue or run. Used from the event
    loop only, so a check and the charge that follows it cannot interleave."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.charged = 0

    def fits(self, nbytes: int) -> bool:
        return self.charged + nbytes <= self.limit

    @contextlib.contextmanager
    def hold(self, nbytes: int) -> Iterator[None]:
        """Charge ``nbytes`` for the block; released exactly once however it ends."""
        self.charged += nbytes
        try:
            yield
        finally:
            self.charged -= nbytes


class InferenceService:
    def __init__(
        self,
        *,
        executor: Executor,
        metrics: GatewayMetrics,
        serving: ServingSettings | None = None,
        load_runtime: RuntimeLoader | None = None,
    ) -> None:
        serving = serving or ServingSettings()
        self._executor = executor
        self._max_concurrency = serving.max_concurrency
        self._plan_budget = serving.weight_memory_budget  # for checkpoints' serving plans
        self._plan_cache = serving.cache_dir / "plans"
        self._load_runtime = load_runtime
        self.metrics = metrics
        self._hosts: dict[str, dict[int, ModelHost]] = {}
        self._broken: dict[str, dict[int, BrokenVersion]] = {}
        self._unloaded: dict[str, tuple[int, ...]] = {}  # model -> its versions when unloaded
        self._model_watchers: list[Callable[[str], None]] = []
        # Repository control (load, reload, unload) runs one operation at a time.
        self.control_lock = asyncio.Lock()
        self.drain_s = serving.shutdown_grace_s  # a retired version's requests get this long
        self.repository: Path | None = None  # the folder models are (re)loaded from
        # Python cannot stop a stuck thread: half the executor may be lost to stuck calls, the
        # other half stays for the batches of healthy instances, loads and rebuilds.
        self._stuck_calls = StuckCalls(limit=max(1, serving.executor_threads // 2))
        self._watchdog = Watchdog(
            limit_s=serving.batch_watchdog_s,
            max_stuck=serving.batch_watchdog_max_stuck,
            stuck_calls=self._stuck_calls,
        )
        self.byte_budget = ByteBudget(serving.max_queued_bytes)
        metrics.abandoned_calls.set_function(lambda: self._stuck_calls.held)
        metrics.queued_bytes.set_function(lambda: self.byte_budget.charged)

    # -- lifecycle -------------------------------------------------------------------------

    def add_versions(self, found: Iterable[ModelVersion | BrokenVersion]) -> list[ModelHost]:
        added: list[ModelHost] = []
        for entry in found:
            if isinstance(entry, BrokenVersion):
                self._broken.setdefault(entry.name, {})[entry.version] = entry
                log.error(
                    "model %s version %d unavailable: %s", entry.name, entry.version, entry.reason
                )
                continue
            host = self.new_host(entry)
            self._hosts.setdefault(entry.name, {})[entry.version] = host
            added.append(host)
        return added

    def new_host(
        self,
        entry: ModelVersion,
        knobs: Knobs | None = None,
        fingerprint: Fingerprint | None = None,
    ) -> ModelHost:
        """A host for ``entry``, not yet loaded nor served (``knobs``: start from these)."""
        from models.backends import load_runtime  # backends import TF lazily

        entry = with_plan_defaults(
            entry, weight_memory_budget=self._plan_budget, plan_cache_dir=self._plan_cache
        )
        return ModelHost(
            name=entry.name,
            version=entry.version,
            config=entry.config,
            factory=functools.partial(self._load_runtime or load_runtime, entry),
            executor=self._executor,
            metrics=self.metrics,
            limits=KnobLimits(
                max_batch_size=entry.config.max_batch_size,
                max_concurrency=self._max_concurrency,
            ),
            watchdog=self._watchdog,
            knobs=knobs,
            fingerprint=folder_fingerprint(entry.directory) if fingerprint is None else fingerprint,
        )

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

    # -- repository control: one model's versions replaced or unloaded while others serve ---

    def versions(self, model: str) -> dict[int, ModelHost]:
        return dict(self._hosts.get(model, {}))

    def watch_models(self, watcher: Callable[[str], None]) -> None:
        """Call ``watcher(model)`` each time the repository API installs or unloads a model's
        versions (the tuner follows them)."""
        self._model_watchers.append(watcher)

    def _models_changed(self, model: str) -> None:
        for watcher in self._model_watchers:
            try:
                watcher(model)
            except Exception:  # a watcher's bug must not fail the load that notified it
                log.exception("model %s: a watcher of model changes failed", model)

    def install(
        self, model: str, hosts: dict[int, ModelHost], broken: dict[int, BrokenVersion]
    ) -> list[ModelHost]:
        """Make ``hosts`` and ``broken`` the versions of ``model`` in one step, so no request
        sees a mix; returns the hosts no longer listed, for the caller to ``retire``."""
        old = self._hosts.pop(model, {})
        self._broken.pop(model, None)
        self._unloaded.pop(model, None)
        if hosts:
            self._hosts[model] = dict(hosts)
        if broken:
            self._broken[model] = dict(broken)
        self._models_changed(model)
        return [h for h in old.values() if hosts.get(h.version) is not h]

    async def unload_model(self, model: str) -> None:
        """Stop serving every version of ``model``: requests already taken are answered (within
        ``drain_s``), later ones are refused as unloaded. Unloading twice is no error."""
        if model not in self._hosts and model not in self._broken:
            if model in self._unloaded:
                return
            raise NotFound(f"unknown model {model!r}")
        hosts = self._hosts.pop(model, {})
        versions = set(hosts) | set(self._broken.pop(model, {}))
        self._unloaded[model] = tuple(sorted(versions))
        log.info("model %s unloading (versions %s)", model, sorted(versions))
        self._models_changed(model)
        await asyncio.gather(*(h.retire(self.drain_s, replaced=False) for h in hosts.values()))

    # -- queries ---------------------------------------------------------------------------

    @property
    def stuck_calls(self) -> int:
        """Executor threads held by runtime calls the watchdog gave up on. While any is held,
        shutting the executor down with ``wait=True`` would wait for a call that may never
        return."""
        return self._stuck_calls.held

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
            VersionStatus(h.name, h.version, h.state.value, h.reason, h.config.required)
            for versions in self._hosts.values()
            for h in versions.values()
        ]
        out += [
            VersionStatus(b.name, b.version, ModelState.UNAVAILABLE.value, b.reason)
            for versions in self._broken.values()
            for b in versions.values()
        ]
        out += [
            VersionStatus(name, v, ModelState.UNAVAILABLE.value, "unloaded", required=False)
            for name, versions in self._unloaded.items()
            for v in versions
        ]
        return sorted(out, key=lambda s: (s.name, s.version))

    def model_names(self) -> list[str]:
        return sorted(set(self._hosts) | set(self._broken) | set(self._unloaded))

    def host(self, model: str, version: int | str | None = None) -> ModelHost:
        """The host of ``model`` at ``version`` (default: highest ready, else highest)."""
        if model in self._unloaded:
            raise unloaded(model)
        return pick_version(
            model,
            version,
            self._hosts.get(model),
            _reasons(self._broken.get(model)),
            lambda h: h.ready,
            served=self.model_names,
        )

    def check_model(self, model: str, version: int | str | None = None) -> None:
        """Raise ``NotFound``/``ModelUnavailable`` for a model (or version) that cannot serve:
        the edge asks this before it decodes a body for it."""
        self.host(model, version)

    def describe(self, model: str, version: int | str | None = None) -> ModelView:
        """The version ``host`` would pick, as plain data (``NotFound``/``ModelUnavailable`` as
        ``host`` raises them)."""
        host = self.host(model, version)
        try:
            metadata: ModelMetadata | None = host.metadata
        except ModelUnavailable:
            metadata = None
        return ModelView(
            name=host.name,
            version=host.version,
            versions=tuple(
                sorted(set(self._hosts.get(host.name, {})) | set(self._broken.get(host.name, {})))
            ),
            state=host.state.value,
            reason=host.reason,
            ready=host.ready,
            runtime=host.config.runtime,
            max_batch_size=host.config.max_batch_size,
            slo_ms=host.config.slo_ms,
            max_queue_size=host.config.batching.max_queue_size,
            knobs=host.knobs,
            metadata=metadata,
        )

    def catalog(self) -> Catalog:
        """Every model version as plain data, for the ingest processes."""
        versions: dict[str, dict[int, CatalogEntry]] = {}
        for name, hosts in self._hosts.items():
            versions[name] = {v: _catalog_entry(h) for v, h in hosts.items()}
        broken = {name: _reasons(b) or {} for name, b in self._broken.items()}
        return Catalog(versions=versions, broken=broken, unloaded=frozenset(self._unloaded))

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata:
        return self.host(model, version).metadata

    def statistics(self, model: str, version: str) -> list[tuple[str, int, InferenceStatistics]]:
        """(name, version, statistics since loaded) of every version of every model (no name),
        every version of one model, or one version, as Triton's statistics extension answers;
        ``NotFound`` for a model or version not served."""
        if version and not model:
            raise BadRequest("a version needs a model name")
        hosts: list[ModelHost] = []
        for name in [model] if model else sorted(self.model_names()):
            first = self.host(name, version or None)  # NotFound for one not served
            hosts += [first] if version else [h for _, h in sorted(self.versions(name).items())]
        return [(h.name, h.version, h.statistics) for h in hosts]

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
            nbytes = tensor_bytes(request.inputs)
            self._check_byte_budget(host, nbytes)
            try:
                with self.byte_budget.hold(nbytes):
                    outputs, queue_s, compute_s = await host.infer(
                        request.inputs,
                        rows=rows,
                        timeout_s=request.timeout_s,
                        priority=request.priority,
                        delivery_s=request.delivery_s,
                    )
            except BackendError as exc:  # backend failure surfaced outside a batch
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

    def _check_byte_budget(self, host: ModelHost, nbytes: int) -> None:
        budget = self.byte_budget
        if nbytes > budget.limit:
            host.record_rejection(PayloadTooLarge.reason)
            raise PayloadTooLarge(
                f"model {host.name}: the request's tensors take {nbytes} bytes, more than the "
                f"gateway's whole budget for queued requests ({budget.limit} bytes, "
                "serving.max_queued_bytes)"
            )
        if not budget.fits(nbytes):
            host.record_rejection(MemoryBudgetExceeded.reason)
            raise MemoryBudgetExceeded(
                f"model {host.name}: the gateway's budget for queued requests is full "
                f"({budget.charged} of {budget.limit} bytes in use, serving.max_queued_bytes; "
                f"this request needs {nbytes})",
                # The bytes free up as the queues drain: the slowest queue's drain time.
                retry_after=max((h.drain_time() for h in self._all_hosts()), default=1.0),
            )

    def _all_hosts(self) -> list[ModelHost]:
        return [h for versions in self._hosts.values() for h in versions.values()]

    # -- control (the tuner's surface) -----------------------------------------------------

    def knobs(self, model: str, version: int | str | None = None) -> Knobs:
        return self.host(model, version).knobs

    async def set_knobs(self, model: str, version: int | str | None, knobs: Knobs) -> Knobs:
        """Set all five knobs of a ready version; returns once they are in effect."""
        host = self.host(model, version)
        if not host.ready:
            raise ModelUnavailable(f"model {model} version {host.version} is not ready")
        return await host.set_knobs(knobs)

    async def change_knobs(
        self, model: str, version: int | str | None, changes: Mapping[str, object]
    ) -> Knobs:
        """Change some knobs by wire name (the admin API's body); the others stay."""
        host = self.host(model, version)
        if not host.ready:
            raise ModelUnavailable(f"model {model} version {host.version} is not ready")
        return await host.change_knobs(changes)

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats:
        return self.host(model, version).stats(window_s)


def _catalog_entry(host: ModelHost) -> CatalogEntry:
    try:
        return CatalogEntry(ready=host.ready, metadata=host.metadata, unavailable="")
    except ModelUnavailable as exc:
        return CatalogEntry(ready=host.ready, metadata=None, unavailable=exc.message)


def _reasons(broken: Mapping[int, BrokenVersion] | None) -> dict[int, str] | None:
    return None if broken is None else {v: b.reason for v, b in broken.items()}


def tensor_bytes(inputs: Mapping[str, np.ndarray]) -> int:
    """Bytes a request's tensors hold: ``nbytes`` of numeric ones, the element lengths of
    object (BYTES / string) ones, whose ``nbytes`` counts only pointers."""
    total = 0
    for arr in inputs.values():
        if arr.dtype.kind == "O":
            total += sum(
                len(e) if isinstance(e, bytes | bytearray | str) else arr.itemsize for e in arr.flat
            )
        else:
            total += arr.nbytes
    return total
