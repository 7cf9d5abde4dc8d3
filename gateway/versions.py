"""Which version of a model a request names: one rule for the serving process and for the
ingest processes (which answer from a catalog), so both refuse the same requests alike."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.errors import ModelUnavailable, NotFound
from models.runtime import ModelMetadata

_T = TypeVar("_T")

# Models an unknown-model refusal names at most: an edge gateway serves a handful, and a reply
# stays short where one serves hundreds (POST /v2/repository/index lists them all).
MAX_LISTED = 20


def parse_version(model: str, version: int | str) -> int:
    try:
        return int(version)
    except ValueError:
        raise NotFound(f"model {model!r} has no version {version!r}") from None


def unknown_model(model: str, served: Iterable[str] | None = None) -> NotFound:
    """The refusal for a model the gateway does not have. Given the names it has (``served``),
    it lists them, so that a misspelt name is seen in the reply itself."""
    if served is None:
        return NotFound(f"unknown model {model!r}")
    names = sorted(served)
    if not names:
        return NotFound(f"unknown model {model!r}; the gateway serves no models")
    listed = ", ".join(names[:MAX_LISTED])
    if len(names) > MAX_LISTED:
        listed += f" and {len(names) - MAX_LISTED} more (POST /v2/repository/index)"
    return NotFound(f"unknown model {model!r}; served: {listed}")


def unloaded(model: str) -> ModelUnavailable:
    """The refusal for a model an operator unloaded."""
    return ModelUnavailable(
        f"model {model!r} is unloaded; it serves again once loaded "
        f"(POST /v2/repository/models/{model}/load)"
    )


def pick_version(
    model: str,
    version: int | str | None,
    versions: Mapping[int, _T] | None,
    broken: Mapping[int, str] | None,
    is_ready: Callable[[_T], bool],
    *,
    served: Callable[[], Iterable[str]] | None = None,
) -> _T:
    """The entry of ``model`` at ``version`` (default: the highest ready one, else the highest).
    ``versions`` holds the versions that were read, ``broken`` the reasons of those that could
    not be; ``None`` for a model with none of either. ``served`` gives the names of every model
    for the refusal of an unknown one to list (asked only then: a lookup of a known model pays
    nothing for it)."""
    if version is not None and version != "":
        v = parse_version(model, version)
        if versions is not None and v in versions:
            return versions[v]
        reason = (broken or {}).get(v)
        if reason is not None:
            raise ModelUnavailable(f"model {model} version {v} is unavailable: {reason}")
        if versions is None and broken is None:
            raise unknown_model(model, served() if served is not None else None)
        raise NotFound(f"model {model!r} has no version {v}")
    if not versions:
        if broken is not None:
            raise ModelUnavailable(f"model {model} is unavailable: {'; '.join(broken.values())}")
        raise unknown_model(model, served() if served is not None else None)
    ready = [v for v, entry in versions.items() if is_ready(entry)]
    return versions[max(ready) if ready else max(versions)]


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One model version as an ingest process sees it."""

    ready: bool
    metadata: ModelMetadata | None
    unavailable: str  # the refusal when ``metadata`` is None ("... is not loaded: why")


@dataclass(frozen=True, slots=True)
class Catalog:
    """The serving process's models as plain data, so that an ingest process refuses an unknown
    model, or decodes a TF Serving body against the model's inputs, without asking. A stale
    catalog costs nothing worse than a late refusal: the serving process checks again."""

    versions: dict[str, dict[int, CatalogEntry]] = field(default_factory=dict)
    broken: dict[str, dict[int, str]] = field(default_factory=dict)
    unloaded: frozenset[str] = frozenset()

    def entry(self, model: str, version: int | str | None = None) -> CatalogEntry:
        if model in self.unloaded:
            raise unloaded(model)
        return pick_version(
            model,
            version,
            self.versions.get(model),
            self.broken.get(model),
            lambda e: e.ready,
            served=self.model_names,
        )

    def check_model(self, model: str, version: int | str | None = None) -> None:
        self.entry(model, version)

    def model_names(self) -> list[str]:
        """Every model the serving process knows, as ``ModelRegistry.model_names``."""
        return sorted(set(self.versions) | set(self.broken) | self.unloaded)

    def metadata(self, model: str, version: int | str | None = None) -> ModelMetadata:
        entry = self.entry(model, version)
        if entry.metadata is None:
            raise ModelUnavailable(entry.unavailable)
        return entry.metadata
