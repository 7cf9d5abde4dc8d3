"""Resting decided in virtual time (``tests.rrl.scripted``): at a steady load the agent rests
without simulating and its interval backs off; a rate step wakes it before the workload monitor
confirms the new state; the same load served worse (the cores busy elsewhere) wakes it too."""

from __future__ import annotations

import asyncio

from models.knobs import Knobs
from rrl.agent.decisions import Decision
from rrl.agent.model_agent import ModelAgent
from rrl.agent.settings import RestSettings
from tests.rrl.scripted import OpenLoop, ScriptedGateway, VirtualClock, run_agent
from tests.rrl.test_scripted_agent import agent_for, two_cores

START = Knobs(32, 0.0, 1, 2, 1)  # the expert default on two cores
# Rest while the SLO is met at all; the measured search off: these tests are about resting.
ISOLATED: dict[str, object] = {
    "start": START,
    "measured_search": False,
    "rest": RestSettings(p95_fraction=1.0, max_interval_s=2.0, wake_alpha=1e-6),
}


def resting(d: Decision) -> bool:
    return d.kind == "exploit" and d.reason.startswith("resting")


def test_a_steady_load_runs_no_simulation_and_the_interval_backs_off() -> None:
    clock = VirtualClock()
    gateway = ScriptedGateway(clock, START, two_cores, OpenLoop(lambda t: 128.0, seed=5))
    simulations: list[int] = []  # the model's simulations so far, at each decision

    def count(decision: Decision, agent: ModelAgent) -> None:
        simulations.append(agent.policy.queue_model.simulations)

    agent = agent_for(gateway, clock, listener=count, settings=ISOLATED)
    asyncio.run(run_agent(agent, clock, 60.0))
    history = list(agent.policy.history)
    first = next(
        (i for i in range(len(history) - 2) if all(map(resting, history[i : i + 3]))), None
    )
    assert first is not None, [(d.kind, d.reason) for d in history]
    assert simulations[first] == simulations[first + 2], "the model simulated while resting"
    durations = [d.measurement.duration_s for d in history[first : first + 3] if d.measurement]
    assert len(durations) == 3 and max(durations) > agent.settings.interval_s, durations
    gated = [d for d in history[:first] if d.gate is not None]
    assert gated and gated[-1].gate is not None and gated[-1].gate.candidate is None


def test_a_rate_step_wakes_a_resting_agent_before_the_monitor_confirms_it() -> None:
    clock = VirtualClock()

    def rate(t: float) -> float:
        return 40.0 if t < 55.0 else 320.0

    gateway = ScriptedGateway(clock, START, two_cores, OpenLoop(rate, seed=6))
    agent = agent_for(gateway, clock, settings=ISOLATED)
    seen: list[tuple[object, int]] = []

    async def step() -> None:
        assert agent.policy.rest.resting, [(d.kind, d.reason) for d in agent.policy.history]
        seen.append((agent.policy.workload, len(agent.policy.history)))

    asyncio.run(run_agent(agent, clock, 70.0, at=[(54.9, step)]))
    ((state, at),) = seen
    after = list(agent.policy.history)[at:]
    kinds = [d.kind for d in after]
    assert "wake" in kinds, [(d.kind, d.reason) for d in after]
    wake = kinds.index("wake")
    assert "arrivals" in after[wake].reason, after[wake]
    changes = [i for i, d in enumerate(after) if d.kind == "workload"]
    assert not changes or wake < changes[0], kinds
    assert agent.policy.workload is not None
    assert agent.policy.workload.rate_level > getattr(state, "rate_level", 99)


def test_the_same_load_served_worse_wakes_a_resting_agent() -> None:
    clock = VirtualClock()
    gateway = ScriptedGateway(clock, START, two_cores, OpenLoop(lambda t: 60.0, seed=7))
    agent = agent_for(gateway, clock, settings=ISOLATED)
    at: list[int] = []

    async def cores_busy_elsewhere() -> None:
        assert agent.policy.rest.resting, [(d.kind, d.reason) for d in agent.policy.history]
        at.append(len(agent.policy.history))
        gateway.slowdown = 4.0  # every batch takes four times as long: still within the SLO

    asyncio.run(run_agent(agent, clock, 70.0, at=[(45.0, cores_busy_elsewhere)]))
    wakes = [d for d in list(agent.policy.history)[at[0] :] if d.kind == "wake"]
    assert wakes, [(d.kind, d.reason) for d in list(agent.policy.history)[at[0] :]]
    assert "it rested at" in wakes[0].reason, wakes[0]
