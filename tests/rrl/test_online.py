"""The online agent against a running gateway (real ONNX Runtime sessions, real HTTP), and its
safety rules: veto, back-off, rebuild pacing, idle models, manual knobs pausing it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from gateway.main import Gateway
from gateway.settings import GatewaySettings
from rrl.measurement import Measurement
from rrl.online import AgentSettings, ModelAgent
from rrl.space import Config, ConfigSpace, expert_default
from rrl.workload import WorkloadState

BODY = {"inputs": [{"name": "features", "shape": [1, 32], "datatype": "FP32", "data": [0.25] * 32}]}
# Two configurations that differ in the batch size only: no rebuild between them.
TINY = ConfigSpace(
    batch_sizes=(1, 2),
    timeouts_ms=(0.0,),
    concurrency=(1,),
    intra_op_threads=(1,),
    inter_op_threads=(1,),
)
# The batch size axis alone, 1..128: 8 notches, wider than one region (radius 2).
BATCHES = ConfigSpace(
    batch_sizes=tuple(2**i for i in range(8)),
    timeouts_ms=(0.0,),
    concurrency=(1,),
    intra_op_threads=(1,),
    inter_op_threads=(1,),
)


@contextlib.asynccontextmanager
async def gateway(repo: Path, tmp: Path, **tuner: Any) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": tmp / "cache"},
        mqtt={"enabled": False},
        tuner={"enabled": True, "models": ["sensor_mlp"], **tuner},
    )
    gw = Gateway(settings)
    await gw.start(wait_ready=True)
    try:
        yield gw
    finally:
        await gw.stop()


async def poisson_load(
    url: str, rate_per_s: float, seconds: float, seed: int = 0
) -> dict[int, int]:
    """Open-loop Poisson arrivals of single-row requests; returns the count per HTTP status."""
    statuses: dict[int, int] = {}
    reasons: list[str] = []
    rng = np.random.default_rng(seed)
    pending: set[asyncio.Task[None]] = set()
    async with aiohttp.ClientSession() as http:

        async def one() -> None:
            async with http.post(f"{url}/v2/models/sensor_mlp/infer", json=BODY) as r:
                body = await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1
                if r.status != 200:
                    reasons.append(body.decode(errors="replace"))

        end = time.monotonic() + seconds
        while time.monotonic() < end:
            task = asyncio.create_task(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            await asyncio.sleep(float(rng.exponential(1.0 / rate_per_s)))
        await asyncio.gather(*pending)
    assert not reasons, reasons[:5]
    return statuses


def measurement(p95_ms: float, violations: int = 0, n: int = 100) -> Measurement:
    return Measurement(
        duration_s=2.0,
        offered=n,
        completed=n,
        p50_ms=p95_ms / 2,
        p95_ms=p95_ms,
        p99_ms=p95_ms,
        slo_violations=violations,
        rejected=0,
    )


async def test_agent_retunes_a_serving_gateway_and_no_request_fails(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, interval_s=0.5, min_rebuild_gap_s=0.5) as gw:
        assert gw.tuning is not None
        url = f"http://127.0.0.1:{gw.http_port}"
        statuses = await poisson_load(url, rate_per_s=150, seconds=10)
        agent = gw.tuning.agent("sensor_mlp")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/admin/tuner/sensor_mlp?decisions=1000") as r:
                assert r.status == 200
                state = await r.json()
            async with http.get(f"{url}/admin/tuner") as r:
                overview = await r.json()
            async with http.get(f"{url}/metrics") as r:
                metrics = await r.text()
        knobs_now = gw.service.knobs("sensor_mlp").as_dict()
    # Every request was answered while the agent explored.
    assert set(statuses) == {200}, statuses
    assert sum(statuses.values()) > 1000
    applied = {tuple(sorted(d["config"].items())) for d in state["decisions"]}
    assert len(applied) >= 4, state["decisions"]
    assert state["decision_counts"].get("explore", 0) >= 3
    assert any(d["rebuilt"] for d in state["decisions"]), "no thread/concurrency change tried"
    assert state["workload"] is not None and state["workload"]["rate_level"] >= 6  # ~2^7/s
    # What the agent believes is running is what the gateway runs.
    assert agent.current is not None
    assert agent.current.knob_changes() == pytest.approx(knobs_now)
    measured = [d for d in state["decisions"] if d["measurement"] is not None]
    assert measured and all(d["measurement"]["offered"] >= 10 for d in measured)
    # Estimates are best first; none beats the best measured configuration's value (region
    # estimates are weighted means of measured values).
    assert state["estimates"][0]["objective"] == pytest.approx(state["best_estimate"], rel=1e-3)
    assert overview["models"]["sensor_mlp"]["algorithm"] == "adaptive-rrl"  # the default
    assert 'iotgw_tuner_decisions_total{kind="explore",model="sensor_mlp",version="1"}' in metrics
    assert 'iotgw_tuner_config{knob="max_batch_size",model="sensor_mlp"' in metrics
    assert 'iotgw_tuner_workload{field="rate_level",model="sensor_mlp",version="1"}' in metrics


async def _until_workload_known(agent: ModelAgent, deadline_s: float = 30.0) -> None:
    """The monitor's window has passed once the agent knows the (idle) workload state."""
    end = time.monotonic() + deadline_s
    while agent.workload is None:
        assert time.monotonic() < end, "the workload state never became known"
        await asyncio.sleep(0.1)


