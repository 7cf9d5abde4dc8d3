"""What the gateway serves: every version of every model read from the repository, as a host,
a reason it could not be read, or a mark that an operator unloaded it.

The registry builds the hosts, loads them, swaps a model's versions in one step (the repository
API's reloads, ``gateway.model_loading``), unloads them, and answers which version a name means
(``gateway.versions.pick_version``) and how each one stands. It runs no request: the
``InferenceService`` looks a host up here and hands it the request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path

from gateway.batching.watchdog import WatchdogLimits
from gateway.errors import BadRequest, ModelUnavailable, NotFound
from gateway.inference_stats import InferenceStatistics
from gateway.metrics import GatewayMetrics
from gateway.model_host import (
    Fingerprint,
    ModelHost,
    ModelState,
    folder_fingerprint,
)
from gateway.settings.schema import ServingSettings
from gateway.versions import Catalog, CatalogEntry, pick_version, unloaded
from models.knobs import KnobLimits, Knobs
from models.repository import BrokenVersion, ModelVersion, with_plan_defaults
from models.runtime import ModelMetadata, Runtime, Threads

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


class ModelRegistry:
    def __init__(
        self,
        *,
        executor: Executor,
        metrics: GatewayMetrics,
        serving: ServingSettings,
        watchdog: WatchdogLimits,
        load_runtime: RuntimeLoader | None = None,
    ) -> None:
        self._executor = executor
        self._metrics = metrics
        self._max_concurrency = serving.max_concurrency
        self._plan_budget = serving.weight_memory_budget  # for checkpoints' serving plans
        self._plan_cache = serving.cache_dir / "plans"
        self._load_runtime = load_runtime
        self._watchdog = watchdog
        self._hosts: dict[str, dict[int, ModelHost]] = {}
        self._broken: dict[str, dict[int, BrokenVersion]] = {}
        self._unloaded: dict[str, tuple[int, ...]] = {}  # model -> its versions when unloaded
        self._model_watchers: list[Callable[[str], None]] = []
        # Repository control (load, reload, unload) runs one operation at a time.
        self.control_lock = asyncio.Lock()
        self.drain_s = serving.shutdown_grace_s  # a retired version's requests get this long
        self.repository: Path | None = None  # the folder models are (re)loaded from

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
            metrics=self._metrics,
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
        # Loads run one at a time: loading several TF models at once on a small edge box only
        # makes all of them late.
        for host in self.hosts():
            if host.state is ModelState.LOADING:
                await host.load()

    async def close(self) -> None:
        await asyncio.gather(*(h.unload() for h in self.hosts()), return_exceptions=True)

    # -- repository control: one model's versions replaced or unloaded while others serve ---

    def versions(self, model: str) -> dict[int, ModelHost]:
        return dict(self._hosts.get(model, {}))

    def hosts(self) -> list[ModelHost]:
        """Every version that has a host, of every model."""
        return [h for versions in self._hosts.values() for h in versions.values()]

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
    def ready(self) -> bool:
        """Ready when every model that could be read has finished loading (ready or failed)."""
        hosts = self.hosts()
        return (
            bool(hosts)
            and all(h.state is not ModelState.LOADING for h in hosts)
            and any(h.ready for h in hosts)
        )

    def statuses(self) -> list[VersionStatus]:
        out = [
            VersionStatus(h.name, h.version, h.state.value, h.reason, h.config.required)
            for h in self.hosts()
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


def _catalog_entry(host: ModelHost) -> CatalogEntry:
    try:
        return CatalogEntry(ready=host.ready, metadata=host.metadata, unavailable="")
    except ModelUnavailable as exc:
        return CatalogEntry(ready=host.ready, metadata=None, unavailable=exc.message)


def _reasons(broken: Mapping[int, BrokenVersion] | None) -> dict[int, str] | None:
    return None if broken is None else {v: b.reason for v, b in broken.items()}
