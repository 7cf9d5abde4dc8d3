"""Where the models come from (``resolve_model_repo``: the ``--model-repo`` folder, one
checkpoint file served as a one-model repository, or the bundled demo), and loading one model
of the repository, or reloading it, while the gateway serves.

A reload reads the model's folder again and compares each version with what serves: a version
whose files are unchanged keeps its host (its knobs, queue and statistics); a changed or new one
is built and warmed beside the old one, swapped in once ready (one step, see
``ModelRegistry.install``), and the old host is retired only after the requests it took are
answered. A version that fails to load leaves its predecessor serving. So no request fails
because of a swap.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Executor
from pathlib import Path

from gateway.errors import BadRequest, NotFound
from gateway.lifecycle import StartupError
from gateway.model_host import Fingerprint, ModelHost, ModelState, folder_fingerprint
from gateway.model_registry import ModelRegistry, VersionStatus
from gateway.settings.schema import GatewaySettings
from models.repository import (
    BrokenVersion,
    ModelVersion,
    RepositoryError,
    checkpoint_repository,
    scan_repository,
)

log = logging.getLogger("gateway.service")
startup_log = logging.getLogger("gateway")  # what the start-up says, with its other lines


async def load_model(
    registry: ModelRegistry, root: Path, model: str, executor: Executor
) -> list[VersionStatus]:
    """Load ``model`` from ``root`` or reload it; returns its versions' states. Raises
    ``NotFound`` when the repository holds no such model and ``BadRequest`` naming each version
    that failed to load (the versions that served before keep serving)."""
    loop = asyncio.get_running_loop()
    # Reading configs and stat-ing every file is disk work: off the event loop.
    found = await loop.run_in_executor(executor, _scan_model, root, model)
    if not found:
        raise NotFound(f"model {model!r} is not in the model repository ({root / model})")
    async with registry.control_lock:
        current = registry.versions(model)
        hosts: dict[int, ModelHost] = {}
        broken: dict[int, BrokenVersion] = {}
        failed: list[str] = []
        for entry, fingerprint in found:
            old = current.get(entry.version)
            if isinstance(entry, BrokenVersion):
                failed.append(f"version {entry.version}: {entry.reason}")
                if old is not None and old.ready:
                    hosts[entry.version] = old
                else:
                    broken[entry.version] = entry
                continue
            host, failure = await _load_version(
                registry, entry, fingerprint, old, _default(current)
            )
            hosts[entry.version] = host
            if failure:
                failed.append(f"version {entry.version}: {failure}")
        retired = registry.install(model, hosts, broken)
    await asyncio.gather(
        *(h.retire(registry.drain_s, replaced=h.version in hosts) for h in retired)
    )
    statuses = [s for s in registry.statuses() if s.name == model]
    if failed:
        serving = [str(s.version) for s in statuses if s.state == ModelState.READY.value]
        raise BadRequest(
            f"model {model!r} failed to load: {'; '.join(failed)}"
            + (f" (serving version(s) {', '.join(serving)})" if serving else "")
        )
    log.info("model %s loaded: versions %s", model, [s.version for s in statuses])
    return statuses


async def _load_version(
    registry: ModelRegistry,
    entry: ModelVersion,
    fingerprint: Fingerprint,
    old: ModelHost | None,
    default: ModelHost | None,
) -> tuple[ModelHost, str]:
    """The host to serve ``entry``: ``old`` while its folder is unchanged and it is usable, else
    a new one loaded beside it (which replaces it only if it loaded, or if ``old`` was broken);
    and why the new one failed to load, if it did."""
    # The fingerprint covers config.toml too (the host's config may hold defaults filled in).
    if (
        old is not None
        and old.state is not ModelState.UNAVAILABLE
        and old.fingerprint == fingerprint
    ):
        return old, ""
    # The knobs chosen at run time (tuner, operator) carry over to the new build.
    previous = old or default
    host = registry.new_host(
        entry, knobs=previous.knobs if previous is not None else None, fingerprint=fingerprint
    )
    await host.load()
    if host.ready or old is None or not old.ready:
        return host, host.reason
    # A failed build: the old version keeps serving, and its ready gauge (the same labels) says so.
    await host.unload()
    old.publish_state()
    return old, host.reason


def _default(versions: dict[int, ModelHost]) -> ModelHost | None:
    ready = [v for v, h in versions.items() if h.ready]
    return versions[max(ready)] if ready else None


def _scan_model(root: Path, model: str) -> list[tuple[ModelVersion | BrokenVersion, Fingerprint]]:
    try:
        found = [v for v in scan_repository(root) if v.name == model]
    except RepositoryError:
        return []
    return [(v, folder_fingerprint(v.directory)) for v in found]


def resolve_model_repo(settings: GatewaySettings) -> Path:
    """The repository to serve: ``--model-repo`` (a folder, or one checkpoint file), else the
    bundled demo, built on first use."""
    given = settings.serving.model_repo
    if given is not None and given.is_file():
        return _checkpoint_repo(given, settings.serving.cache_dir)
    if given is not None:
        return given
    try:
        from models.demo import ensure_demo_repository, is_complete
    except ImportError as exc:  # a base install: the demo is built with iotgw[demo]
        raise RepositoryError(
            f"no --model-repo given and the bundled demo cannot be built here ({exc}): "
            "install the iotgw[demo] extra (pip install '.[demo]' in the iotgw source folder), "
            "or serve your models with --model-repo"
        ) from exc
    root = settings.serving.cache_dir / "demo-repo-v1"
    if not is_complete(root):  # seconds of exports with nothing else to say meanwhile
        startup_log.info("no --model-repo given: building the bundled demo repository (first use)")
    root = ensure_demo_repository(root)
    startup_log.info("no --model-repo given: serving the bundled demo repository at %s", root)
    return root


def _checkpoint_repo(checkpoint: Path, cache_dir: Path) -> Path:
    """``--model-repo`` naming one checkpoint file: the one-model repository that serves it."""
    try:
        root = checkpoint_repository(checkpoint, cache_dir)
    except RepositoryError as exc:
        raise StartupError(str(exc)) from exc
    (model,) = [p.name for p in root.iterdir()]
    startup_log.info(
        "serving the checkpoint %s as model %r, version 1, on onnxruntime (repository %s)",
        checkpoint,
        model,
        root,
    )
    return root
