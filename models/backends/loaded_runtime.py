"""What every backend's loaded runtime answers the same way: its metadata, threads and placement,
and the lines it logs once loaded. The backends (``onnx_backend``, ``tf_backend``) differ in how
they build a session and run it; this is the rest.
"""

from __future__ import annotations

import logging

from models.backends.devices import Placement
from models.runtime import ModelMetadata, Threads
from models.serving_plan import log_once


class LoadedRuntime:
    """Accessors over what a backend's ``__init__`` sets, and its announcement."""

    _what: str  # "model 'm' version v", the prefix of every message
    _metadata: ModelMetadata
    _threads: Threads
    _placement: Placement

    @property
    def metadata(self) -> ModelMetadata:
        return self._metadata

    @property
    def threads(self) -> Threads:
        return self._threads

    @property
    def device(self) -> str:
        return self._placement.device

    @property
    def placement(self) -> Placement:
        return self._placement

    def _announce(self, log: logging.Logger, detail: str = "") -> None:
        """The serving plan (once per model version and process) and one INFO line."""
        if self._metadata.serving_plan is not None:
            log_once(self._what, self._metadata.serving_plan)
        threads = f"intra_op={self._threads.intra_op} inter_op={self._threads.inter_op}"
        where = f"{detail}, {threads}" if detail else threads
        log.info("loaded %s on %s (%s)", self._what, self._placement.device, where)
