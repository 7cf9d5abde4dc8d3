"""The agent's measured evidence, decided with injected service times, scripted readings and
scripted windows: a model proven wrong loses its veto, a closed loop is told from an open one
and predicted by its own rule, and the agent measures its neighbourhood before it rests."""

from __future__ import annotations

import math
import statistics
import time

import numpy as np
import pytest

from models.knobs import Knobs
from models.window_stats import WindowStats
from rrl.agent.budget import CoreBudget, threads_of
from rrl.agent.decisions import Step
from rrl.agent.evidence import (
    ClosedLoopBand,
    LoadKind,
    ModelTrust,
    beyond,
    neighbours,
)
from rrl.agent.gate import Verdict
from rrl.agent.memory import BURSTY_DISPERSION
from rrl.agent.policy import Policy, _new_forms
from rrl.agent.queueing import Arrivals, Prediction
from rrl.agent.settings import AgentSettings
from rrl.agent.trial import (
    DEFAULT_PAIR_NOISE,
    EARLY_LOOK_Z,
    LAST_LOOK_Z,
    Outcome,
    Trial,
    Window,
    relative_noise,
)
from rrl.tuners.measurement import Measurement
from rrl.tuners.space import ConfigSpace

SPACE = ConfigSpace.for_machine(2, max_batch_size=32)
INCUMBENT = Knobs(4, 0.0, 1, 1, 1)


def window(p95_ms: float, n: int = 200, duration_s: float = 2.0) -> Measurement:
    return Measurement(duration_s, n, n, p95_ms / 2, p95_ms, p95_ms, 0, 0)


def test_the_model_loses_its_veto_after_two_misses_in_three_and_regains_it() -> None:
    trust = ModelTrust(kappa=2.0)
    assert trust.trusted
    trust.judge(10.0, 1.0, 11.5)  # within 2 sd
    trust.judge(10.0, 1.0, 25.0)  # one miss: a stray window
    assert trust.trusted
    trust.judge(10.0, 1.0, 30.0)  # two in three: proven wrong
    assert not trust.trusted
    miss = trust.last_miss()
    assert miss is not None and "measured 30.00" in miss.describe()
    for _ in range(2):
        trust.judge(10.0, 1.0, 10.5)
        assert not trust.trusted  # a miss is still among the last three
    trust.judge(10.0, 1.0, 9.5)
    assert trust.trusted  # three running within the band
    trust.judge(10.0, 1.0, 30.0)
    trust.judge(10.0, 1.0, 30.0)
    trust.reset()
    assert trust.trusted and trust.last_miss() is None


def test_a_closed_loop_keeps_its_population_and_an_open_loop_does_not() -> None:
    closed = LoadKind()
    for reading in [32] * 16:  # 32 clients, all inside at once in every tick
        closed.observe(reading)
    assert closed.closed and closed.population == 32
    dipped = LoadKind()
    for reading in [32, 32, 31, 18, 32, 32, 32, 32, 32, 30, 32, 32, 32, 32, 32, 32]:
        dipped.observe(reading)  # three ticks the client held a few replies
    assert dipped.closed and dipped.population == 32
    for reading in [17, 31, 32, 20]:  # more dips, most readings still near it: still the loop
        dipped.observe(reading)
    assert dipped.closed and dipped.population == 32
    for reading in [20, 16, 18, 20, 17, 19, 18, 20, 17]:  # most readings far below it
        dipped.observe(reading)
    assert not dipped.closed
    too_many_dips = LoadKind()
    for reading in [32, 18, 31, 17, 32, 32, 32, 32, 29, 32, 32, 32, 32, 30, 32, 32]:
        too_many_dips.observe(reading)  # 12 of 16 on the largest would begin one; 11 do not
    assert not too_many_dips.closed
    restarted = LoadKind()
    for reading in [32] * 16 + [64]:  # the clients restarted: the old requests still inside
        restarted.observe(reading)
    assert restarted.closed and restarted.population == 32
    for reading in [32] * 4 + [57, 41]:  # more restarts, the first still among the readings
        restarted.observe(reading)
    assert restarted.closed and restarted.population == 32
    for reading in [64] * 2:  # a quarter of the readings above 32 clients: not that loop
        restarted.observe(reading)
    assert not restarted.closed
    through = LoadKind()
    for reading in [32] * 7 + [64] + [32] * 8:  # a loop read through a restart's reading
        through.observe(reading)
    assert through.closed and through.population == 32
    emptied = LoadKind()
    for reading in [32] * 16 + [0]:  # a tick with nobody inside: no loop holds its clients
        emptied.observe(reading)
    assert not emptied.closed
    open_loop = LoadKind()
    # Poisson at 600/s on four-request batches (the scripted gateway's peaks): they crowd
    # together, but the largest comes now and then, not in three ticks of four.
    for reading in [9, 8, 10, 8, 8, 7, 9, 10, 8, 8, 11, 9, 8, 9, 10, 8, 8, 8, 8, 8, 7, 8]:
        open_loop.observe(reading)
        assert not open_loop.closed
    rng = np.random.default_rng(7)
    busy = LoadKind()
    for reading in rng.poisson(12.0, size=64):  # a burstier peak
        busy.observe(int(reading))
        assert not busy.closed
    trickle = LoadKind()
    for reading in [1, 0, 1, 1, 0, 1, 1, 1] * 2:  # empties now and then: open
        trickle.observe(reading)
    assert not trickle.closed
    young = LoadKind()
    for reading in [32] * 15:  # too few readings to say
        young.observe(reading)
    assert not young.closed


def test_the_neighbourhood_reaches_threads_with_the_largest_batch_within_the_cores() -> None:
    found = neighbours(SPACE, Knobs(2, 0.0, 2, 1, 1), cores=2)
    assert Knobs(32, 0.0, 1, 2, 1) in found  # every core in one instance's threads
    assert Knobs(4, 0.0, 2, 1, 1) in found and Knobs(1, 0.0, 2, 1, 1) in found
    assert Knobs(2, 0.0, 1, 1, 1) in found
    assert Knobs(2, 0.0, 1, 2, 1) in found  # the same two cores as threads of one instance
    assert Knobs(2, 0.0, 2, 1, 1) not in found
    assert all(c.concurrency * c.intra_op_threads <= 2 for c in found)
    assert all(SPACE.snap(c) == c for c in found)


def calibrated_policy(**settings: object) -> Policy:
    """A policy at 100 requests/s whose queueing model knows one instance's service times
    (1 ms a batch up to batch 32) and has proven its error on three incumbent windows."""
    s = AgentSettings(gate_every_s=0.0, trial_gap=0, **settings)  # type: ignore[arg-type]
    policy = Policy("m", space=SPACE, slo_ms=100.0, cores=2, settings=s)
    policy.current = policy.incumbent = INCUMBENT
    samples = {1: [0.001] * 20, 4: [0.0011] * 20, 32: [0.0015] * 20}
    policy.queue_model.observe_service((1, 1), samples)
    now = time.monotonic()
    policy.monitor.update(now - 3.0, 0)
    policy.monitor.update(now, 300)
    for _ in range(3):
        predicted = policy._predict(INCUMBENT)
        assert predicted is not None
        policy.learn(Step(INCUMBENT, "exploit", predicted=predicted), window(predicted.p95_ms))
    assert policy.queue_model.calibrated and policy.trust.trusted
    return policy


def test_a_model_that_missed_the_incumbent_twice_has_its_candidates_tried_on_measurement() -> None:
    policy = calibrated_policy()
    for _ in range(2):  # the incumbent measures far slower than the model says
        predicted = policy._predict(INCUMBENT)
        assert predicted is not None
        policy.learn(Step(INCUMBENT, "exploit", predicted=predicted), window(80.0))
    assert not policy.trust.trusted
    step = policy.choose()
    assert step.kind == "explore" and step.config != INCUMBENT
    assert "measured search" in step.reason and "the model predicted the incumbent" in step.reason
    assert policy.trial is not None and policy.trial.candidate == step.config
    assert step.config in neighbours(SPACE, INCUMBENT, 2)


def test_a_closed_loop_ranks_the_neighbours_by_the_closed_loop_rule() -> None:
    policy = calibrated_policy()
    for _ in range(policy.load_kind.readings):
        policy.load_kind.observe(32)
    step = policy.choose()
    assert step.kind == "explore" and "closed loop of 32 requests" in step.reason
    # The largest batch forms the fewest batches for 32 requests always in: fastest per request.
    assert step.config.max_batch_size == 32


def test_the_agent_rests_only_once_its_neighbourhood_lost_measured_trials() -> None:
    policy = calibrated_policy()
    key = policy._key()
    tried = []
    for _ in range(len(neighbours(SPACE, INCUMBENT, 2)) + 1):
        step = policy.choose()
        if step.kind != "explore":
            break
        assert policy._asked is None  # no rest while a neighbour is untried
        tried.append(step.config)
        policy.memory.reject(key, step.config)  # the trial showed no gain beyond the noise
        policy.trial = None
    assert step.kind == "exploit", step
    safe = set(tried)
    assert safe and safe <= set(neighbours(SPACE, INCUMBENT, 2))
    assert policy._asked == (key, INCUMBENT)  # the rest may now begin


def test_a_closed_loops_windows_are_compared_as_measured_not_normalised_by_rate() -> None:
    policy = calibrated_policy()
    # Open loop: the model's ratio between the two rates scales the value.
    assert policy._normalise(INCUMBENT, 10.0, 150.0, 100.0) != 10.0
    for _ in range(policy.load_kind.readings):
        policy.load_kind.observe(32)
    # Closed loop: the faster configuration served more requests by Little's law; its rate is
    # its own doing, so its value stands as measured.
    assert policy._normalise(INCUMBENT, 10.0, 150.0, 100.0) == 10.0


