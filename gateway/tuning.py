"""The online tuner inside the gateway: one ``rrl.agent.model_agent.ModelAgent`` per tuned model,
its state on ``/metrics`` and on ``/admin/tuner``.

Each agent first sets its model to the expert default (``rrl.tuners.space.expert_default``: eager
batching, instances sized to the model's share of the cores: all of them for one tuned model, an
equal share each for several, so the agents start within the joint core budget;
``tuner.start = "configured"`` keeps the model's ``config.toml`` knobs instead), so tuning
starts from what a practitioner would configure.
Each model's served (default) version is tuned over the grid ``rrl.tuners.space.ConfigSpace`` builds
for this machine, capped by the model's own limits. An agent starts deciding only once its
model has traffic (see ``rrl.agent.model_agent``), so an idle model keeps its configured knobs. An
operator who sets a model's knobs by hand pauses its agent (``/admin/models/{m}/knobs``); it
resumes with ``PUT /admin/tuner/{m} {"paused": false}``. Agents follow the repository API: a model
loaded after start is tuned, an unloaded one's agent stops and gives its cores back to the joint
budget, and a new version keeps its model's agent unless its limits change the grid.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from gateway.errors import NotFound
from gateway.loop_meter import LoopMeter
from gateway.metrics import GatewayMetrics
from gateway.model_host import ModelHost
from gateway.service import InferenceService
from gateway.settings.schema import TunerSettings
from models.extras import TUNER_MODULES, install_hint, missing
from models.knobs import Knobs
from models.machine import usable_cores as _usable_cores
from models.window_stats import WindowStats
from rrl.agent.budget import CoreBudget
from rrl.agent.control import ModelControl
from rrl.agent.model_agent import AgentSettings, Decision, ModelAgent, model_process
from rrl.offline.priors import Priors, load_profile_priors
from rrl.offline.profiling import PROFILES_DIR
from rrl.tuners.objective import Objective
from rrl.tuners.space import ConfigSpace, core_share, expert_default
from rrl.tuners.workload import MonitorSettings

log = logging.getLogger("gateway.tuning")
# The objectives in plain words (settings.TunerSettings.objective), for the start-up line.
_GOALS = {
    "latency": "lowest p95 latency within the SLO",
    "cost": "fewest cores that meet the SLO",
}


class AgentControl(ModelControl):
    """What an agent reads and sets of the gateway: the service's knobs and window stats, plus
    the batch service times and the event loop's cost per request its queueing model reads,
    which the service alone does not measure (``LoopMeter``)."""

    def __init__(self, service: InferenceService) -> None:
        self._service = service
        self._loop_meter = LoopMeter(self._arrived, self._batches)

    def knobs(self, model: str, version: int | str | None = None) -> Knobs:
        return self._service.knobs(model, version)

    async def set_knobs(self, model: str, version: int | str | None, knobs: Knobs) -> Knobs:
        return await self._service.set_knobs(model, version, knobs)

    def stats(
        self, model: str, version: int | str | None = None, window_s: float = 10.0
    ) -> WindowStats:
        return self._service.stats(model, version, window_s)

    def service_samples(
        self, model: str, version: int | str | None = None
    ) -> dict[int, tuple[float, ...]]:
        return self._service.registry.host(model, version).service_samples()

    def front_end_s(self, per_batch_s: float = 0.0) -> float | None:
        return self._loop_meter.per_request_s(per_batch_s)

    def _arrived(self) -> int:
        """Requests that reached the served versions of every model so far."""
        return self._total(lambda host: host.arrived_total)

    def _batches(self) -> int:
        """Batches the served versions of every model ran so far."""
        return self._total(lambda host: host.batches_total)

    def _total(self, count: Callable[[ModelHost], int]) -> int:
        total = 0
        for name in self._service.registry.model_names():
            with contextlib.suppress(Exception):  # unloaded or unavailable: nothing counted
                total += count(self._service.registry.host(name))
        return total


class TuningService:
    def __init__(
        self, service: InferenceService, settings: TunerSettings, metrics: GatewayMetrics
    ) -> None:
        self.service = service
        self.settings = settings
        self.metrics = metrics
        self.agents: dict[str, ModelAgent] = {}
        self._versions: dict[str, str] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ended: set[asyncio.Task[None]] = set()  # agents stopped, awaited by ``stop``
        self._model_pool: ProcessPoolExecutor | None = None
        self._budget: CoreBudget | None = None
        self._cores = 1
        # One control for every agent: its loop meter measures the loop once, not per model.
        self._control = AgentControl(service)

    def start(self) -> None:
        """Start an agent for every ready model chosen by the settings (call once loaded), and
        follow the repository API from then on: a model loaded later is tuned too, an unloaded
        one's agent stops and leaves the core budget."""
        s = self.settings
        if absent := missing(TUNER_MODULES):  # a base install: the tuner is iotgw[tune]
            log.warning("tuner: off, serving the configured knobs: %s", install_hint(absent))
            return
        self._cores = _usable_cores()
        # One coordinator for the cores every tuned model shares (rrl.agent.budget), and one process
        # for every agent's queueing model.
        self._budget = CoreBudget(self._cores)
        self._model_pool = model_process()
        wanted = s.models if s.models is not None else self.service.registry.model_names()
        ready = []
        for name in wanted:
            try:
                host = self.service.registry.host(name)
            except Exception as exc:  # unknown or unavailable: say so, tune the rest
                log.warning("tuner: not tuning %s: %s", name, exc)
                continue
            if not host.ready:
                log.warning("tuner: not tuning %s: version %d is not ready", name, host.version)
                continue
            ready.append(name)
        for name in ready:
            self._add(name, tuned=len(ready))
        self.service.registry.watch_models(self._model_changed)
        if self.agents:
            log.info(
                "tuner: retuning the batching and threads of %d model(s) as their load changes, "
                "for the %s (%s, up to %d settings each; --no-tuner keeps the configured ones)",
                len(self.agents),
                _GOALS.get(s.objective, f"{s.objective} objective"),
                s.algorithm,
                max(a.space.size for a in self.agents.values()),
            )

    def _space_of(self, name: str) -> ConfigSpace:
        s, host = self.settings, self.service.registry.host(name)
        return _space(
            self._cores,
            _floor_pow2(min(s.max_batch_size, host.limits.max_batch_size)),
            s.max_batch_timeout_ms,
            min(2 * self._cores, host.limits.max_concurrency),
        )

    def _add(self, name: str, tuned: int) -> None:
        """Start an agent for ``name``'s served version (ready), one of ``tuned`` models."""
        s, host = self.settings, self.service.registry.host(name)
        space = self._space_of(name)
        share = core_share(self._cores, tuned)
        agent = ModelAgent(
            self._control,
            name,
            space=space,
            slo_ms=host.config.slo_ms,
            cores=self._cores,
            settings=self._agent_settings(share, space),
            seed=s.seed,
            listener=self._on_decision,
            priors=self._priors_of(name, host.config.runtime, self._cores, space)
            if s.profiles
            else None,
            budget=self._budget,
            model_pool=self._model_pool,
        )
        self.agents[name] = agent
        self._versions[name] = str(host.version)
        self._publish_config(agent)
        self._tasks[name] = asyncio.create_task(agent.run(), name=f"tuner-{name}")

    def _drop(self, name: str, why: str) -> None:
        self.agents.pop(name, None)
        task = self._tasks.pop(name, None)
        if task is not None:
            task.cancel()
            self._ended.add(task)
            task.add_done_callback(self._ended.discard)
        if self._budget is not None:
            self._budget.leave(name)
        log.info("tuner: stopped tuning %s (%s)", name, why)

    def _model_changed(self, name: str) -> None:
        """The repository API loaded, reloaded or unloaded ``name``: its agent follows."""
        if self._model_pool is None or (
            self.settings.models is not None and name not in self.settings.models
        ):
            return
        try:
            host = self.service.registry.host(name)
            ready = host.ready
        except Exception:  # unloaded, or no version serves
            ready = False
        if name in self.agents:
            if not ready:
                self._drop(name, "unloaded")
                return
            if self._space_of(name) == self.agents[name].space:
                self._versions[name] = str(host.version)  # the same grid: it tunes on
                return
            self._drop(name, f"version {host.version} has other limits")
        if ready:
            self._add(name, tuned=len(self.agents) + 1)
            log.info("tuner: tuning %s version %s", name, self._versions[name])

    def _agent_settings(self, share: int, space: ConfigSpace) -> AgentSettings:
        """The agent's settings, starting from the expert default for ``share`` cores."""
        s = self.settings
        return AgentSettings(
            algorithm=s.algorithm,
            objective=s.objective,
            interval_s=s.interval_s,
            max_interval_s=max(s.max_interval_s, s.interval_s),
            min_requests=s.min_requests,
            min_rebuild_gap_s=s.min_rebuild_gap_s,
            rebuild_duty=s.rebuild_duty,
            unsafe_violation_fraction=s.unsafe_violation_fraction,
            explore_regret=s.explore_regret,
            start=expert_default(share, space.batch_sizes[-1]) if s.start == "expert" else None,
        )

    def _priors_of(
        self, model: str, runtime: str, cores: int, space: ConfigSpace
    ) -> Callable[[Objective, MonitorSettings], Priors]:
        """Loads the model's profile priors when the agent starts (from a worker thread, in a
        process of its own, in the agent's own objective and workload levels)."""
        profiles_dir = self.settings.profiles_dir or PROFILES_DIR

        def load(objective: Objective, monitor: MonitorSettings) -> Priors:
            return load_profile_priors(
                profiles_dir,
                model,
                objective,
                runtime=runtime,
                cores=cores,
                space=space,
                monitor=monitor,
                apart=True,
            )

        return load

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._ended]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._model_pool is not None:
            self._model_pool.shutdown(wait=False, cancel_futures=True)
            self._model_pool = None

    # -- control ------------------------------------------------------------------------------

    def agent(self, model: str) -> ModelAgent:
        agent = self.agents.get(model)
        if agent is None:
            raise NotFound(f"model {model!r} is not tuned; tuned: {sorted(self.agents)}")
        return agent

    def set_by_hand(self, model: str) -> None:
        """An operator set ``model``'s knobs: its agent pauses and keeps them, its start
        configuration included (``ModelAgent.set_by_hand``)."""
        self.set_paused(model, True, why="knobs set by hand")
        self.agent(model).set_by_hand()

    def set_paused(self, model: str, paused: bool, *, why: str) -> None:
        agent = self.agent(model)
        if agent.paused != paused:
            agent.paused = paused
            log.info("tuner %s %s (%s)", model, "paused" if paused else "resumed", why)

    def snapshot(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "algorithm": self.settings.algorithm,
            "objective": self.settings.objective,
            "models": {
                name: agent.snapshot(decisions=5, estimates=3)
                for name, agent in sorted(self.agents.items())
            },
        }

    # -- metrics -------------------------------------------------------------------------------

    def _on_decision(self, decision: Decision, agent: ModelAgent) -> None:
        m, labels = self.metrics, (agent.model, self._versions[agent.model])
        m.tuner_decisions.labels(*labels, decision.kind).inc()
        if decision.objective is not None:
            m.tuner_objective.labels(*labels, "last").set(decision.objective)
        policy = agent.policy
        best_estimate = policy.tuner.predict(policy.incumbent or policy.tuner.recommend())
        if best_estimate is not None:
            m.tuner_objective.labels(*labels, "best").set(best_estimate)
        if policy.workload is not None:
            m.tuner_workload.labels(*labels, "rate_level").set(policy.workload.rate_level)
            m.tuner_workload.labels(*labels, "size_level").set(policy.workload.size_level)
        m.tuner_workload.labels(*labels, "rate_per_s").set(policy.monitor.rate_per_s)
        measured, estimated = policy.tuner.estimate_counts()
        m.tuner_configurations.labels(*labels, "measured").set(measured)
        m.tuner_configurations.labels(*labels, "estimated").set(estimated)
        self._publish_config(agent)

    def _publish_config(self, agent: ModelAgent) -> None:
        labels = (agent.model, self._versions[agent.model])
        policy = agent.policy
        best = policy.incumbent or policy.tuner.recommend()
        configs = {"best": best, "current": policy.current}
        for which, config in configs.items():
            if config is None:
                continue
            for knob, value in config.as_dict().items():
                self.metrics.tuner_config.labels(*labels, which, knob).set(value)


@functools.cache
def _space(cores: int, max_batch: int, max_timeout_ms: float, max_concurrency: int) -> ConfigSpace:
    """One grid object per distinct grid: its distance matrix (a few MB on the full grid) is
    then computed once and shared by every model tuned over it."""
    return ConfigSpace.for_machine(
        cores,
        max_batch_size=max_batch,
        max_timeout_ms=max_timeout_ms,
        max_concurrency=max_concurrency,
    )


def _floor_pow2(n: int) -> int:
    return 2 ** int(math.log2(max(n, 1)))