async def test_the_agent_starts_from_the_expert_default_and_an_idle_model_keeps_it(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, interval_s=0.3) as gw:
        assert gw.tuning is not None
        agent = gw.tuning.agent("sensor_mlp")
        await _until_workload_known(agent)
        expert = expert_default(len(os.sched_getaffinity(0)), max_batch_size=128)
        assert gw.service.knobs("sensor_mlp").as_dict() == pytest.approx(expert.knob_changes())
        assert agent.current == expert
        assert not {"explore", "exploit", "hold"} & set(agent.counts), agent.counts


async def test_an_agent_told_to_start_from_the_configured_knobs_keeps_them_while_idle(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, interval_s=0.3, start="configured") as gw:
        assert gw.tuning is not None
        before = gw.service.knobs("sensor_mlp")
        agent = gw.tuning.agent("sensor_mlp")
        await _until_workload_known(agent)
        assert gw.service.knobs("sensor_mlp") == before
        assert not {"explore", "exploit", "hold"} & set(agent.counts), agent.counts


async def test_knobs_set_by_hand_pause_the_agent_until_resumed(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path) as gw:
        assert gw.tuning is not None
        url = f"http://127.0.0.1:{gw.http_port}"
        async with aiohttp.ClientSession() as http:
            knobs = f"{url}/admin/models/sensor_mlp/knobs"
            async with http.put(knobs, json={"max_batch_size": 4}) as r:
                assert r.status == 200
                assert (await r.json())["tuner"] == "paused"
            assert gw.tuning.agent("sensor_mlp").paused
            tuner = f"{url}/admin/tuner/sensor_mlp"
            async with http.put(tuner, json={"paused": "no"}) as r:
                assert r.status == 400
                assert "paused" in (await r.json())["error"]
            async with http.put(tuner, json={"paused": False}) as r:
                assert r.status == 200
                assert (await r.json())["paused"] is False
            assert not gw.tuning.agent("sensor_mlp").paused
            async with http.get(f"{url}/admin/tuner/vision_cnn") as r:
                assert r.status == 404
                assert "not tuned" in (await r.json())["error"]


async def test_tuner_disabled_answers_so(mlp_repo: Path, tmp_path: Path) -> None:
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        assert gw.tuning is None
        url = f"http://127.0.0.1:{gw.http_port}"
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/admin/tuner") as r:
                assert (await r.json()) == {"enabled": False, "models": {}}
            async with http.get(f"{url}/admin/tuner/sensor_mlp") as r:
                assert r.status == 404


def _agent(gw: Gateway, space: ConfigSpace, **settings: Any) -> ModelAgent:
    agent = ModelAgent(
        gw.service,
        "sensor_mlp",
        space=space,
        slo_ms=100.0,
        cores=2,
        settings=AgentSettings(**{"algorithm": "rrl", **settings}),
    )
    agent.current = space.at(0)
    agent.workload = WorkloadState(5)
    agent.tuner.set_workload(agent.workload)
    return agent