def test_the_measured_search_measures_only_what_the_core_budget_lets_it_hold() -> None:
    policy = calibrated_policy()
    budget = CoreBudget(2)
    policy.budget = budget
    budget.report("m", INCUMBENT, 100.0, busy_cores=0.2)
    other = Knobs(8, 0.0, 1, 1, 1)
    budget.report("other", other, 500.0, busy_cores=1.0)  # another model keeps a core busy
    tried = []
    for _ in range(len(neighbours(SPACE, INCUMBENT, 2)) + 1):
        step = policy.choose()
        if step.kind != "explore":
            break
        tried.append(step.config)
        policy.memory.reject(policy._key(), step.config)
        policy.trial = None
    assert tried, "nothing measured"
    # One thread is what the other model leaves: no neighbour holding two was measured.
    assert all(threads_of(c) <= 1 for c in tried), tried
    assert any(threads_of(c) > 1 for c in neighbours(SPACE, INCUMBENT, 2))


def test_a_closed_loops_window_is_valued_by_littles_law_and_holds_ten_rounds() -> None:
    policy = calibrated_policy()
    m = window(p95_ms=90.0, n=1000, duration_s=2.0)  # 500 answered per second
    open_value = policy.value_of(INCUMBENT, m)
    assert (
        policy.load_kind.window_requests(policy.settings.min_requests)
        == policy.settings.min_requests
    )
    for _ in range(policy.load_kind.readings):
        policy.load_kind.observe(32)
    # 32 requests always in, 500 answered a second: 64 ms each, whatever one window's p95 read.
    assert policy.value_of(INCUMBENT, m) == policy.objective(INCUMBENT, window(64.0, 1000))
    assert policy.value_of(INCUMBENT, m) != open_value
    assert policy.load_kind.window_requests(policy.settings.min_requests) == 320
    # What the agent learns from the window, trials and rests included, is that value.
    decision = policy.learn(Step(INCUMBENT, "exploit"), m)
    assert decision.objective == policy.objective(INCUMBENT, window(64.0, 1000))
    assert policy._baseline and policy._baseline[-1].objective == decision.objective


def test_the_measured_search_has_a_budget_of_trials_per_state() -> None:
    policy = calibrated_policy(measured_trials=2)
    kinds = []
    for _ in range(4):
        step = policy.choose()
        kinds.append(step.kind)
        if step.kind == "explore":
            policy.memory.reject(policy._key(), step.config)
            policy.trial = None
    assert kinds == ["explore", "explore", "exploit", "exploit"]
    assert policy._asked == (policy._key(), INCUMBENT)  # spent: the rest may begin


def test_a_closed_loops_own_rate_moves_are_not_a_new_workload_but_another_loop_is() -> None:
    loop = LoadKind()
    assert not loop.same_loop()  # open loop: every rate level is a workload
    for reading in [32, 31, 32, 30, 32, 32, 32, 32] * 2:
        loop.observe(reading)
    assert loop.same_loop()  # what a faster configuration answers is the same 32 clients
    for reading in [128, 126, 128, 128, 128, 128, 125, 128] * 2:
        loop.observe(reading)
    assert not loop.same_loop()  # 128 clients: a new workload
    for reading in np.random.default_rng(3).poisson(20.0, size=16):
        loop.observe(int(reading))
    assert not loop.same_loop()


def test_another_loop_is_one_at_least_twice_or_half_the_size_and_of_four_or_more() -> None:
    def after(held: int, population: int) -> bool:
        loop = LoadKind()
        for reading in [held] * loop.readings:
            loop.observe(reading)
        assert loop.held == held
        for reading in [population] * loop.readings:
            loop.observe(reading)
        return loop.another_loop()

    assert after(8, 32) and after(32, 8) and after(1, 8) and after(32, 128)
    assert not after(32, 40)  # what a faster configuration answers of the same clients, or near
    assert not after(2, 3) and not after(8, 2)  # a trickle's readings, open loops' as often


def loop_tick(policy: Policy, now: float, population: int, rate_per_s: float) -> str | None:
    """One half-second tick of a closed loop of ``population`` answering ``rate_per_s``, and
    the new state entered when the tick says so, as the agent's loop enters it."""
    arrived = round(rate_per_s / 2)
    stats = WindowStats(
        0.5,
        arrived,
        rate_per_s,
        1.0,
        5.0,
        8.0,
        9.0,
        0,
        0,
        0,
        arrived,
        arrived,
        population,
        population,
    )
    event = policy.tick(now, stats, 0.5)
    if event == "state":  # what the agent's loop does next
        policy.workload_changed(INCUMBENT, rebuilt=False)
    return event


def test_a_search_trial_a_workload_change_drops_does_not_spend_the_search() -> None:
    """Load in bursts (a benchmark's rounds, each a few seconds, other servers measured in
    between) ends each trial as it starts: the state changes and the trial is dropped, having
    measured nothing. Those trials give their count back, so the search still has its budget
    when the load stays; a trial that ran to its verdict keeps its count."""
    policy = calibrated_policy(measured_trials=2)
    policy.workload = policy.monitor.state  # the state the bursts come back to
    assert policy.workload is not None
    key = policy._key()
    for _ in range(3):
        step = policy.choose()
        assert step.kind == "explore" and policy.trial is not None, step
        assert policy._searched[key] == 1
        policy.workload_changed(INCUMBENT, False)  # the burst ended: the trial is dropped
        assert policy.trial is None and policy._searched[key] == 0
        assert policy.choose().kind == "revert"  # the incumbent back, and the log says why
    step = policy.choose()
    assert step.kind == "explore", step.reason  # the budget of 2 is untouched
    policy.memory.reject(key, step.config)  # this one ran to its verdict
    policy.trial = None
    assert policy._searched[key] == 1


def test_a_closed_loop_of_another_size_at_the_same_rate_is_a_new_state_searched_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user's sweep from 8 connections to 32 on a small model: the loop of 32 answers 1.4x
    the rate of the loop of 8, the same rate level. Every neighbour lost its trial at 8; the
    loop of 32 is entered as a new workload, what the loop of 8 measured is forgotten, and
    its measured search starts at once instead of resting on the loop of 8's trials."""
    policy = calibrated_policy()
    monkeypatch.setattr(
        policy.queue_model, "closed_loop_many", lambda configs, population: [50.0] * len(configs)
    )
    now = time.monotonic()
    events = [loop_tick(policy, now + 0.5 * i, 8, 3200.0) for i in range(40)]
    assert policy.load_kind.closed and policy.load_kind.held == 8
    key = policy._key()
    for config in neighbours(SPACE, INCUMBENT, 2):
        policy.memory.reject(key, config)
    assert "every neighbour lost" in policy.choose().reason
    level = policy.workload
    events = [loop_tick(policy, now + 20.0 + 0.5 * i, 32, 4400.0) for i in range(40)]
    assert events.count("state") == 1  # the new loop, once it is read as one
    assert policy.workload == level and policy._key() == key  # the same rate level
    assert policy.load_kind.held == 32
    step = policy.choose()
    assert step.kind == "explore" and step.reason.startswith("measured search"), step.reason
    assert any("a closed loop of 32 requests after one of 8" in d.reason for d in policy.history)


def test_a_measured_search_trial_must_win_by_twice_the_margin_of_a_predicted_one() -> None:
    policy = calibrated_policy()
    step = policy.choose()
    assert step.kind == "explore" and step.reason.startswith("measured search")
    assert policy.trial is not None
    assert policy.trial.margin == 2 * policy._trial_margin()


def unproven_policy() -> Policy:
    """A policy at 100 requests/s that knows one instance's service times and has calibrated
    nothing yet."""
    s = AgentSettings(gate_every_s=0.0, trial_gap=0)
    policy = Policy("m", space=SPACE, slo_ms=100.0, cores=2, settings=s)
    policy.current = policy.incumbent = INCUMBENT
    policy.queue_model.observe_service((1, 1), {1: [0.001] * 20, 4: [0.0011] * 20})
    now = time.monotonic()
    policy.monitor.update(now - 3.0, 0)
    policy.monitor.update(now, 300)
    return policy


def test_an_overloaded_incumbent_is_searched_on_measurement_before_the_model_is_proven() -> None:
    policy = unproven_policy()
    late = Measurement(2.0, 200, 150, 120.0, 240.0, 260.0, 80, 50)  # refusals, late answers
    policy.learn(Step(INCUMBENT, "exploit"), late)
    assert not policy.queue_model.calibrated  # overloaded windows prove nothing of the model
    step = policy.choose()
    assert step.kind == "explore" and "too overloaded to prove" in step.reason, step
    # Refusing 3% of its requests at a p95 just under the SLO: short of violating it, yet no
    # window of it can prove the model either; it is searched on measurement too.
    edge = unproven_policy()
    refusing = Measurement(2.0, 200, 194, 50.0, 97.0, 99.0, 6, 6)  # 6 refused: 3%
    edge.learn(Step(INCUMBENT, "exploit"), refusing)
    assert not edge._incumbent_violates() and not edge.queue_model.calibrated
    step = edge.choose()
    assert step.kind == "explore" and "too overloaded to prove" in step.reason, step
    # A model not yet proven, with an incumbent that meets the SLO: nothing blind is tried.
    calm = unproven_policy()
    calm.learn(Step(INCUMBENT, "exploit"), window(5.0))
    assert calm.choose().kind == "exploit"


def test_a_trusted_model_rules_out_neighbours_that_cannot_beat_the_incumbent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a model whose predictions of the incumbent held, the measured search tries only a
    neighbour whose optimistic prediction beats the incumbent's; once that one lost, it rests
    and says why, naming the model's proven error."""
    policy = calibrated_policy()
    plausible, *hopeless = neighbours(SPACE, INCUMBENT, 2)

    def scripted(
        asks: list[tuple[Knobs, Arrivals, int | None]], length: int | None = None
    ) -> list[Prediction]:
        def objective(config: Knobs) -> float:
            return 10.0 if config == INCUMBENT else 10.5 if config == plausible else 30.0

        return [Prediction(c, objective(c), 0.0, objective(c), 1.0, True) for c, _, _ in asks]

    monkeypatch.setattr(policy.queue_model, "predict_many", scripted)
    step = policy.choose()
    assert step.kind == "explore" and step.config == plausible, step.reason
    assert "measured search" in step.reason
    policy.memory.reject(policy._key(), plausible)  # it lost its trial
    policy.trial = None
    step = policy.choose()
    assert step.kind == "exploit" and step.config == INCUMBENT
    assert f"not tried: {len(hopeless)} untried neighbour(s)" in step.reason
    assert "proven on the incumbent's windows" in step.reason
    assert policy._asked == (policy._key(), INCUMBENT)  # the rest may begin


