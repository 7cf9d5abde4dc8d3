"""The online agent's whole loop decided in virtual time (``tests.rrl.scripted``): the knobs
it ends on, for loads whose best configuration follows from the scripted service times."""

from __future__ import annotations

import asyncio

from models.knobs import Knobs
from rrl.agent.model_agent import ModelAgent
from rrl.agent.settings import AgentSettings
from rrl.tuners.space import ConfigSpace
from tests.rrl.scripted import (
    ClosedLoop,
    OpenLoop,
    ScriptedGateway,
    VirtualClock,
    model_pool,
    run_agent,
)

SPACE = ConfigSpace.for_machine(2, max_batch_size=64)


def two_cores(knobs: Knobs, rows: int) -> float:
    """A CNN on two cores: 2 ms a batch plus 0.5 ms a row on one thread; a second intra-op
    thread only takes a fifth off (the graph's parallel share is small); more threads than
    cores time-slice."""
    seconds = 0.002 + 0.0005 * rows
    if knobs.intra_op_threads > 1:
        seconds *= 0.8
    return seconds * max(1.0, knobs.concurrency * knobs.intra_op_threads / 2)


def agent_for(gateway: ScriptedGateway, clock: VirtualClock, **settings: object) -> ModelAgent:
    return ModelAgent(
        gateway,
        "m",
        space=SPACE,
        slo_ms=gateway.slo_ms,
        cores=2,
        settings=AgentSettings(**settings),  # type: ignore[arg-type]
        model_pool=model_pool(),
        clock=clock,
        sleep=clock.sleep,
    )


def test_a_closed_loop_moves_from_threads_to_instances_when_instances_serve_more() -> None:
    """32 clients on one instance with both cores as its threads (batch 32): 14.4 ms a batch,
    2,222 answers a second. Two single-thread instances take 16 each in 10 ms: 3,200 a second.
    The agent starts on the first and ends on two instances."""
    clock = VirtualClock()
    start = Knobs(32, 0.0, 1, 2, 1)
    gateway = ScriptedGateway(clock, start, two_cores, ClosedLoop(32))
    agent = agent_for(gateway, clock, start=start)
    asyncio.run(run_agent(agent, clock, 90.0))
    final = gateway.knobs("m")
    assert (final.concurrency, final.intra_op_threads) == (2, 1), agent.policy.history
    assert any(d.kind == "accept" for d in agent.policy.history)
    # The last 30 s ran two instances throughout, and served a tenth more than the start
    # configuration serves in the same loop (clients that return together now and then leave
    # an instance idle: not all of 3,200/s).
    last = clock.now - 30.0
    assert all(k.concurrency == 2 for t, k in gateway.knob_changes if t >= last)
    static = ScriptedGateway(VirtualClock(), start, two_cores, ClosedLoop(32))
    assert gateway.answered(last, clock.now) > 1.1 * static.served_for(30.0)


def test_an_overloaded_open_loop_start_is_left_and_the_gain_below_one_windows_noise_is_found() -> (
    None
):
    """Poisson at 600/s on batch 1, one instance (2.5 ms a request: 400/s at most): the agent
    leaves the overload, then finds that batching on two instances halves the tail again, a
    gain smaller than one window's noise (its trials measure longer until the means tell);
    and the last 30 s run without a trial."""
    clock = VirtualClock()
    start = Knobs(1, 0.0, 1, 1, 1)
    gateway = ScriptedGateway(clock, start, two_cores, OpenLoop(lambda t: 600.0, seed=1))
    agent = agent_for(gateway, clock, start=start)
    asyncio.run(run_agent(agent, clock, 90.0))
    final = gateway.knobs("m")
    assert final.concurrency == 2 and final.max_batch_size >= 2, agent.policy.history
    last = clock.now - 30.0
    assert gateway.p99_ms(last, clock.now) < 8.0  # batch 1 on two instances: about 12 ms
    assert not [t for t, _ in gateway.knob_changes if t >= last]


def test_a_candidate_better_than_an_overloaded_incumbent_is_not_reverted_as_unsafe() -> None:
    """3,000/s on one instance with two threads (batch 32 in 14.4 ms: 2,222/s at most): every
    window violates, and so does the first window of the way out (two instances), which
    still drains the backlog. Beyond the safety limit, but better than the incumbent: kept
    going, it wins, and the last 30 s refuse nothing."""
    clock = VirtualClock()
    start = Knobs(32, 0.0, 1, 2, 1)
    gateway = ScriptedGateway(clock, start, two_cores, OpenLoop(lambda t: 3000.0, seed=1))
    agent = agent_for(gateway, clock, start=start)
    asyncio.run(run_agent(agent, clock, 90.0))
    assert gateway.knobs("m").concurrency == 2, agent.policy.history
    last = clock.now - 30.0
    assert not [t for t in gateway.refused if t > last]
    assert gateway.p99_ms(last, clock.now) < 50.0
