"""What the HTTP benchmark's experiments share: the plan, the log, the results being
gathered (``runs``, ``config``), and what they reuse and close together: the gateway and echo
processes, the client processes, the in-process runners."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from benchmarks.clients import ClientProcesses
from benchmarks.common import ServerProcess
from benchmarks.http.plan import Plan, Setup
from benchmarks.http.runner import InprocessRunner
from benchmarks.http.workload import Model
from benchmarks.loadgen import LoadJob, merge_load, run_http_job, run_load, split_job


class Bench:
    def __init__(self, plan: Plan, log: Callable[[str], None]) -> None:
        self.plan = plan
        self.log = log
        self.runs: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {"plan": asdict(plan)}
        self.clients: dict[int, ClientProcesses] = {}
        self.runners: dict[tuple[str, int, int], InprocessRunner] = {}
        self.gateway: ServerProcess | None = None
        self.echo: ServerProcess | None = None
        self.extra_servers: list[ServerProcess] = []  # started by one experiment, closed here

    def close(self) -> None:
        for clients in self.clients.values():
            clients.close()
        for server in (self.gateway, self.echo, *self.extra_servers):
            if server is not None:
                server.stop()
        for runner in self.runners.values():
            runner.close()

    def runner(self, model: Model, intra: int, instances: int) -> InprocessRunner:
        """The in-process runner of this configuration, built once."""
        key = (model.name, intra, instances)
        if key not in self.runners:
            self.runners[key] = InprocessRunner(model, intra, instances)
        return self.runners[key]

    def load(
        self,
        *,
        url: str,
        model: Model,
        concurrency: int,
        setup: Setup,
        duration_s: float,
        warmup_s: float,
        max_requests: int | None = None,
        server: ServerProcess | None = None,
        body: tuple[bytes, int] | None = None,
    ) -> dict[str, Any]:
        """One closed-loop run with ``setup`` = (client kind, processes); 0 processes: the
        client runs in this process. ``body``: (request, JSON header length) instead of the
        model's binary request."""
        kind, processes = setup
        payload, header_length = body or (model.body, model.header_length)
        job = LoadJob(
            url=url,
            body=payload,
            header_length=header_length,
            rows_per_request=1,
            concurrency=concurrency,
            duration_s=duration_s,
            max_requests=max_requests or self.plan.max_requests_per_run,
            warmup_s=warmup_s,
            timeout_s=self.plan.client_timeout_s,
            server_pid=server.pid if server is not None else None,
            client=kind,
        )
        if processes == 0:
            return asyncio.run(run_load(job))
        # A common start, after every process has connected and warmed up.
        jobs = split_job(job, processes)
        clients = self.clients.get(processes)
        if clients is None:
            clients = self.clients[processes] = ClientProcesses(processes, run_http_job)
        timeout = warmup_s + duration_s + 60 + self.plan.client_timeout_s
        return merge_load(clients.run(jobs, timeout_s=timeout))