def test_beyond_a_lead_is_one_notch_further_on_its_axis() -> None:
    incumbent = Knobs(32, 0.0, 2, 1, 1)
    # Eager to a 1 ms wait led: 2 ms next (SPACE's timeouts are 0, 1, 2, 4, 8 ms).
    assert beyond(SPACE, incumbent, Knobs(32, 1.0, 2, 1, 1), cores=2) == Knobs(32, 2.0, 2, 1, 1)
    assert beyond(SPACE, incumbent, Knobs(16, 0.0, 2, 1, 1), cores=2) == Knobs(8, 0.0, 2, 1, 1)
    assert beyond(SPACE, incumbent, Knobs(32, 8.0, 2, 1, 1), cores=2) is None  # the axis ends
    assert beyond(SPACE, incumbent, Knobs(16, 1.0, 2, 1, 1), cores=2) is None  # two axes moved
    one = Knobs(32, 0.0, 1, 1, 1)
    assert beyond(SPACE, one, Knobs(32, 0.0, 2, 1, 1), cores=2) is None  # 3 instances: too many


def test_a_candidate_that_led_without_clearing_the_margin_is_followed_one_notch_on() -> None:
    policy = calibrated_policy()
    lead = Knobs(4, 1.0, 1, 1, 1)
    policy.trial = Trial(INCUMBENT, lead, (), interleave=True, margin=0.15, max_windows=3)
    for config, value in [(lead, 9.0), (INCUMBENT, 10.0), (lead, 9.0)]:
        policy.learn(Step(config, "explore"), window(value))
    assert policy.trial is None and policy.memory.was_rejected(policy._key(), lead)
    assert policy._further[policy._key()] == [Knobs(4, 2.0, 1, 1, 1)]


def test_a_lead_is_no_loss_and_its_next_notch_is_measured_whatever_the_simulation_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A closed loop whose simulation puts every batch timeout alike (the loop never waits one
    out, it says): a 1 ms wait that led the eager incumbent by 6% over its trial without
    clearing the margin neither counts toward the search's patience nor lets the simulation
    drop 2 ms as a form already measured; 2 ms is measured next."""
    waits = {Knobs(4, float(t), 1, 1, 1) for t in (0, 1, 2, 4, 8)}
    policy = closed_loop_policy(monkeypatch, {c: 50.0 for c in waits})
    key = policy._key()
    policy._losing[key] = policy.settings.search_patience - 1  # one more loss would rest
    lead, onward = Knobs(4, 1.0, 1, 1, 1), Knobs(4, 2.0, 1, 1, 1)
    policy.trial = Trial(INCUMBENT, lead, (), interleave=True, margin=0.1, max_windows=3)
    policy._search_trial_in = key
    for config, ms in [(lead, 47.0), (INCUMBENT, 50.0), (lead, 47.0)]:
        policy.learn(Step(config, "explore"), served(ms))
    assert policy.trial is None and policy.memory.was_rejected(key, lead)
    assert policy._losing[key] == policy.settings.search_patience - 1
    policy.choose()  # the revert
    step = policy.choose()
    assert step.kind == "explore" and step.config == onward, step.reason
    assert "one notch beyond a candidate that led" in step.reason
    # What the simulation alone would rank drops it: the same form as the 1 ms that lost.
    assert _new_forms([(50.0, onward)], [(50.0, lead)]) == []


def test_a_lead_within_the_noise_is_not_followed() -> None:
    policy = calibrated_policy()
    lead = Knobs(4, 1.0, 1, 1, 1)
    policy.trial = Trial(INCUMBENT, lead, (), interleave=True, margin=0.5, max_windows=3)
    for config, value in [(lead, 9.8), (INCUMBENT, 10.0), (lead, 9.8)]:
        policy.learn(Step(config, "explore"), window(value))
    assert policy.trial is None and not policy._further.get(policy._key())


def test_a_few_refusing_ticks_never_begin_a_loop() -> None:
    busy = LoadKind()
    for i in range(16):  # steady readings, one tick in four refusing: read again from each
        busy.observe(512, refused=40 if i % 4 == 3 else 0)
    assert not busy.closed and not busy.storm
    for _ in range(15):
        busy.observe(512)
    busy.observe(512, refused=1)
    assert not busy.closed  # one refusal starts the readings over


def storm_readings(kind: LoadKind, ticks: int = 16) -> None:
    """wrk's 128 connections to a model that answers 300 a second within a 100 ms SLO: most
    are refused for their deadline and send again at once; no two ticks read alike."""
    peaks = [61, 74, 58, 90, 66, 71, 83, 64, 77, 69, 88, 60, 72, 79, 67, 85]
    for i in range(ticks):
        kind.observe(peaks[i % len(peaks)], refused=150 + i)


def test_a_load_refused_in_most_ticks_is_a_storm_read_at_one_population_while_it_lasts() -> None:
    kind = LoadKind()
    storm_readings(kind, 15)
    assert not kind.closed  # fewer than sixteen readings
    kind.observe(64)
    assert kind.storm and kind.population == 90  # fifteen of the sixteen refused
    some = LoadKind()
    for i in range(32):  # eleven of each sixteen refusing: short of three quarters
        some.observe(64, refused=10 if i % 16 < 11 else 0)
        assert not some.closed
    kind.reset()
    storm_readings(kind)
    assert kind.storm and kind.closed and kind.population == 90 and kind.held == 90
    for peak in (120, 40, 128, 30):  # what it holds moves; the population it is judged at not
        kind.observe(peak, refused=200)
    assert kind.population == 90 and kind.same_loop()
    for _ in range(5):  # a few calm ticks inside it
        kind.observe(70)
    assert kind.storm
    for _ in range(4):  # refusing in fewer than half of the last sixteen: over
        kind.observe(70)
    assert not kind.storm and not kind.closed


def test_a_storms_window_is_valued_by_what_it_answered_not_by_what_it_refused() -> None:
    policy = calibrated_policy()
    storm_readings(policy.load_kind)
    assert policy.load_kind.storm and policy.load_kind.population == 90

    def storm_window(answered: int, refused: int, late: int = 0) -> Measurement:
        offered = answered + refused
        return Measurement(1.0, offered, answered, 60.0, 95.0, 99.0, late + refused, refused)

    # 300 answered a second: 90 / 300 = 300 ms a request, however many were refused beside.
    fast_refusals = policy.value_of(INCUMBENT, storm_window(300, 3800))
    slow_refusals = policy.value_of(INCUMBENT, storm_window(300, 1600))
    assert fast_refusals == slow_refusals == policy.objective(INCUMBENT, window(300.0, 300, 1.0))
    # More answered is better, whatever was refused: 100 a second reads 900 ms.
    assert policy.value_of(INCUMBENT, storm_window(100, 900)) > fast_refusals
    # Late answers still count against it; a window that answered nothing reads as one that
    # answered one (no figure of a time per request is infinite), worse than any answering more.
    assert policy.value_of(INCUMBENT, storm_window(300, 3800, late=30)) > fast_refusals
    nothing = policy.value_of(INCUMBENT, storm_window(0, 5000))
    assert nothing == policy.value_of(INCUMBENT, storm_window(1, 5000)) > fast_refusals


def storm_ticks(policy: Policy, start: float, ticks: range = range(16)) -> list[str | None]:
    """Half-second ticks (the sixteen, or ``ticks`` of them) of ``storm_readings``' load through
    the policy, the new state entered when a tick says so, as the agent's loop enters it."""
    events = []
    peaks = [61, 74, 58, 90, 66, 71, 83, 64, 77, 69, 88, 60, 72, 79, 67, 85]
    for i in ticks:
        peak = peaks[i]
        refused, answered = 1900, 150
        stats = WindowStats(
            0.5, answered, 300.0, 1.0, 60.0, 95.0, 99.0, refused, refused, 60,
            answered + refused, answered + refused, peak, peak,
        )  # fmt: skip
        event = policy.tick(start + 0.5 * i, stats, 0.5)
        if event == "state":
            policy.workload_changed(INCUMBENT, rebuilt=False)
        events.append(event)
    return events


def test_a_storm_is_a_new_workload_state_entered_when_it_begins() -> None:
    policy = calibrated_policy()
    policy.workload = policy.monitor.state
    start = time.monotonic()
    events = storm_ticks(policy, start, range(15))
    # Before the storm is read, its windows are an open loop's; three trials lost on them.
    key = policy._key()
    policy._losing[key], policy._searched[key] = 3, 3
    policy.memory.reject(key, Knobs(8, 0.0, 2, 1, 1))
    events += storm_ticks(policy, start, range(15, 16))
    # The rate's step from 100/s is one new state; the storm read at the sixteenth, another.
    assert events[-1] == "state" and "state" not in events[2:-1], events
    assert policy.load_kind.storm and policy.load_kind.held == 90
    assert "refusals in most ticks" in policy.history[-1].reason
    assert not policy._baseline  # the incumbent's windows before it valued another figure
    # And what was measured in the state's key before it, by that figure, is forgotten: the
    # trials it lost do not make the storm rest, nor keep a configuration out of its search.
    assert policy._key() == key
    assert not policy._losing.get(key) and not policy._searched.get(key)
    assert not policy.memory.was_rejected(key, Knobs(8, 0.0, 2, 1, 1))