async def test_a_proposal_estimated_to_break_the_slo_is_vetoed(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        agent = _agent(gw, BATCHES)
        small, large = BATCHES.at(0), BATCHES.at(7)  # batch 1 and batch 128
        # Under the previous workload (state 5), batch 128 broke the SLO badly (p95 3x the SLO,
        # all late), and its region (batch 32..128) inherits that estimate.
        agent.tuner.observe(small, measurement(10.0))
        agent.tuner.observe(large, measurement(300.0, violations=100))
        agent.workload = WorkloadState(6)
        agent.tuner.set_workload(agent.workload)  # a new state, warm-started from that table
        first = agent.choose()
        assert first[0] == small  # the warm start's best first
        agent.learn(small, measurement(12.0), first[1], first[2], False)
        # The region phase now wants the centre covering most of batch 8..128: batch 32, whose
        # prior estimate (300 + penalty) is beyond the safety limit (p95 = SLO, half late).
        config, kind, reason = agent.choose()
        assert (config, kind) == (small, "veto")
        assert "batch=32" in reason and "expected to score" in reason
        assert agent.tuner.snapshot()["excluded"] == 1
        assert agent.tuner.propose() != BATCHES.at(5)  # never proposed again in this state


async def test_a_configuration_measured_that_badly_is_left_at_once(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        agent = _agent(gw, TINY)
        good, bad = TINY.at(0), TINY.at(1)
        agent.learn(good, measurement(10.0), "explore", "", False)
        decision = agent.learn(bad, measurement(250.0, violations=80), "explore", "", False)
        assert "safety limit" in decision.reason
        assert agent.choose() == (good, "backoff", "previous configuration broke the SLO badly")
        # A bad measurement of the best known configuration itself arms no back-off.
        agent.learn(good, measurement(10.0), "exploit", "", False)
        assert agent.choose()[1] != "backoff"
        # Within the SLO but over explore_regret (2) times the best known: left at once too.
        agent.learn(bad, measurement(25.0), "explore", "", False)
        assert agent.choose() == (
            good,
            "backoff",
            "previous configuration measured over 2x the best",
        )
        agent.learn(good, measurement(10.0), "exploit", "", False)
        agent.learn(bad, measurement(19.0), "explore", "", False)  # slower, within the limit
        assert agent.choose()[1] != "backoff"


async def test_an_interval_that_drained_a_backlog_is_not_learned(
    mlp_repo: Path, tmp_path: Path
) -> None:
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        agent = _agent(gw, TINY)
        good, bad = TINY.at(0), TINY.at(1)
        agent.learn(good, measurement(10.0), "exploit", "", False)
        # The interval started with 200 queued requests (a state change, an exploration) and
        # ended with 120: it measured the backlog draining, not the configuration.
        decision = agent.learn(
            bad, measurement(240.0, violations=50), "explore", "", False, queued=(200, 120)
        )
        assert decision.kind == "drain" and decision.objective is None
        assert "200 -> 120" in decision.reason
        assert [n for c, _, n in agent.tuner.estimates() if c == bad] == [0]  # not learned
        assert agent.counts["drain"] == 1
        # While the backlog lasts, what drains it keeps running; once it is gone, the tuner
        # decides again.
        agent.current = bad
        assert agent.choose(queued=120) == (bad, "drain", "backlog of 120 requests draining")
        assert agent.choose(queued=3)[1] != "drain"
        # A backlog that does not shrink is what the configuration is worth under this load:
        # learned, and here bad enough to be left at once.
        decision = agent.learn(
            bad, measurement(240.0, violations=50), "explore", "", False, queued=(200, 260)
        )
        assert decision.kind == "explore" and decision.objective is not None
        assert [n for c, _, n in agent.tuner.estimates() if c == bad] == [1]
        assert agent.choose(queued=260) == (
            good,
            "backoff",
            "previous configuration broke the SLO badly",
        )
        # A small queue is no backlog: learned as usual.
        decision = agent.learn(good, measurement(11.0), "backoff", "", False, queued=(6, 0))
        assert decision.kind == "backoff" and decision.objective is not None


async def test_thread_changes_are_paced(mlp_repo: Path, tmp_path: Path) -> None:
    space = ConfigSpace.for_machine(2, max_batch_size=4, max_timeout_ms=1.0)
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        # (explore_regret high: pacing alone is under test here, not the regret back-off)
        agent = _agent(gw, space, min_rebuild_gap_s=60.0, explore_regret=100.0)
        agent.current = space.snap(Config.from_knobs(gw.service.knobs("sensor_mlp")))
        target = Config(4, 1.0, 2 if agent.current.concurrency == 1 else 1, 1, 1)
        rebuilt, applied = await agent._apply(target)  # a real session rebuild
        assert rebuilt and applied == target
        assert gw.service.knobs("sensor_mlp").concurrency == target.concurrency
        assert agent.last_rebuild_s > 0
        # For a minute, every proposal that needs another rebuild waits; the rest may run.
        # While one waits, the best known configuration with the same sessions runs (request-
        # level knobs only): the current one until a better one of those is known.
        kinds = set()
        held = []
        sessions = (target.concurrency, 1, 1)
        for _ in range(30):
            config, kind, _reason = agent.choose()
            kinds.add(kind)
            assert (
                config.concurrency,
                config.intra_op_threads,
                config.inter_op_threads,
            ) == sessions
            if kind == "hold":
                held.append(config)
                measured = [v for c, v, n in agent.tuner.estimates() if n > 0]
                # (every measured configuration has these sessions: none other ran)
                assert config == agent.current or agent.tuner.predict(config) == min(measured)
            agent.learn(config, measurement(5.0 + config.max_batch_size), kind, "", False)
            agent.current = config
        assert "hold" in kinds
        # The last wait ran the best measured (5 + batch size) of its sessions.
        best_measured = min(v for c, v, n in agent.tuner.estimates() if n > 0)
        assert agent.tuner.predict(held[-1]) == best_measured
        # Once the running configuration violates the SLO, a proposal expected to meet it is
        # not held back by the pace: waiting costs the devices more than a rebuild.
        other = Config(1, 0.0, 1 if target.concurrency == 2 else 2, 1, 1)
        agent.tuner.observe(other, measurement(6.0))  # known good, other sessions
        agent.tuner.propose = lambda: other  # type: ignore[method-assign]
        agent.learn(agent.current, measurement(90.0, violations=20), "hold", "", False)
        assert agent.choose() == (other, "exploit", "")
        agent.learn(agent.current, measurement(90.0), "hold", "", False)  # slow, but in the SLO
        assert agent.choose()[1] == "hold"
        # Nor is the first configuration of a new workload state (the tuner's start for it).
        agent._fresh_state = True
        assert agent.choose() == (other, "exploit", "")
