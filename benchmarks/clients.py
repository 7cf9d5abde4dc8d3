"""Load-client processes shared by the benchmarks: spawned once (nothing is forked from a
process that holds ONNX Runtime or TensorFlow thread pools) and kept between runs, so that the
load generator's start-up is not part of what is measured. Each process runs the jobs it is
sent with one job runner (a module-level function, so that a spawned process can import it)."""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection
from typing import Any

JobRunner = Callable[[Any], dict[str, Any]]


def _serve(conn: Connection, run_job: JobRunner) -> None:
    """Body of a client process: run each job it is sent until it is sent None; a failing job
    is reported as ``{"error": ...}`` and the process stays usable."""
    with contextlib.suppress(KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        while True:
            job = conn.recv()
            if job is None:
                return
            try:
                conn.send(run_job(job))
            except Exception as exc:
                conn.send({"error": repr(exc)})


class ClientProcesses:
    """``count`` client processes; ``run`` hands one job to each of the first ``len(jobs)`` and
    waits for every result."""

    def __init__(self, count: int, run_job: JobRunner, *, name: str = "bench-client") -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for i in range(count):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(child, run_job), name=f"{name}-{i}")
            proc.daemon = True
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    @property
    def count(self) -> int:
        return len(self._procs)

    def run(self, jobs: Sequence[Any], timeout_s: float) -> list[dict[str, Any]]:
        if not 0 < len(jobs) <= len(self._conns):
            raise ValueError(f"{len(jobs)} jobs for {len(self._conns)} client processes")
        for conn, job in zip(self._conns, jobs, strict=False):
            conn.send(job)
        out = []
        deadline = time.monotonic() + timeout_s
        for conn in self._conns[: len(jobs)]:
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"a client process gave no result within {timeout_s:g} s")
            result = conn.recv()
            if "error" in result:
                raise RuntimeError(f"client process failed: {result['error']}")
            out.append(result)
        return out

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.send(None)
        for proc in self._procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._conns, self._procs = [], []

    def __enter__(self) -> ClientProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