def test_in_a_storm_a_candidate_goes_back_after_one_window_only_if_the_one_beside_confirms() -> (
    None
):
    """Every window of a storm is beyond the safety limit, so the limit guards nothing there:
    a candidate goes back after its first window only as any trial's does, worse than the
    incumbent's window before it and than the one beside it (the schedule's next) by the
    margin; not for reading worse than the incumbent's last window alone (run 43: three
    candidates reverted so, the incumbent's own windows spread 650-1,025 per request)."""
    for ratio, beside_ratio, reverted in ((1.03, 1.0, False), (1.5, 1.0, True), (1.5, 1.5, False)):
        policy = calibrated_policy()
        policy.workload = policy.monitor.state
        storm_ticks(policy, time.monotonic())
        policy.learn(Step(INCUMBENT, "exploit"), storm_window(300))
        step = policy.choose()
        assert step.kind == "explore" and policy.trial is not None, step
        decision = policy.learn(step, storm_window(round(300 / ratio)))
        assert "reverted" not in decision.reason, decision.reason  # one window alone: never
        assert policy.trial is not None
        beside = policy.choose()
        assert beside.kind == "compare" and beside.config == INCUMBENT, beside
        # The incumbent's window beside it: as before the trial, or as slow as the candidate
        # read (the storm, not the candidate, slowed).
        decision = policy.learn(beside, storm_window(round(300 / beside_ratio)))
        assert ("reverted after one window" in decision.reason) is reverted, decision.reason
        assert (policy.trial is None) is reverted


def storm_window(answered: int) -> Measurement:
    """One second of a storm: ``answered`` answers among 3,300 requests, the rest refused."""
    return Measurement(1.0, 3300, answered, 60.0, 95.0, 99.0, 3000, 3000)


def test_a_shorter_timeout_that_lost_in_a_closed_loop_spends_no_patience_and_is_not_repeated() -> (
    None
):
    """A shorter batch timeout is tried in a closed loop for a tie the simulation predicts,
    not for a gain: when it loses, no other shorter timeout is tried in that state, and the
    search's patience (its losses running) is left for the neighbours that may gain."""
    policy = calibrated_policy()
    policy.workload = policy.monitor.state
    incumbent = Knobs(32, 8.0, 1, 1, 1)
    policy.incumbent = policy.current = incumbent
    for _ in range(16):
        policy.load_kind.observe(32)
    assert policy.load_kind.closed
    key = policy._key()
    policy._baseline.extend([Window(incumbent, 10.0, 3000.0)] * 3)
    step = policy.choose()
    assert step.kind == "explore" and "a shorter timeout" in step.reason, step
    assert step.config.batch_timeout_ms < 8.0 and policy.trial is not None
    while policy.trial is not None:  # it measures twice the incumbent's time per request
        config = policy.trial.next_config()
        outcome = policy._trial_window(
            config, 20.0 if config == step.config else 10.0, window(10.0)
        )
    assert outcome is not None and outcome.verdict != "accept", outcome
    assert not policy._losing.get(key)
    assert policy._shorter_wait(key) is None


def test_a_closed_loop_stays_read_through_refusals_and_one_restart() -> None:
    """32 clients, a few of their requests refused for their deadline: they send again, and
    the loop is still 32 clients; so it is after the clients restart (one tick reads the old
    requests inside beside the new, some of them refused), not after a second such tick."""
    loop = LoadKind()
    for _ in range(16):
        loop.observe(32)
    assert loop.closed and loop.population == 32
    loop.observe(32, refused=5)
    loop.observe(30, refused=2)
    assert loop.closed and loop.population == 32
    loop.observe(40, refused=1)
    assert loop.closed and loop.population == 32
    for _ in range(4):
        loop.observe(64, refused=3)
    assert not loop.closed


def test_an_incumbent_violating_three_windows_running_goes_back_to_one_measured_within() -> None:
    policy = calibrated_policy()  # three windows of INCUMBENT within the SLO
    worse = Knobs(32, 8.0, 1, 1, 1)
    policy.begin(INCUMBENT)
    policy.in_effect(worse)  # the incumbent now, as after a trial won on noise
    assert policy.incumbent == worse
    for p95 in (300.0, 40.0, 300.0, 300.0):  # a window within the SLO restarts the count
        policy.learn(Step(worse, "exploit"), window(p95))
        if p95 == 40.0:
            assert policy._fall_back(policy.arrivals()) is None
    assert policy._fall_back(policy.arrivals()) is None  # two running: not yet
    policy.learn(Step(worse, "exploit"), window(300.0))
    step = policy.choose()
    assert (step.kind, step.config) == ("recall", INCUMBENT)
    assert "violating the SLO in 3 windows running" in step.reason
    assert policy.incumbent == INCUMBENT
    key = policy._key()
    assert policy.memory.was_rejected(key, worse)
    assert not policy.memory.was_rejected(key, INCUMBENT)


def test_no_configuration_measured_within_the_slo_means_no_fall_back() -> None:
    s = AgentSettings(gate_every_s=0.0, trial_gap=0)
    policy = Policy("m", space=SPACE, slo_ms=100.0, cores=2, settings=s)
    policy.current = policy.incumbent = INCUMBENT
    now = time.monotonic()
    policy.monitor.update(now - 3.0, 0)
    policy.monitor.update(now, 300)
    policy.learn(Step(INCUMBENT, "exploit"), window(40.0))  # one window only: not enough
    worse = Knobs(32, 8.0, 1, 1, 1)
    policy.begin(INCUMBENT)
    policy.in_effect(worse)
    for _ in range(4):
        policy.learn(Step(worse, "exploit"), window(300.0))
    assert policy._fall_back(policy.arrivals()) is None


def test_the_closed_loop_band_is_the_most_favourable_ratio_over_enough_configurations() -> None:
    band = ClosedLoopBand(least=3)
    a, b, c = Knobs(8, 0.0, 2, 1, 1), Knobs(16, 0.0, 2, 1, 1), Knobs(32, 0.0, 2, 1, 1)
    band.observe(a, predicted_ms=50.0, measured_ms=60.0)
    band.observe(b, predicted_ms=40.0, measured_ms=70.0)
    assert band.lowest_ratio() is None  # two configurations do not show the simulation's error
    assert not band.rules_out(b, 1000.0, a, margin=0.05)
    band.observe(c, predicted_ms=50.0, measured_ms=45.0)  # overestimated by 10%
    band.observe(c, predicted_ms=50.0, measured_ms=200.0)  # one noisy window
    band.observe(c, predicted_ms=50.0, measured_ms=46.0)
    assert band.lowest_ratio() == pytest.approx(0.92)  # c's median window, not its noise
    assert band.measured_ms(a) == 60.0
    # Beating a's 60 ms by 5% needs under 57 ms measured, 61.96 ms predicted at 0.92.
    assert band.rules_out(b, 62.0, a, margin=0.05)
    assert not band.rules_out(b, 61.9, a, margin=0.05)
    band.reset()
    assert band.lowest_ratio() is None


def test_the_closed_loop_band_is_kept_per_kind_of_batching() -> None:
    """The simulation's error on eager batching (it under-predicts eager batches) does not
    widen the band a timeout is judged by, nor the other way round."""
    band = ClosedLoopBand(least=2)
    eager = [Knobs(32, 0.0, 1, 1, 1), Knobs(16, 0.0, 1, 1, 1)]
    timed = [Knobs(32, 2.0, 1, 1, 1), Knobs(32, 4.0, 1, 1, 1)]
    for config in eager:
        band.observe(config, predicted_ms=15.0, measured_ms=6.6)  # measured 0.44x predicted
    assert band.lowest_ratio(timed[0]) is None  # no timeout measured yet: nothing ruled out
    for config in timed:
        band.observe(config, predicted_ms=6.0, measured_ms=6.3)
    assert band.lowest_ratio(timed[0]) == pytest.approx(1.05)
    assert band.lowest_ratio(eager[0]) == pytest.approx(0.44)
    assert band.lowest_ratio() == pytest.approx(0.44)
    slow_timeout, slow_eager = Knobs(128, 8.0, 1, 1, 1), Knobs(64, 0.0, 1, 1, 1)
    # 8.7 ms predicted for a timeout, at the timeouts' 1.05: 9.1 ms, no faster than 6.3 ms.
    assert band.rules_out(slow_timeout, 8.7, timed[0], margin=0.05)
    # The same prediction for eager batching, at eager's 0.44: 3.8 ms, maybe faster.
    assert not band.rules_out(slow_eager, 8.7, timed[0], margin=0.05)


def test_the_closed_loop_band_is_kept_per_split_of_the_cores() -> None:
    """Timeouts measured on one instance of two threads (the loop waits for a core there) say
    nothing of the simulation's error on one single-thread instance: a neighbour of that split
    stays to be measured until its own kind was measured, and is then judged by its own band."""
    band = ClosedLoopBand(least=3)
    two_threads = [Knobs(32, t, 1, 2, 1) for t in (1.0, 2.0)] + [Knobs(64, 1.0, 1, 2, 1)]
    for config in two_threads:
        band.observe(config, predicted_ms=5.7, measured_ms=6.3)  # 1.11x predicted
    incumbent, one_thread = two_threads[0], Knobs(32, 2.0, 1, 1, 1)
    assert band.rules_out(Knobs(128, 1.0, 1, 2, 1), 5.7, incumbent, margin=0.05)
    assert band.lowest_ratio(one_thread) is None and band.configurations_like(one_thread) == 0
    assert not band.rules_out(one_thread, 5.7, incumbent, margin=0.05)
    for config in (Knobs(32, t, 1, 1, 1) for t in (1.0, 4.0, 8.0)):
        band.observe(config, predicted_ms=5.7, measured_ms=5.1)  # 0.89x predicted
    assert band.lowest_ratio(one_thread) == pytest.approx(0.895, rel=1e-2)
    assert not band.rules_out(one_thread, 5.7, incumbent, margin=0.05)  # 5.1 ms beats 6.3


