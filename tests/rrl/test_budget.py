"""The joint core budget: one coordinator for the cores the tuned models share. On a live gateway
serving two models under load, the agents never hold more threads together than the budget;
and a model whose candidate the budget holds back gets the cores another model yields."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.main import Gateway
from gateway.settings import GatewaySettings
from gateway.tuning import TunedService
from rrl.budget import CoreBudget, threads_of
from rrl.decisions import Decision, Step
from rrl.online import AgentSettings, ModelAgent
from rrl.space import Config, ConfigSpace
from tests.rrl.live import DEADLINE_US, hand_built_agent, measurement

GRID = ConfigSpace.for_machine(2, max_batch_size=16, max_timeout_ms=2.0)
MODELS = ("sensor_mlp", "sensor_fusion")


@pytest.fixture(name="two_models", scope="module")
def _two_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from models.demo import DEMO_MODELS, VERSION, write_model_version

    root = tmp_path_factory.mktemp("two-models")
    for demo in DEMO_MODELS:
        if demo.name in MODELS:
            write_model_version(demo, root / demo.name / str(VERSION))
    return root


@contextlib.asynccontextmanager
async def serving(repo: Path, tmp: Path) -> AsyncIterator[Gateway]:
    settings = GatewaySettings.load(
        http={"port": 0, "host": "127.0.0.1"},
        serving={"model_repo": repo, "cache_dir": tmp / "cache"},
        mqtt={"enabled": False},
        tuner={"enabled": False},
    )
    gw = Gateway(settings)
    await gw.start(wait_ready=True)
    try:
        yield gw
    finally:
        await gw.stop()


async def load(url: str, model: str, rate_per_s: float, seconds: float) -> dict[int, int]:
    """Poisson requests of one all-zero row of the model's input (generous deadline)."""
    import aiohttp
    import numpy as np

    statuses: dict[int, int] = {}
    rng = np.random.default_rng(hash(model) % 1000)
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/v2/models/{model}") as r:
            specs = (await r.json())["inputs"]
        inputs = []
        for spec in specs:  # one all-zero row of every input
            shape = [1, *[int(d) for d in spec["shape"][1:]]]
            inputs.append({**spec, "shape": shape, "data": [0.0] * int(np.prod(shape))})
        body = {"inputs": inputs, "parameters": {"timeout": DEADLINE_US}}

        async def one() -> None:
            async with http.post(f"{url}/v2/models/{model}/infer", json=body) as r:
                await r.read()
                statuses[r.status] = statuses.get(r.status, 0) + 1

        tasks = []
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one()))
            await asyncio.sleep(float(rng.exponential(1.0 / rate_per_s)))
        await asyncio.gather(*tasks)
    return statuses


@pytest.mark.slow
async def test_two_agents_never_hold_more_threads_than_the_budget(
    two_models: Path, tmp_path: Path
) -> None:
    budget = CoreBudget(2)
    held: dict[str, int] = {}
    totals: list[int] = []

    def listen(decision: Decision, agent: ModelAgent) -> None:
        held[agent.model] = threads_of(decision.config)
        totals.append(sum(held.values()))

    async with serving(two_models, tmp_path) as gw:
        url = f"http://127.0.0.1:{gw.http_port}"
        agents = [
            ModelAgent(
                TunedService(gw.service),
                model,
                space=GRID,
                slo_ms=100.0,
                cores=2,
                settings=AgentSettings(start=Config(8, 0.0, 1, 1, 1), min_requests=30),
                listener=listen,
                budget=budget,
            )
            for model in MODELS
        ]
        tasks = [asyncio.create_task(a.run()) for a in agents]
        try:
            await asyncio.gather(*(asyncio.wait_for(a.started.wait(), 60) for a in agents))
            results = await asyncio.gather(
                load(url, MODELS[0], 150, 10), load(url, MODELS[1], 60, 10)
            )
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        knobs = [Config.from_knobs(gw.service.knobs(m)) for m in MODELS]
    for statuses in results:
        assert set(statuses) == {200}, statuses
    assert totals and max(totals) <= 2, totals
    assert sum(threads_of(k) for k in knobs) <= 2
    assert all(any(d.measurement is not None for d in a.history) for a in agents)


