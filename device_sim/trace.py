"""Request traces: what was sent, when, by which device, to which model.

Two encodings of the same record, chosen by the file's suffix:

- CSV (``.csv``): header ``t,device,model,payload``; ``payload`` may be empty.
- JSONL (``.jsonl``): one ``{"t": .., "device": .., "model": .., "payload": ..}`` per line;
  ``payload`` may be absent or null.

``t`` is the offset in seconds from the start of the trace. ``payload`` is a path, relative to
the trace file's folder, of a file holding the request's MQTT payload exactly as sent (OIP JSON,
or ``OIPB`` binary framing); without one, the replayer generates a payload for the model.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

FIELDS = ("t", "device", "model", "payload")


@dataclass(frozen=True, slots=True)
class TraceEntry:
    t: float
    device: str
    model: str
    payload: str | None = None


def check_topic_level(value: str, what: str) -> str:
    """Device ids and model names are single MQTT topic levels."""
    if not value or any(c in value for c in "/+#\x00"):
        raise ValueError(f"{what} {value!r} must be a non-empty topic level without / + #")
    return value


def _entry(t: Any, device: Any, model: Any, payload: Any, where: str) -> TraceEntry:
    try:
        offset = float(t)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: t must be a number of seconds, got {t!r}") from None
    if not (math.isfinite(offset) and offset >= 0):
        raise ValueError(f"{where}: t must be >= 0, got {t!r}")
    if not isinstance(device, str) or not isinstance(model, str):
        raise ValueError(f"{where}: device and model must be strings")
    if payload is not None and not isinstance(payload, str):
        raise ValueError(f"{where}: payload must be a path string")
    return TraceEntry(
        offset,
        check_topic_level(device, f"{where}: device"),
        check_topic_level(model, f"{where}: model"),
        payload or None,
    )


def _is_jsonl(path: Path) -> bool:
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl"):
        raise ValueError(f"{path}: a trace file must end in .csv or .jsonl")
    return suffix == ".jsonl"


class TraceWriter:
    """Appends entries to a trace file, flushing each so an interrupted recording stays valid."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._jsonl = _is_jsonl(path)
        self._file: IO[str] | None = None
        self._csv: Any = None

    def __enter__(self) -> Self:
        self._file = self.path.open("w", encoding="utf-8", newline="")
        if not self._jsonl:
            self._csv = csv.writer(self._file)
            self._csv.writerow(FIELDS)
        return self

    def write(self, entry: TraceEntry) -> None:
        assert self._file is not None, "use TraceWriter as a context manager"
        t = round(entry.t, 6)
        if self._jsonl:
            row: dict[str, Any] = {"t": t, "device": entry.device, "model": entry.model}
            if entry.payload is not None:
                row["payload"] = entry.payload
            self._file.write(json.dumps(row) + "\n")
        else:
            self._csv.writerow((t, entry.device, entry.model, entry.payload or ""))
        self._file.flush()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._file is not None:
            self._file.close()


def write_trace(path: Path, entries: Iterable[TraceEntry]) -> None:
    with TraceWriter(path) as writer:
        for entry in entries:
            writer.write(entry)


def read_trace(path: Path) -> list[TraceEntry]:
    """Entries in time order (a stable sort, so equal offsets keep their file order)."""
    text = path.read_text(encoding="utf-8")
    entries: list[TraceEntry] = []
    if _is_jsonl(path):
        for n, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{where}: each line must be a JSON object")
            entries.append(
                _entry(row.get("t"), row.get("device"), row.get("model"), row.get("payload"), where)
            )
    else:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = {"t", "device", "model"} - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: the CSV header lacks {sorted(missing)}")
        for row in reader:
            where = f"{path}:{reader.line_num}"
            entries.append(_entry(row["t"], row["device"], row["model"], row.get("payload"), where))
    entries.sort(key=lambda e: e.t)
    return entries