def test_a_closed_loop_search_measures_the_fastest_neighbour_its_kinds_band_leaves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The simulation ranks a two-thread timeout first, but three of that kind measured 10%
    slower than it predicts rule it out; the next, one single-thread instance with a timeout,
    a kind not measured here, is measured rather than the search resting."""
    incumbent = Knobs(32, 1.0, 1, 2, 1)
    measured = [incumbent, Knobs(32, 2.0, 1, 2, 1), Knobs(64, 1.0, 1, 2, 1)]
    first, second = Knobs(128, 1.0, 1, 2, 1), Knobs(32, 1.0, 1, 1, 1)
    predicted = {**{c: 5.7 for c in measured}, first: 5.6, second: 5.65}
    policy = closed_loop_policy(monkeypatch, predicted)
    policy.begin(incumbent)
    for config in measured:
        policy.learn(Step(config, "exploit" if config == incumbent else "explore"), served(6.3))
        if config != incumbent:
            policy.memory.reject(policy._key(), config)
    assert policy.band.rules_out(first, 5.6, incumbent, policy.settings.trial_margin)
    pick, why = policy._closed_loop_pick([first, second])
    assert pick == second, why
    pick, why = policy._closed_loop_pick([first])
    assert pick is None and "each ruled out by the band of its kind" in why


def closed_loop_policy(monkeypatch: pytest.MonkeyPatch, predicted_ms: dict[Knobs, float]) -> Policy:
    """A calibrated policy under a closed loop of 32 requests whose closed-loop simulation
    predicts ``predicted_ms`` per request (100 ms for any other configuration)."""
    policy = calibrated_policy()
    for _ in range(policy.load_kind.readings):
        policy.load_kind.observe(32)
    monkeypatch.setattr(
        policy.queue_model,
        "closed_loop_many",
        lambda configs, population: [predicted_ms.get(c, 100.0) for c in configs],
    )
    return policy


def served(per_request_ms: float, population: int = 32, duration_s: float = 2.0) -> Measurement:
    """A closed loop's window answering ``population`` clients at ``per_request_ms`` each."""
    n = round(population / per_request_ms * 1000.0 * duration_s)
    return window(per_request_ms, n=n, duration_s=duration_s)


def searched_closed_loop(monkeypatch: pytest.MonkeyPatch, measured_b_ms: float) -> Policy:
    """A closed loop whose simulation predicts the incumbent at 50 ms per request (measured
    52), its first two neighbours a and b at 60 and 70 (a measured 63, b ``measured_b_ms``;
    both lost their trials) and every other neighbour at 65."""
    near = neighbours(SPACE, INCUMBENT, 2)
    a, b = near[0], near[1]
    predicted = {INCUMBENT: 50.0, a: 60.0, b: 70.0, **{c: 65.0 for c in near[2:]}}
    policy = closed_loop_policy(monkeypatch, predicted)
    for _ in range(2):
        policy.learn(Step(INCUMBENT, "exploit"), served(52.0))
    for config, ms in ((a, 63.0), (b, measured_b_ms)):
        policy.learn(Step(config, "explore"), served(ms))
        policy.memory.reject(policy._key(), config)  # they lost their trials
    return policy


def test_a_closed_loop_search_rests_when_the_simulation_within_its_band_rules_all_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three configurations of a kind measured within 10% of the simulation: a neighbour of
    that kind it puts 30% slower than the incumbent is not measured; once every untried
    neighbour's kind is so measured, the search rests and says why."""
    policy = searched_closed_loop(monkeypatch, measured_b_ms=75.0)
    assert policy.band.configurations == 3 and policy.band.lowest_ratio() == pytest.approx(
        1.04, rel=1e-2
    )
    # The three are eager batching on one single-thread instance: they show nothing of the
    # simulation's error on a timeout, so the neighbour with one is measured, however slow it
    # is predicted; nor of it on another split of the cores.
    timed = next(c for c in neighbours(SPACE, INCUMBENT, 2) if c.batch_timeout_ms > 0)
    step = policy.choose()
    assert step.kind == "explore" and step.config == timed, step.reason
    policy.trial = None
    policy.memory.reject(policy._key(), timed)  # it lost its trial
    step = policy.choose()
    assert step.kind == "explore", step.reason
    assert (step.config.concurrency, step.config.intra_op_threads) != (1, 1)
    policy.trial = None
    # Three of each other split measured at 0.9x the simulation's 100 ms: each remaining
    # neighbour, predicted 65 ms, would measure 58.5, not under 52 ms less 5%.
    for split in ((2, 1), (1, 2)):
        for batch in (2, 8, 16):
            policy.learn(Step(Knobs(batch, 0.0, *split, 1), "explore"), served(90.0))
    step = policy.choose()
    assert step.kind == "exploit" and step.config == INCUMBENT, step.reason
    assert "each ruled out by the band of its kind" in step.reason
    assert "none beats the incumbent's measured 52.0ms by the margin (5%)" in step.reason
    policy.learn(Step(INCUMBENT, "exploit"), served(30.0))  # within half the 100 ms SLO
    assert policy.rest.resting
    rest = policy.rest_step()  # each decision of the rest names what it rests on
    assert rest is not None and "each ruled out by the band of its kind" in rest.reason