async def test_a_held_back_model_gets_the_cores_another_yields(
    mlp_repo: Path, tmp_path: Path
) -> None:
    from tests.rrl.live import gateway

    budget = CoreBudget(4)  # four cores to share, whatever this machine has
    async with gateway(mlp_repo, tmp_path, enabled=False) as gw:
        busy = hand_built_agent(gw, GRID, "busy", gate_every_s=0.0)
        quiet = hand_built_agent(gw, GRID, "quiet", gate_every_s=0.0)
        busy.budget = quiet.budget = budget
        one, three = Config(4, 0.0, 1, 1, 1), Config(4, 0.0, 3, 1, 1)
        busy.current = busy.incumbent = one
        quiet.current = quiet.incumbent = three
        # The busy model: one instance at 20 ms a batch cannot keep up with 100 requests/s;
        # two would. The quiet one: 5 requests/s on three instances.
        busy.queue_model.observe_service((1, 1), {1: [0.02], 4: [0.021]})
        busy.queue_model.observe_service((2, 1), {1: [0.001], 4: [0.0012]})
        quiet.queue_model.observe_service((3, 1), {1: [0.001], 4: [0.0012]})
        for agent, arrivals in ((busy, 300), (quiet, 15)):
            agent.monitor.update(time.monotonic() - 3.0, 0)
            agent.monitor.update(time.monotonic(), arrivals)
            for _ in range(3):  # windows that prove the model's error
                agent.learn(Step(Config(4, 0.0, 2, 1, 1), "exploit"), measurement(2.0, n=30))
        budget.report("busy", one, 100.0)
        budget.report("quiet", three, 5.0)
        assert (budget.allowance("busy"), budget.allowance("quiet")) == (3, 1)
        # Two instances would clear the gate, but the quiet model holds three of the four cores.
        step = busy.choose()
        assert step.config == one and "core budget holds it back" in step.reason
        assert budget.as_dict()["wants"] == {"busy": 2}
        # The quiet model is asked to come down to its allowance: one thread, within the SLO.
        step = quiet.choose()
        assert step.kind == "yield" and threads_of(step.config) == 1, step
        for _ in range(2):  # its paired windows: within the SLO, so kept
            decision = quiet.learn(Step(step.config, "yield"), measurement(3.0))
        assert "cores yielded" in decision.reason and quiet.incumbent == step.config
        # Now the busy model may take two instances.
        step = busy.choose()
        assert step.kind == "explore" and step.config.concurrency == 2, step


async def test_several_tuned_models_start_from_their_share_of_the_cores(
    two_models: Path, tmp_path: Path
) -> None:
    from models.machine import usable_cores
    from rrl.space import expert_default
    from tests.rrl.live import gateway

    async with gateway(two_models, tmp_path, models=None) as gw:
        tuning = gw.tuning
        assert tuning is not None and tuning._budget is not None
        assert set(tuning.agents) == set(MODELS)
        agents = list(tuning.agents.values())
        await asyncio.gather(*(asyncio.wait_for(a.started.wait(), 60) for a in agents))
        share = max(1, usable_cores() // len(MODELS))
        started = {}
        for agent in agents:
            expected = agent.space.snap(expert_default(share, agent.space.batch_sizes[-1]))
            knobs = Config.from_knobs(gw.service.knobs(agent.model))
            assert knobs == agent.incumbent == expected, (agent.model, knobs, expected)
            started[agent.model] = threads_of(expected)
        # Each model's expert default for its half: together within the cores (on a machine
        # of at least two), and what the joint budget holds for them.
        assert sum(started.values()) <= max(usable_cores(), len(MODELS)), started
        assert tuning._budget.as_dict()["claims"] == started
