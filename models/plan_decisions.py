"""Serving plans, once chosen, kept: every session of a model on this machine runs it the same way.

A plan is chosen from costs measured at load time, and timings move with the machine's load: two
processes (a gateway and its replica, a restart, a tool beside the gateway) measuring at different
moments could choose different ways for the same tensor. The ways compute the same trained
values, but not always bit for bit (``MatMulNBits`` at ``accuracy_level = 4`` rounds activations
to int8), so a device could get answers that differ in the last digits depending on which process
served it. The first plan chosen for a model's structure is therefore the plan: kept in this
process and, with a cache folder, in ``<folder>/plans.json``, written under an exclusive lock so
processes starting together agree. Delete the file to choose again (after a hardware change, say).

The key is the model's structure (each quantized tensor's layer, shapes, bits and block), the
runtime and its version, the machine, the budget and anything else the costs depend on; the
weights' values do not change a plan, so every checkpoint of one architecture shares it.

A leaf: imports nothing of the project.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from pathlib import Path

DECISIONS_FILE = "plans.json"
log = logging.getLogger("models.plan")


class PlanDecisions:
    """Tensor name -> way, by plan key: in memory for this process, and in ``plans.json`` under
    ``folder`` (None: this process only)."""

    # Per process, shared by every instance; by folder too, so that a load with a folder follows
    # the folder's plans even where this process chose another plan without one.
    _memory: dict[tuple[str, str], dict[str, str]] = {}

    def __init__(self, folder: Path | None) -> None:
        self.path = None if folder is None else folder / DECISIONS_FILE

    def settle(
        self, key: str, proposed: Mapping[str, str], allowed: Mapping[str, AbstractSet[str]]
    ) -> tuple[dict[str, str], bool]:
        """The ways to use for the plan ``key``: those chosen first (in this process, else in the
        folder), else ``proposed``, which is then kept. A kept choice that no longer fits
        (``allowed``: tensor name -> the ways it has now) is replaced. Returns the ways and
        whether they were chosen before."""
        memo = (str(self.path), key)
        kept = self._memory.get(memo)
        if kept is not None and _fits(kept, allowed):
            return dict(kept), True
        with self._locked() as stored:
            kept = stored.get(key)
            if kept is not None and _fits(kept, allowed):
                self._memory[memo] = kept
                return dict(kept), True
            stored[key] = dict(proposed)
            self._memory[memo] = dict(proposed)
            self._write(stored)
        return dict(proposed), False

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, dict[str, str]]]:
        """The stored decisions, read and held under an exclusive lock of the folder's lock file
        (no folder, or one that cannot be written: an empty store, this process only)."""
        if self.path is None:
            yield {}
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = (self.path.parent / f".{DECISIONS_FILE}.lock").open("a")
        except OSError as exc:
            log.warning("cannot keep serving plans in %s: %s", self.path.parent, exc)
            yield {}
            return
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            yield self._read()

    def _read(self) -> dict[str, dict[str, str]]:
        assert self.path is not None
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}  # missing or damaged: plans are chosen again
        if not isinstance(doc, dict):
            return {}
        return {
            k: {str(t): str(w) for t, w in v.items()} for k, v in doc.items() if isinstance(v, dict)
        }

    def _write(self, stored: Mapping[str, Mapping[str, str]]) -> None:
        if self.path is None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            tmp.write_text(json.dumps(stored, sort_keys=True, indent=1))
            tmp.replace(self.path)
        except OSError as exc:  # read-only folder: kept in this process only
            log.warning("cannot write serving plans to %s: %s", self.path, exc)


def _fits(kept: Mapping[str, str], allowed: Mapping[str, AbstractSet[str]]) -> bool:
    return kept.keys() == allowed.keys() and all(kept[t] in allowed[t] for t in kept)