def test_a_simulation_that_was_wrong_in_a_neighbours_favour_loses_its_veto(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same neighbourhood, but one measured configuration ran twice as fast as the
    simulation said: the band widens, and the neighbour predicted slower is measured."""
    near = neighbours(SPACE, INCUMBENT, 2)
    policy = searched_closed_loop(monkeypatch, measured_b_ms=35.0)  # 70 ms predicted
    assert policy.band.lowest_ratio() == pytest.approx(0.5, rel=1e-2)
    step = policy.choose()
    assert step.kind == "explore" and step.config in near[2:], step.reason
    assert "closed loop of 32 requests" in step.reason


def test_a_closed_loop_is_not_searched_on_the_open_loop_gates_gains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The gate predicts an open loop at the arrival rate: in a closed loop its candidate is
    not tried, and the closed-loop simulation ranks what is measured instead."""
    policy = calibrated_policy()
    gated = Knobs(32, 0.0, 2, 1, 1)
    verdict = Verdict(None, None, gated, 50.0, 1.0, 5, "predicted gain 50 clears 1")
    monkeypatch.setattr("rrl.agent.policy.decide", lambda *args, **kwargs: verdict)
    step = policy.choose()
    assert (step.kind, step.config) == ("explore", gated)  # an open loop: tried on the gate's word
    closed = closed_loop_policy(monkeypatch, {INCUMBENT: 50.0})
    asked: list[object] = []
    monkeypatch.setattr("rrl.agent.policy.decide", lambda *args, **kwargs: asked.append(args))
    monkeypatch.setattr("rrl.agent.policy.screen", lambda *args, **kwargs: asked.append(args))
    step = closed.choose()
    assert step.kind == "explore" and step.reason.startswith("measured search"), step.reason
    assert closed.verdict is not None and closed.verdict.candidate is None
    assert "does not model" in closed.verdict.reason
    assert asked == []  # not even screened: the simulations would take the loop's cores


def test_a_closed_loops_windows_do_not_calibrate_the_open_loop_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The queueing model predicts an open loop's p95; 32 clients always waiting make a
    window's p95 their own doing, which would teach the model an offset it must not carry to
    the next open loop."""
    closed = closed_loop_policy(monkeypatch, {INCUMBENT: 30.0})
    before = list(closed.queue_model._residuals)
    for _ in range(3):
        closed.learn(Step(INCUMBENT, "exploit"), served(30.0))
    closed.choose()
    assert list(closed.queue_model._residuals) == before
    opened = calibrated_policy()
    before = list(opened.queue_model._residuals)
    opened.learn(Step(INCUMBENT, "exploit"), served(30.0))
    opened.choose()
    assert len(opened.queue_model._residuals) == len(before) + 1


def test_a_closed_loop_lead_is_tried_at_the_margin_and_a_plain_neighbour_at_twice_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A configuration the closed-loop simulation puts faster than the incumbent by more than
    a trial's margin has a prediction behind it: its trial asks for the margin; a neighbour
    the simulation puts no faster is measured blind, at twice the margin."""
    lead = Knobs(32, 8.0, 2, 1, 1)
    policy = closed_loop_policy(monkeypatch, {INCUMBENT: 50.0, lead: 30.0})
    step = policy.choose()
    assert (step.kind, step.config) == ("explore", lead), step.reason
    assert policy.trial is not None and policy.trial.margin == policy._trial_margin()
    near = neighbours(SPACE, INCUMBENT, 2)
    plain = closed_loop_policy(monkeypatch, {INCUMBENT: 50.0, **{c: 49.0 for c in near}})
    step = plain.choose()
    assert step.kind == "explore" and step.config in near, step.reason
    assert plain.trial is not None and plain.trial.margin == 2 * plain._trial_margin()


def test_a_closed_loop_rests_on_its_time_per_request_not_on_its_clients_p95(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """32 clients always waiting make a window's p95 long (80 ms against a 100 ms SLO) while
    each request takes 30 ms of the gateway's time: in a closed loop that is a margin, and the
    rest the search asked for begins; the same window in an open loop has none."""
    busy = Measurement(2.0, 2133, 2133, 40.0, 80.0, 90.0, 0, 0)  # 32 / 1,067 per s: 30 ms
    closed = closed_loop_policy(monkeypatch, {INCUMBENT: 30.0})
    closed._asked = (closed._key(), INCUMBENT)
    closed.learn(Step(INCUMBENT, "exploit"), busy)
    assert closed.rest.resting
    opened = calibrated_policy()
    opened._asked = (opened._key(), INCUMBENT)
    opened.learn(Step(INCUMBENT, "exploit"), busy)
    assert not opened.rest.resting


def test_a_trials_windows_are_compared_at_the_load_they_ran_under_not_at_what_they_answered() -> (
    None
):
    """An open loop of 330 requests/s: the candidate's windows drain a backlog (380 answered a
    second), the incumbent's window between them inherits it (290 answered). Each ran under
    the same 330 arrivals a second, so the trial compares them there: normalised by what they
    answered, the model's steep rise near saturation would have scaled the incumbent's window
    up and the candidate's down, and a backlog's shuffle read as a gain."""
    policy = calibrated_policy()
    candidate = Knobs(32, 0.0, 1, 1, 1)
    policy.trial = Trial(INCUMBENT, candidate, (), interleave=True, margin=0.2)

    def ran(config: Knobs, answered: int, p95_ms: float) -> None:
        m = Measurement(0.5, answered, answered, p95_ms / 2, p95_ms, p95_ms, 0, 0, arrived=165)
        assert m.arrival_rate_per_s == 330.0 and m.rate_per_s != 330.0
        policy.learn(Step(config, "explore" if config == candidate else "compare"), m)

    ran(candidate, 190, 40.0)
    ran(INCUMBENT, 145, 44.0)
    trial = policy.trial
    assert trial is not None
    assert [w.rate_per_s for w in trial.windows] == [330.0, 330.0]
    ran(candidate, 190, 40.0)
    # Compared as measured (one load on both sides): 40 against 44 ms is a tenth, within the
    # 20% margin, so the candidate runs another round rather than winning on the backlog.
    assert policy.trial is trial and trial.rounds == 1


def test_a_closed_loop_on_a_long_timeout_tries_the_shortest_predicted_no_slower(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """32 clients on batch 32 with an 8 ms timeout: the simulation puts 2 and 4 ms at the same
    time per request (the wave fills the batch either way) and 1 ms slower. The 2 ms timeout is
    tried first, and its trial keeps it on a tie; an eager neighbour is not such a candidate."""
    long_wait = Knobs(32, 8.0, 1, 1, 1)
    two, four, one = (Knobs(32, t, 1, 1, 1) for t in (2.0, 4.0, 1.0))
    policy = closed_loop_policy(
        monkeypatch, {long_wait: 6.0, two: 6.0, four: 6.0, one: 7.5, Knobs(32, 0.0, 1, 1, 1): 6.0}
    )
    policy.begin(long_wait)
    step = policy.choose()
    assert (step.kind, step.config) == ("explore", two), step.reason
    assert "a shorter timeout" in step.reason
    assert policy.trial is not None and policy.trial.keep_on_tie
    assert not policy._keeps_on_tie(Knobs(32, 0.0, 1, 1, 1))  # eager: another kind
    assert not policy._keeps_on_tie(Knobs(16, 2.0, 1, 1, 1))  # another batch too
    # Once the 2 ms timeout lost a trial here, the next shortest no slower is 4 ms.
    policy.trial = None
    policy.memory.reject(policy._key(), two)
    found = policy._shorter_wait(policy._key())
    assert found is not None and found[0] == four


def test_a_trial_that_keeps_on_a_tie_takes_a_candidate_no_slower_and_not_a_slower_one() -> None:
    def norm(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    def run(candidate_ms: float, keep_on_tie: bool) -> str:
        inc, cand = Knobs(32, 8.0, 1, 1, 1), Knobs(32, 2.0, 1, 1, 1)
        trial = Trial(inc, cand, [Window(inc, 6.0, 5000.0)], True, 0.1, keep_on_tie=keep_on_tie)
        outcome = None
        for config in trial.schedule():
            ms = candidate_ms if config == cand else 6.0
            outcome = trial.record(config, ms, 5000.0, norm) or outcome
        assert outcome is not None
        return outcome.verdict

    assert run(5.9, keep_on_tie=True) == "accept"  # ahead, far from the 10% margin: kept
    assert run(6.0, keep_on_tie=True) == "accept"  # a tie goes to the shorter timeout
    assert run(6.1, keep_on_tie=True) == "reject"
    assert run(6.0, keep_on_tie=False) == "reject"  # a tie keeps what is known


def test_a_rebuilding_trial_is_judged_against_the_incumbents_last_windows_not_its_last_one() -> (
    None
):
    """An incumbent measuring 6.0 and 6.1 ms a request, then one noisy 8.0: a candidate at
    6.3 beats that last window by 21% (it was kept so, sensor_mlp at 32 connections), but not
    the three, whose median is 6.1: it is behind, and is not kept, after its two windows. An
    interleaved trial measures the incumbent itself, and only the baseline's last two windows join
    its side."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(32, 2.0, 1, 1, 1), Knobs(32, 2.0, 1, 2, 1)
    baseline = [Window(inc, ms, 5000.0) for ms in (6.0, 6.1, 8.0)]

    def run(trial: Trial) -> tuple[str, int]:
        outcome = None
        while outcome is None:
            config = trial.next_config()
            outcome = trial.record(config, 6.3 if config == cand else 6.0, 5000.0, as_measured)
        return outcome.verdict, len(trial.windows)

    assert run(Trial(inc, cand, baseline[-1:], interleave=False, margin=0.2)) == ("accept", 2)
    assert run(Trial(inc, cand, baseline, interleave=False, margin=0.2)) == ("reject", 2)
    assert Trial(inc, cand, baseline, interleave=True, margin=0.2)._before() == baseline[-2:]


def test_an_interleaved_trial_tells_a_worse_candidate_from_a_slower_machine() -> None:
    """Run 14: the incumbent's baseline read while the whole box served a quarter less (J 9.5
    where it measures 6.3), then the slowdown ends and the candidate, 10% worse than the
    incumbent on the same machine (6.9), measures ahead of that baseline. Paired windows keep
    it; interleaved ones measure the incumbent beside it and do not."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(32, 4.0, 1, 1, 1), Knobs(128, 4.0, 1, 2, 1)
    baseline = [Window(inc, ms, 3555.0) for ms in (9.4, 9.5, 9.6)]

    def run(trial: Trial) -> str:
        outcome = None
        while outcome is None:
            config = trial.next_config()
            outcome = trial.record(config, 6.9 if config == cand else 6.3, 4700.0, as_measured)
        return outcome.verdict

    assert run(Trial(inc, cand, baseline, interleave=False, margin=0.06)) == "accept"
    assert run(Trial(inc, cand, baseline, interleave=True, margin=0.06)) == "reject"


def test_one_slow_incumbent_window_does_not_make_a_candidate_look_better() -> None:
    """Run 18: an incumbent measuring 6.3 ms a request reads 7.6 in one window inside the trial
    (one half-second window in a few reads far slower); a candidate at 6.45, no better, came
    out 7% ahead of the mean of that window and the baseline's last. With the baseline's last
    two the side's median is 6.3, and the candidate is not kept."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(64, 1.0, 1, 1, 1), Knobs(64, 1.0, 1, 2, 1)
    baseline = [Window(inc, ms, 4600.0) for ms in (6.3, 6.3, 6.3)]
    trial = Trial(inc, cand, baseline, interleave=True, margin=0.05)
    outcome = None
    while outcome is None:
        config = trial.next_config()
        outcome = trial.record(config, 6.45 if config == cand else 7.6, 4600.0, as_measured)
    assert outcome.verdict == "reject", outcome.reason
    assert outcome.incumbent == 6.3


def test_an_interleaved_revert_needs_the_incumbent_beside_it_beaten_too() -> None:
    """Run 37: the incumbent read 14.7 ms a request before a trial and about 21 later; the
    candidate's first window read 19.8, and the trial reverted it against the baseline alone.
    Interleaved, the verdict waits for the incumbent's window beside it (which the schedule
    runs next, as a revert would): slower too, the machine slowed and the trial goes on; as
    fast as before, the candidate goes back after its one window. Paired, at once."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(32, 0.0, 1, 1, 1), Knobs(16, 1.0, 1, 2, 1)
    baseline = [Window(inc, 14.7, 2000.0) for _ in range(3)]
    for beside, reverted in ((21.0, False), (14.7, True)):
        trial = Trial(inc, cand, baseline, interleave=True, margin=0.07)
        assert trial.next_config() == cand
        assert trial.record(cand, 19.8, 2000.0, as_measured) is None  # not yet: no beside
        assert trial.next_config() == inc
        outcome = trial.record(inc, beside, 2000.0, as_measured)
        assert (outcome is not None) is reverted, outcome
        if outcome is not None:
            assert outcome.verdict == "revert" and "after one window" in outcome.reason
            assert "14.70 beside it" in outcome.reason
            assert [w.config for w in trial.windows] == [cand, inc]  # one candidate window
        else:
            assert trial.next_config() == cand  # the trial's third window
    paired = Trial(inc, cand, baseline, interleave=False, margin=0.07)
    outcome = paired.record(cand, 19.8, 2000.0, as_measured)
    assert outcome is not None and outcome.verdict == "revert", outcome


def test_one_outlier_window_decides_no_trial_either_way() -> None:
    """Each side is read by its median window: an incumbent baseline of 6.0, 6.1 and one
    12.0 (a rebuild's aftermath) does not let a candidate no better (6.1) win, and does not
    hide a real 17% gain either."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(32, 2.0, 1, 1, 1), Knobs(32, 2.0, 1, 2, 1)

    def run(baseline: list[float], candidate: list[float]) -> str:
        trial = Trial(inc, cand, [Window(inc, ms, 5000.0) for ms in baseline], False, 0.05)
        values, outcome = iter(candidate), None
        while outcome is None:
            outcome = trial.record(trial.next_config(), next(values), 5000.0, as_measured)
        return outcome.verdict

    assert run([6.0, 6.1, 12.0], [6.1, 6.1]) == "reject"  # by the mean (8.0) it won by 24%
    assert run([6.0, 6.1, 12.0], [5.0, 5.1]) == "accept"


def test_the_trial_margin_is_the_typical_spread_not_one_outliers() -> None:
    """Windows of 6.0-6.2 ms and one of 12.0: the margin stays near the typical spread (the
    median absolute deviation), not the 35% a standard deviation would make of it."""
    typical = [6.0, 6.1, 6.2, 6.1, 6.0, 6.2, 6.1]
    assert relative_noise([*typical, 12.0], 0.05) < 0.06
    assert statistics.stdev([*typical, 12.0]) / statistics.fmean([*typical, 12.0]) > 0.3
    assert relative_noise([6.0, 7.0, 8.0, 6.5, 7.5], 0.05) > 0.1  # a wide spread stays wide
    assert relative_noise([6.0, 12.0], 0.05) == 0.05  # too few windows to say


def _in_a_loop_of_32(incumbent: Knobs) -> Policy:
    """A policy on ``incumbent`` (batch up to 128, two cores) that has read a closed loop of 32
    single-row clients."""
    space = ConfigSpace.for_machine(2, max_batch_size=128)
    s = AgentSettings(gate_every_s=0.0, trial_gap=0)
    policy = Policy("m", space=space, slo_ms=100.0, cores=2, settings=s)
    policy.current = policy.incumbent = incumbent
    for _ in range(policy.load_kind.readings):
        policy.load_kind.observe(32)
    return policy


def _search_until_none_is_left(policy: Policy, arrivals: Arrivals) -> list[Knobs]:
    """The measured search's picks, in order, each rejected as if it lost its trial, until it
    has none left (at most 12)."""
    key, picks = policy._key(), []
    for _ in range(12):
        nothing = Verdict(None, None, None, 0.0, 1.0, 0, "the gate let nothing through")
        pick, _, _ = policy._measured_candidate(arrivals, nothing)
        if pick is None:
            break
        picks.append(pick)
        policy.memory.reject(key, pick)
    return picks


def test_a_closed_loop_search_from_an_eager_batch_above_the_loop_reaches_a_smaller_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a batch timeout, 32 clients form the same batches under batch 32, 64 and 128
    (each takes all that waits), so the search steps from the batch the loop forms: from an
    incumbent on batch 128 the batch axis reaches 16 (which splits the loop in two), and never
    measures 32 or 64 against it."""
    incumbent = Knobs(128, 0.0, 1, 2, 1)
    policy = _in_a_loop_of_32(incumbent)
    assert policy._loop_form(incumbent) == policy._loop_form(Knobs(32, 0.0, 1, 2, 1))
    assert policy._loop_form(incumbent) == Knobs(32, 0.0, 1, 2, 1)
    # With a timeout, batch 32 fills and leaves at once while 64 waits out the timeout.
    assert policy._loop_form(Knobs(128, 1.0, 1, 2, 1)) == Knobs(64, 1.0, 1, 2, 1)
    monkeypatch.setattr(
        policy.queue_model, "closed_loop_many", lambda configs, population: [6.3] * len(configs)
    )
    picks = _search_until_none_is_left(policy, Arrivals(500.0, 1.0, 1.0))
    assert Knobs(16, 0.0, 1, 2, 1) in picks
    assert not {Knobs(32, 0.0, 1, 2, 1), Knobs(64, 0.0, 1, 2, 1)} & set(picks)


def test_a_closed_loop_search_skips_the_batch_sizes_its_clients_cannot_tell_apart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under 32 clients of one row, every batch size above 32 forms the same batches (none can
    fill, each takes all that waits): with the incumbent on batch 128, the search never
    measures batch 64 on the same instances and threads, and batch 64 losing a trial rules
    out batch 128 as well. Batch 32, which can fill, is still another configuration."""
    incumbent = Knobs(128, 1.0, 2, 1, 1)
    policy = _in_a_loop_of_32(incumbent)
    assert policy.load_kind.closed
    same, other = Knobs(64, 1.0, 2, 1, 1), Knobs(32, 1.0, 2, 1, 1)
    assert policy._loop_form(same) == policy._loop_form(incumbent)
    assert policy._loop_form(other) == other
    key = policy._key()
    pool = [same, other, Knobs(64, 2.0, 2, 1, 1), Knobs(128, 2.0, 2, 1, 1)]
    assert policy._unlike_in_loop(pool, key) == [other, Knobs(64, 2.0, 2, 1, 1)]
    policy.memory.reject(key, Knobs(64, 2.0, 2, 1, 1))
    assert policy._unlike_in_loop([Knobs(128, 2.0, 2, 1, 1), other], key) == [other]
    # Through the search: every configuration predicted alike, batch 64 is never the pick.
    monkeypatch.setattr(
        policy.queue_model, "closed_loop_many", lambda configs, population: [6.3] * len(configs)
    )
    picks = set(_search_until_none_is_left(policy, Arrivals(5000.0, 1.0, 1.0)))
    assert picks and all(policy._loop_form(p) != policy._loop_form(incumbent) for p in picks)


def test_a_closed_loops_state_is_never_bursty_however_its_trials_move_the_counts() -> None:
    counts = [250, 125, 250, 125, 250, 250, 125, 250]  # a slower candidate's windows halve them
    opened, looped = calibrated_policy(), calibrated_policy()
    for reading, count in zip([5, 9, 3, 7, 6, 8, 4, 9] * 2, counts * 2, strict=True):
        opened._tick_counts.append(count)
        looped._tick_counts.append(count)
        opened.load_kind.observe(reading)
        looped.load_kind.observe(32)
    assert opened.dispersion() > BURSTY_DISPERSION and looped.dispersion() > BURSTY_DISPERSION
    assert opened._key().bursty  # devices that send in bursts
    assert looped.load_kind.closed and looped.load_kind.held == 32
    # The same key as before the trials: what the search spent and rejected stays counted.
    assert not looped._key().bursty


def test_the_search_rests_after_its_patience_of_lost_trials_and_measures_one_more_at_recheck() -> (
    None
):
    now = [0.0]
    policy = calibrated_policy(search_patience=2, measured_trials=12)
    policy._clock = lambda: now[0]
    for _ in range(2):  # the incumbent measures far slower than the model says: untrusted
        predicted = policy._predict(INCUMBENT)
        assert predicted is not None
        policy.learn(Step(INCUMBENT, "exploit", predicted=predicted), window(80.0))
    lost: list[Knobs] = []
    for _ in range(40):
        now[0] += 1.0
        step = policy.choose()
        if step.kind == "exploit" and "resting on those measurements" in step.reason:
            break
        # Every configuration the search measures answers slower than the incumbent.
        policy.learn(step, window(120.0 if step.config != INCUMBENT else 80.0))
        if step.kind == "explore" and step.config not in lost:
            lost.append(step.config)
    assert len(lost) == 2 and policy._searched[policy._key()] == 2  # then no third
    assert "each lost to the incumbent" in step.reason
    assert policy._asked == (policy._key(), INCUMBENT)  # the rest may begin
    # The rest's recheck lets the search measure one more.
    key = (policy._key(), INCUMBENT)
    policy.rest.begin(now[0], policy.monitor.rate_per_s, policy.monitor.rows_per_request, key)
    assert policy.rest_step() is not None  # resting
    now[0] += policy.settings.rest.recheck_s
    assert policy.rest_step() is None  # the recheck: the rule chooses
    step = policy.choose()
    assert step.kind == "explore" and step.config not in lost


def test_a_timeout_the_closed_loop_never_waits_out_is_not_measured_again() -> None:
    def knobs(batch: int, timeout_ms: float) -> Knobs:
        return Knobs(batch, timeout_ms, 2, 1, 1)

    ranked: list[tuple[float | None, Knobs]] = [
        (50.0, knobs(16, 0.0)),
        (52.7, knobs(4, 2.0)),  # batch 4 at 1 ms was measured: the same prediction
        (52.7, knobs(4, 4.0)),
        (55.0, knobs(8, 2.0)),
        (55.2, knobs(8, 4.0)),  # the same as batch 8 at 2 ms, ranked before it
        (61.0, knobs(8, 8.0)),  # a timeout the loop does wait out: predicted otherwise
        (None, knobs(2, 1.0)),  # not predicted: kept
    ]
    kept = _new_forms(ranked, [(52.7, knobs(4, 1.0))])
    assert [c for _, c in kept] == [knobs(16, 0.0), knobs(8, 2.0), knobs(8, 8.0), knobs(2, 1.0)]


def test_a_split_predicted_alike_is_not_measured_again_after_it_lost() -> None:
    """Once a configuration lost its trial, the others on the same split of the cores that the
    closed-loop simulation predicts alike differ from it only in the batch they wait for: the
    prediction they share is the one that measurement refuted."""

    def knobs(batch: int, instances: int, threads: int, timeout_ms: float = 0.0) -> Knobs:
        return Knobs(batch, timeout_ms, instances, threads, 1)

    ranked: list[tuple[float | None, Knobs]] = [
        (13.9, knobs(8, 2, 1)),  # batch 4 on this split lost, predicted alike
        (13.9, knobs(2, 2, 1, 1.0)),
        (14.6, knobs(16, 2, 1)),  # predicted otherwise: kept
        (15.0, knobs(2, 1, 2)),  # the incumbent's split: it lost nothing
        (None, knobs(4, 2, 1, 2.0)),  # not predicted: kept
    ]
    kept = _new_forms(ranked, [(16.1, knobs(1, 1, 2))], [(13.9, knobs(4, 2, 1))])
    assert [c for _, c in kept] == [knobs(16, 2, 1), knobs(2, 1, 2), knobs(4, 2, 1, 2.0)]
    # Only a lost trial refutes a split: against the incumbent, batch sizes still count.
    assert _new_forms(ranked[3:4], [(15.0, knobs(1, 1, 2))]) == ranked[3:4]


def test_a_closed_loop_search_measures_its_own_split_after_another_lost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run 48 (vision_cnn, 8 clients, from one instance of two threads at batch 1): two
    single-thread instances at batch 2, 4 and 8 were each predicted at 13.9 ms a request, lost
    one after another, and the search rested before measuring a larger batch on its own split.
    After the first of them loses, the next measured is the incumbent's split at batch 2."""
    incumbent = Knobs(1, 0.0, 1, 2, 1)
    siblings = [Knobs(b, 0.0, 2, 1, 1) for b in (2, 4, 8)]
    own = Knobs(2, 0.0, 1, 2, 1)
    policy = closed_loop_policy(
        monkeypatch, {incumbent: 16.1, own: 15.0, **{c: 13.9 for c in siblings}}
    )
    policy.current = policy.incumbent = incumbent
    picks = _search_until_none_is_left(policy, Arrivals(400.0, 1.0, 1.0))
    assert picks[0] in siblings and picks[1] == own, picks
    assert len(set(picks) & set(siblings)) == 1, picks


def test_a_resting_closed_loop_does_not_wake_on_its_own_rate_but_an_open_loop_does() -> None:
    looped, opened = calibrated_policy(), calibrated_policy()
    for _ in range(16):
        looped.load_kind.observe(32)
    assert looped.load_kind.same_loop() and not opened.load_kind.same_loop()
    now = time.monotonic()
    for policy in (looped, opened):
        key = (policy._key(), INCUMBENT)
        policy.rest.begin(now, policy.monitor.rate_per_s, 1.0, key)
        policy.monitor.update(now + 1.0, 600)  # 1.7x the rested rate over the window
        assert policy.monitor.rate_per_s > 1.5 * policy.rest.state.rate_per_s  # type: ignore[union-attr]
    assert looped.rest_step() is not None  # the machine served the same clients faster
    assert opened.rest_step() is None and not opened.rest.resting  # devices sent more


def test_the_noise_measured_in_a_state_judges_the_trial_after_an_accepted_one() -> None:
    """The machine's noise does not leave with a configuration: a new incumbent's first
    trials are judged at its predecessor's noise in the state, not at the 5% floor, until it
    has three windows of its own; another workload state measures its noise anew."""
    policy = calibrated_policy()
    noisy = [20.0, 35.0, 14.0, 30.0, 18.0]  # one configuration's windows, 171/s of Poisson
    for value in noisy:
        policy.learn(Step(INCUMBENT, "exploit"), window(value))
    spread = policy._trial_margin()
    assert spread > 0.3
    # An accepted trial: the new incumbent has no windows of its own yet.
    better = Knobs(8, 0.0, 2, 1, 1)
    policy.incumbent = better
    policy._incumbent_values.clear()
    assert policy._trial_margin() == pytest.approx(spread)
    # Its own three calm windows take over.
    for value in (10.0, 10.2, 9.9):
        policy.learn(Step(better, "exploit"), window(value))
    assert policy._trial_margin() == policy.settings.trial_margin
    moved = calibrated_policy()
    moved.workload = moved.monitor.state
    for value in noisy:
        moved.learn(Step(INCUMBENT, "exploit"), window(value))
    assert moved._trial_margin() > 0.3
    moved.workload_changed(INCUMBENT, rebuilt=False)
    assert moved._trial_margin() == moved.settings.trial_margin


DRIFTING_BOX = [1.00, 1.06, 1.14, 1.22, 1.18, 1.08, 0.98, 0.90, 0.86, 0.92, 1.00, 1.08, 1.16]
"""A box's speed over successive half-second windows: slow waves of about 20% across a trial,
adjacent windows within a few percent of each other (a closed loop of sensor_mlp here: 15%
across a run, a median 6% between adjacent windows)."""


def drifting_trial(gain: float, *, by_pairs: bool) -> tuple[Outcome, int]:
    """A trial of a candidate ``gain`` faster than the incumbent (10 ms a request) on the
    drifting box, run to its verdict, and the windows it took; its margin (30%) is what the
    spread of the incumbent's windows across the run asks of a blind candidate."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(32, 2.0, 1, 1, 1), Knobs(128, 2.0, 2, 1, 1)
    baseline = [Window(inc, 10.0 * s, 2000.0) for s in (0.96, 0.98, DRIFTING_BOX[0])]
    trial = Trial(inc, cand, baseline, True, 0.3, by_pairs=by_pairs, max_windows=12)
    for speed in DRIFTING_BOX[1:]:
        config = trial.next_config()
        ms = 10.0 * speed * ((1.0 - gain) if config == cand else 1.0)
        if (outcome := trial.record(config, ms, 2000.0, as_measured)) is not None:
            return outcome, len(trial.windows)
    raise AssertionError("no verdict")


def test_a_closed_loop_trial_reads_a_gain_through_the_boxs_drift_by_paired_windows() -> None:
    """A 10% faster candidate on a box whose speed drifts 20% across the trial: each of its
    windows against the incumbent's beside it shows the gain, and it is kept in five windows;
    the medians of the two sides against a margin the drift set would keep the incumbent."""
    outcome, windows = drifting_trial(0.10, by_pairs=True)
    assert (outcome.verdict, windows) == ("accept", 5), outcome.reason
    assert drifting_trial(0.10, by_pairs=False)[0].verdict == "reject"


def test_a_closed_loop_trial_measures_a_small_lead_longer_and_keeps_the_incumbent() -> None:
    """A candidate 3% faster, under the 5% a trial keeps a candidate for: ahead after each
    round, it runs to the most windows a closed loop's trial may (six differences) and the
    incumbent stays; one as fast as the incumbent, or slower, is decided at the first verdict."""
    outcome, windows = drifting_trial(0.03, by_pairs=True)
    assert (outcome.verdict, windows) == ("reject", 11), outcome.reason
    assert "over 6 paired windows" in outcome.reason and "beyond the noise" in outcome.reason
    for gain in (0.0, -0.05):
        level, windows = drifting_trial(gain, by_pairs=True)
        assert (level.verdict, windows) == ("reject", 3), level.reason


def test_a_paired_trials_spread_is_pooled_with_what_the_states_trials_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two differences that agree exactly do not make a trial certain: their spread is pooled
    with the state's prior (10% before any trial), so an 8% lead in them asks for more windows.
    A trial's differences then become the state's spread for the next trial."""
    policy = closed_loop_policy(monkeypatch, {})
    for _ in range(2):
        policy.learn(Step(INCUMBENT, "exploit"), served(50.0))
    first = policy._paired_trial()
    assert first["by_pairs"] and first["pair_noise"] == DEFAULT_PAIR_NOISE
    lead = Knobs(64, 2.0, 1, 1, 1)
    policy.trial = Trial(INCUMBENT, lead, tuple(policy._baseline), True, 0.3, **first)
    leads = [46.0, 46.0, 50.0, 44.0, 49.0, 45.0]
    ran: list[float] = []
    while policy.trial is not None:
        config = policy.trial.next_config()
        ms = leads[len(ran)] if config == lead else 50.0
        ran += [ms] if config == lead else []
        policy.learn(Step(config, "explore"), served(ms))
    assert len(ran) > 2  # two agreeing differences were not enough
    logs = [math.log(ms / 50.0) for ms in ran]
    mean = sum(logs) / len(logs)
    pooled = math.sqrt(sum((d - mean) ** 2 for d in logs) / (len(logs) - 1))
    assert policy._paired_trial()["pair_noise"] == pytest.approx(pooled, rel=0.01)


def test_a_closed_loop_trials_last_look_asks_less_than_its_earlier_ones() -> None:
    """Run 40: two single-thread instances led one instance of two threads by 10.3% over six
    paired windows and needed 11.1%, twice the standard error. Differences alternating 17.5%
    and -2.5% (a 7.5% mean gain) clear no look that could still measure longer, and at the
    last look clear 1.65 standard errors, not two: kept at the eleventh window."""

    def as_measured(config: Knobs, objective: float, seen: float, common: float) -> float:
        return objective

    inc, cand = Knobs(128, 0.0, 1, 2, 1), Knobs(16, 1.0, 2, 1, 1)
    trial = Trial(inc, cand, [Window(inc, 10.0, 300.0)], True, 0.3, by_pairs=True, max_windows=12)
    steps = [-0.175, 0.025] * 3
    outcome, looked = None, 0
    while outcome is None:
        config = trial.next_config()
        ms = 10.0 * math.exp(steps[looked]) if config == cand else 10.0
        looked += config == cand
        outcome = trial.record(config, ms, 300.0, as_measured)
    assert (outcome.verdict, len(trial.windows)) == ("accept", 11), outcome.reason
    diffs, _ = trial.differences(as_measured)
    gain, error = -sum(diffs) / len(diffs), trial.spread(diffs) / math.sqrt(len(diffs))
    assert LAST_LOOK_Z * error < gain < EARLY_LOOK_Z * error


def yield_trial(baseline: list[float]) -> Trial:
    """A core budget's yield from INCUMBENT to one thread, kept below J 30 (the SLO)."""
    return Trial(
        INCUMBENT,
        Knobs(4, 0.0, 1, 1, 1),
        tuple(Window(INCUMBENT, v, 300.0) for v in baseline),
        interleave=False,
        margin=0.1,
        accept_below=30.0,
    )


def test_a_yield_beyond_the_slo_goes_back_only_from_an_incumbent_within_it_or_better() -> None:
    """The core budget's yield is kept unless it violates the SLO; from an incumbent that
    violates it too (more threads than the cores, a storm), unless it measured worse than the
    incumbent's baseline by the margin."""
    candidate = Knobs(4, 0.0, 1, 1, 1)

    def verdicts(baseline: list[float], values: list[float]) -> list[str | None]:
        trial, out = yield_trial(baseline), []
        for v in values:
            outcome = trial.record(candidate, v, 300.0, lambda c, j, seen, common: j)
            out.append(None if outcome is None else outcome.verdict)
            if outcome is not None:
                break
        return out

    assert verdicts([20.0, 21.0], [40.0]) == ["revert"]  # the incumbent met the SLO
    assert verdicts([20.0, 21.0], [25.0, 28.0]) == [None, "accept"]
    assert verdicts([80.0, 78.0], [60.0, 85.0]) == [None, "accept"]  # both beyond, no worse
    assert verdicts([80.0, 78.0], [95.0]) == ["revert"]  # worse than 79 by more than 10%
    assert verdicts([], [40.0]) == ["revert"]


def test_within_the_cores_is_kept_on_a_tie_against_an_incumbent_beyond_them() -> None:
    """Four instances of two threads on two cores: a candidate within the cores is kept unless
    it measures slower (a lead short of the margin keeps it), and losing such a trial is a loss
    for the search's patience, not a shorter timeout's."""
    policy = calibrated_policy()
    crowded, within = Knobs(32, 0.0, 4, 2, 1), Knobs(32, 0.0, 1, 2, 1)
    policy.incumbent = policy.current = crowded
    assert policy._keeps_on_tie(within)
    assert not policy._keeps_on_tie(Knobs(32, 0.0, 2, 2, 1))  # four threads: beyond them too
    policy.incumbent = policy.current = within
    assert not policy._keeps_on_tie(Knobs(32, 0.0, 2, 1, 1))  # from within the cores: no tie
    policy.incumbent = policy.current = crowded
    policy._baseline.extend([Window(crowded, 10.0, 300.0)] * 3)
    for lead, kept in ((0.97, True), (1.2, False)):
        policy.incumbent = policy.current = crowded
        key = policy._key()
        policy.memory.rejected.get(key, set()).discard(within)
        policy._search_trial_in = key
        policy.trial = Trial(crowded, within, (), interleave=True, margin=0.2, keep_on_tie=True)
        for config in (within, crowded, within):
            policy._trial_window(config, 10.0 * lead if config == within else 10.0, window(10.0))
        assert policy.trial is None
        assert (policy.incumbent == within) is kept
        if not kept:
            assert policy._losing.get(key) == 1 and key not in policy._tie_lost
