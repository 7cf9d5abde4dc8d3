"""The serving plan of quantized checkpoints: the choice within the budget, every way serving
the trained codes exactly on both runtimes, and the plan where an operator sees it (model
metadata, the load log, ``iotgw inspect``)."""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from models import plan_zoo
from models.backends import load_runtime
from models.checkpoint import save_checkpoint
from models.cli import inspect_main
from models.plan_decisions import PlanDecisions
from models.plan_zoo import with_ways
from models.repository import ModelConfig, ModelVersion
from models.runtime import Threads
from models.serving_plan import (
    Candidate,
    CostCache,
    Option,
    ServingPlan,
    Way,
    choose,
    least_worst,
    make_plan,
    slowdowns,
    weigh,
)
from models.zoo import (
    VISION_CNN,
    Conv2D,
    Dense,
    Flatten,
    Input,
    MaxPool2D,
    ModelSpec,
    init_weights,
    reference_forward,
)
from models.zoo_checkpoint import (
    LayerParams,
    dequantized_weights,
    uniform_policy,
    zoo_checkpoint,
    zoo_params,
)

# Float arithmetic in another order than NumPy's float64 reference (fp32 accumulation, im2col,
# dequantized kernels): the last bits of float32 on these outputs; nothing more.
SUMMATION_TOLERANCE = 1e-5

PLAN_SPEC = ModelSpec(
    name="plan_shapes",
    inputs=(Input("image", (13, 11, 5)),),
    layers=(
        Conv2D(6, 3, stride=2),  # same padding, odd sizes
        Conv2D(20, 1),  # 1x1, K = 6: one short block
        MaxPool2D(2),
        Conv2D(8, 3, padding="valid", activation="linear"),
        Flatten(),
        Dense(12, "relu"),
        Dense(4),
    ),
    seed=4,
)
QUANTIZED = (0, 1, 3, 5, 6)  # the layers with kernels


def _params(spec: ModelSpec, bits: int, block: int) -> list[LayerParams]:
    checkpoint = zoo_checkpoint(spec, init_weights(spec), uniform_policy(bits, block))
    return zoo_params(checkpoint, Path("in-memory"))[1]


def _feed(spec: ModelSpec, rows: int = 6) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {i.name: rng.standard_normal((rows, *i.shape)).astype(np.float32) for i in spec.inputs}


def _cycled(*ways: Way) -> dict[int, Way]:
    return dict(zip(QUANTIZED, itertools.cycle(ways), strict=False))


# Every layer one way, and mixtures that change way (and layout) from layer to layer.
PLANS: dict[str, dict[int, Way]] = {
    "all packed": dict.fromkeys(QUANTIZED, "packed"),
    "all graph": dict.fromkeys(QUANTIZED, "graph"),
    "all load": dict.fromkeys(QUANTIZED, "load"),
    "mixed": dict(zip(QUANTIZED, itertools.cycle(("packed", "graph", "load")), strict=False)),
    "mixed shifted": dict(
        zip(QUANTIZED, itertools.cycle(("load", "packed", "graph")), strict=False)
    ),
}
TF_PLANS = {"all graph": PLANS["all graph"], "all load": PLANS["all load"]}
TF_PLANS["mixed"] = _cycled("graph", "load")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("plan", list(PLANS), ids=str)
def test_every_way_serves_the_trained_codes_on_onnxruntime(plan: str, bits: int) -> None:
    """Whichever way each tensor runs (at accuracy level 0: float activations), ONNX Runtime
    computes the NumPy reference forward of the dequantized codes."""
    import onnxruntime as ort

    from models.export_onnx import build_onnx

    spec, ways = PLAN_SPEC, PLANS[plan]
    params = _params(spec, bits, 16)
    model = build_onnx(spec, with_ways(spec, params, ways), accuracy_level=0, ways=ways)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == sum(w == "packed" for w in ways.values())
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = _feed(spec)
    reference = reference_forward(spec, dequantized_weights(spec, params), feed)
    got = session.run(None, feed)[0]
    np.testing.assert_allclose(got, reference, rtol=0, atol=SUMMATION_TOLERANCE)


@pytest.mark.parametrize("plan", list(TF_PLANS), ids=str)
def test_every_way_serves_the_trained_codes_on_tensorflow(plan: str) -> None:
    from models import tf_env  # noqa: F401  isort: skip
    import tensorflow as tf

    from models.quant_tf import build_graph

    spec, ways = PLAN_SPEC, TF_PLANS[plan]
    params = _params(spec, 4, 16)
    graph = tf.Graph()
    with graph.as_default():
        built = build_graph(spec, with_ways(spec, params, ways))
    feed = _feed(spec)
    with tf.compat.v1.Session(graph=graph) as session:
        session.run(built.init_op, feed_dict=built.init_feed)
        got = session.run(built.output, {built.inputs["image"]: feed["image"]})
    reference = reference_forward(spec, dequantized_weights(spec, params), feed)
    np.testing.assert_allclose(got, reference, rtol=0, atol=SUMMATION_TOLERANCE)


def _brute_force(options: list[list[Option]], budget: float) -> float:
    best = float("inf")
    for pick in itertools.product(*options):
        if sum(o.held_bytes for o in pick) <= budget:
            best = min(best, sum(o.cost for o in pick))
    return best


def test_choice_is_the_fastest_within_the_budget() -> None:
    """Against every combination of random options: the least total time that fits; every
    tensor's smallest way when nothing fits. (Budgets here are whole multiples of the
    knapsack's unit, budget / 4000, so its rounding cannot cost it the optimum.)"""
    rng = np.random.default_rng(0)
    ways: tuple[Way, ...] = ("packed", "graph", "load")
    for _ in range(200):
        options = [
            [_costing(w, float(rng.uniform(0.1, 2)), int(rng.integers(1, 1000))) for w in ways]
            for _ in range(int(rng.integers(1, 6)))
        ]
        budget = float(400 * rng.integers(0, 8))
        chosen = choose(options, budget)
        picked = [
            next(o for o in opts if o.way == w) for opts, w in zip(options, chosen, strict=True)
        ]
        best = _brute_force(options, budget)
        if best == float("inf"):
            smallest = [min(opts, key=lambda o: (o.held_bytes, o.cost)) for opts in options]
            assert picked == smallest
        else:
            assert sum(o.held_bytes for o in picked) <= budget
            assert sum(o.cost for o in picked) == pytest.approx(best)


def _costing(way: Way, cost: float, held_bytes: int) -> Option:
    return Option(way, (cost,), held_bytes, cost)


def test_the_plan_kept_is_the_least_slow_at_its_slowest_batch_size() -> None:
    """Against every combination of random options at three batch sizes: the plan kept is never
    slower at its slowest size than the plan that weighs the sizes alike, is within the budget,
    and is strictly better in some instances (the reweighting does something)."""
    rng = np.random.default_rng(1)
    ways: tuple[Way, ...] = ("packed", "graph", "load")
    better = 0
    for _ in range(200):
        options = [
            [
                Option(
                    w, tuple(float(x) for x in rng.uniform(0.1, 2, 3)), int(rng.integers(1, 1000))
                )
                for w in ways
            ]
            for _ in range(int(rng.integers(2, 6)))
        ]
        budget = float(400 * rng.integers(1, 8))
        alike = choose(weigh(options), budget)
        weighed, kept = least_worst(options, budget)
        assert kept == choose(weighed, budget)
        picked = [
            next(o for o in opts if o.way == w) for opts, w in zip(options, kept, strict=True)
        ]
        held = sum(o.held_bytes for o in picked)
        if held > budget:  # nothing fits: every tensor's smallest way, whatever the weights
            assert kept == alike
            continue
        worst, worst_alike = max(slowdowns(options, kept)), max(slowdowns(options, alike))
        assert worst <= worst_alike + 1e-9
        better += worst < worst_alike - 1e-9
    assert better > 0


def test_the_plan_weighs_every_batch_size_alike() -> None:
    """Two layers whose packed kernel wins at batch 1 and loses at batch 32 (as int4
    convolutions do), with room for one float layer: by batch 1 alone both would run packed and
    the large layer's batch-32 time decide nothing; weighed over 1, 8 and 32 the large layer,
    whose packed kernel costs most at 32, runs in float, and the small one packed."""
    mb = 1_000_000
    small = (Option("packed", (1.0, 3.0, 10.0), mb), Option("load", (1.5, 3.0, 8.0), 8 * mb))
    large = (Option("packed", (2.0, 8.0, 40.0), mb), Option("load", (3.0, 8.0, 25.0), 8 * mb))
    candidates = [
        Candidate(f"layers.{i}.weight", i, (2, 2), 4, 32, opts)
        for i, opts in enumerate((small, large))
    ]
    by_batch_one = [
        Candidate(
            c.name,
            c.layer,
            c.shape,
            c.bits,
            c.block_size,
            tuple(Option(o.way, o.seconds[:1], o.held_bytes) for o in c.options),
        )
        for c in candidates
    ]

    def plan_of(chosen_from: list[Candidate]) -> ServingPlan:
        return make_plan(
            "onnxruntime", chosen_from, budget=0.6, fp32_bytes=16 * mb, float_bytes=0, measured=0
        )

    assert plan_of(by_batch_one).ways() == {0: "packed", 1: "packed"}
    plan = plan_of(candidates)
    assert plan.ways() == {0: "packed", 1: "load"}
    # Each size counts as a share of the fastest mix's time at that size.
    large_load = plan.tensors[1].chosen
    assert large_load.cost == pytest.approx(3.0 / 3.0 + 8.0 / 11.0 + 25.0 / 33.0)
    doc = plan.as_doc()["tensors"][1]["options"]["load"]
    assert doc["ms"] == {"1": 3000.0, "8": 8000.0, "32": 25000.0}


def _version(path: Path, runtime: str, budget: float, cache: Path) -> ModelVersion:
    config = ModelConfig.model_validate(
        {
            "runtime": runtime,
            "path": path.name,
            "format": "checkpoint",
            "weight_memory_budget": budget,
        }
    )
    return ModelVersion("cnn", 1, path.parent, config, plan_cache_dir=cache)


@pytest.fixture(name="cnn_int4", scope="module")
def _cnn_int4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    checkpoint = zoo_checkpoint(VISION_CNN, init_weights(VISION_CNN), uniform_policy(4, 128))
    return save_checkpoint(checkpoint, tmp_path_factory.mktemp("cnn") / "model.safetensors")


@pytest.mark.parametrize("runtime", ["onnxruntime", "tensorflow"])
def test_plan_in_metadata_logged_once_and_cached(
    runtime: str, cnn_int4: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The plan is in the loaded model's metadata, within its budget, logged (at DEBUG: detail)
    at the first load only; its costs are cached in the folder, so a new cache over the same folder
    measures nothing."""
    cache = tmp_path / "plans"
    # TensorFlow's graph way holds a float chunk beside the codes (models.plan_tf), more than
    # the whole of vision_cnn's small kernels: at 0.5 nothing fits there.
    budget = 0.5 if runtime == "onnxruntime" else 1.0
    caplog.set_level(logging.DEBUG, logger="models.plan")
    first = load_runtime(_version(cnn_int4, runtime, budget, cache), Threads(1, 1))
    plan = first.metadata.serving_plan
    first.close()
    assert plan is not None and plan.within_budget and plan.budget == budget
    assert plan.measured > 0 and (cache / "plan-costs.json").is_file()
    assert {t.layer for t in plan.tensors} == {0, 1, 2, 4, 5, 7, 8, 11, 12}
    lines = [r for r in caplog.records if "serving plan" in r.msg]
    assert [r.levelno for r in lines] == [logging.DEBUG]
    assert "of their float32 size (within the limit of" in lines[0].getMessage()
    caplog.clear()
    again = load_runtime(_version(cnn_int4, runtime, budget, cache), Threads(1, 1))
    assert again.metadata.serving_plan is not None
    assert again.metadata.serving_plan.ways() == plan.ways()
    again.close()
    assert not [r for r in caplog.records if "serving plan" in r.msg]
    cached = CostCache(cache)
    assert all(
        cached.get(k) is not None for k in json.loads((cache / "plan-costs.json").read_text())
    )


def _loaded_plan(version: ModelVersion) -> ServingPlan:
    rt = load_runtime(version, Threads(1, 1))
    rt.close()
    assert rt.metadata.serving_plan is not None
    return rt.metadata.serving_plan


def test_a_plan_once_chosen_is_kept_whatever_later_timings_say(
    cnn_int4: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two loads of one model (another process, a restart) that measure different costs still
    run the same ways: the first choice is kept in the folder. Without it, the second load
    follows its own costs (the check below would fail)."""
    monkeypatch.setattr(CostCache, "_memory", {})
    monkeypatch.setattr(PlanDecisions, "_memory", {})
    cache = tmp_path / "plans"
    version = _version(cnn_int4, "onnxruntime", 1.0, cache)
    first = _loaded_plan(version)
    assert not first.kept and (cache / "plans.json").is_file()
    # Later timings say otherwise: one small way is now by far the fastest everywhere.
    fastest = "graph" if any(t.way != "graph" for t in first.tensors) else "packed"
    costs_file = cache / "plan-costs.json"
    costs = json.loads(costs_file.read_text())
    costs = {k: 1e-6 if json.loads(k)[-1]["way"] == fastest else 1.0 for k in costs}
    costs_file.write_text(json.dumps(costs))
    monkeypatch.setattr(CostCache, "_memory", {})
    monkeypatch.setattr(PlanDecisions, "_memory", {})  # as a new process sees it
    again = _loaded_plan(version)
    assert again.kept and again.ways() == first.ways()
    assert "kept from an earlier load" in again.summary()
    (cache / "plans.json").unlink()  # an operator asks for a new choice
    monkeypatch.setattr(PlanDecisions, "_memory", {})
    chosen_anew = _loaded_plan(version)
    assert not chosen_anew.kept and chosen_anew.ways() != first.ways()
    assert fastest in set(chosen_anew.ways().values())


def test_budget_zero_keeps_every_tensor_quantized(cnn_int4: Path, tmp_path: Path) -> None:
    rt = load_runtime(_version(cnn_int4, "onnxruntime", 0.0, tmp_path), Threads(1, 1))
    plan = rt.metadata.serving_plan
    rt.close()
    assert plan is not None
    assert all(t.way in ("packed", "graph") for t in plan.tensors)
    assert plan.memory_ratio < 0.2


def test_cost_cache_is_keyed_by_runtime_version_and_survives_damage(tmp_path: Path) -> None:
    what: Mapping[str, object] = {"layer": "Dense", "way": "load"}
    assert CostCache.key("onnxruntime", "1.1", what) != CostCache.key("onnxruntime", "1.2", what)
    (tmp_path / "plan-costs.json").write_text("{not json")
    cache = CostCache(tmp_path)
    assert cache.get(CostCache.key("onnxruntime", "1.1", what)) is None
    cache.put("k", 0.5)
    cache.save()
    assert CostCache(tmp_path).get("k") == 0.5


def test_inspect_shows_the_plan(
    cnn_int4: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [str(cnn_int4), "--plan", "onnxruntime", "--cache-dir", str(tmp_path)]
    assert inspect_main(args) == 0
    out = capsys.readouterr().out
    assert "serving plan on onnxruntime" in out and "layers.11.weight" in out
    assert inspect_main([*args, "--json", "--weight-memory-budget", "0"]) == 0
    doc = json.loads(capsys.readouterr().out)
    plan = doc["serving_plan"]
    assert plan["budget"] == 0 and len(plan["tensors"]) == 9
    assert {t["way"] for t in plan["tensors"]} <= {"packed", "graph"}


# -- the device the plan is measured on -----------------------------------------------------------

# The small model of these tests, one way per layer measured: a plan in a second or two.
DEVICE_SPEC = ModelSpec(
    name="plan_device",
    inputs=(Input("features", (32,)),),
    layers=(Dense(16, "relu"), Dense(4)),
    seed=5,
)


def _measured_keys(folder: Path) -> set[str]:
    return set(json.loads((folder / "plan-costs.json").read_text()))


def _time_every_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way timed at every planned batch size. The planner skips a way that was far slower
    at the size before, and which ways that skips depends on the timings, so two passes could
    measure different counts on a busy machine; these tests count the figures each pass
    measured, so nothing may be skipped on speed."""
    monkeypatch.setattr(plan_zoo, "UNTIMED_BEYOND", float("inf"))


# ONNX Runtime warns that the CPU build has no CUDA provider: the request is the point here.
@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_onnx_plan_is_measured_on_the_providers_the_model_serves_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache of CPU figures never answers for a GPU build of onnxruntime: the plan is measured
    again with CUDA requested, as the serving sessions request it, and keyed by it."""
    import onnxruntime as ort

    from models.backends.devices import CPU_PROVIDER, CUDA_PROVIDER
    from models.plan_onnx import onnx_plan

    _time_every_way(monkeypatch)
    params = _params(DEVICE_SPEC, 4, 16)
    cpu = CostCache(tmp_path)
    onnx_plan(DEVICE_SPEC, params, budget=1.0, accuracy_level=4, cache=cpu)
    assert cpu.measured > 0
    cpu_keys = _measured_keys(tmp_path)
    assert all(f'"providers": ["{CPU_PROVIDER}"]' in key for key in cpu_keys)

    monkeypatch.setattr(ort, "get_available_providers", lambda: [CUDA_PROVIDER, CPU_PROVIDER])
    gpu = CostCache(tmp_path)
    onnx_plan(DEVICE_SPEC, params, budget=1.0, accuracy_level=4, cache=gpu)
    assert gpu.measured == cpu.measured  # every figure measured again, none read from the CPU's
    gpu_keys = _measured_keys(tmp_path) - cpu_keys
    assert len(gpu_keys) == len(cpu_keys)
    assert all(f'"providers": ["{CUDA_PROVIDER}", "{CPU_PROVIDER}"]' in key for key in gpu_keys)


def test_tensorflow_plan_is_keyed_by_the_device_it_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from models import tf_env  # noqa: F401  isort: skip
    import tensorflow as tf

    from models.plan_tf import tf_plan

    _time_every_way(monkeypatch)
    params = _params(DEVICE_SPEC, 4, 16)
    cpu = CostCache(tmp_path)
    tf_plan(DEVICE_SPEC, params, budget=1.0, cache=cpu)
    cpu_keys = _measured_keys(tmp_path)
    assert cpu_keys and all('"device": "cpu"' in key for key in cpu_keys)

    # A TensorFlow that lists a GPU (soft placement runs the ops on this machine's CPU).
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind=None: ["GPU:0"])
    gpu = CostCache(tmp_path)
    tf_plan(DEVICE_SPEC, params, budget=1.0, cache=gpu)
    assert gpu.measured == cpu.measured
    gpu_keys = _measured_keys(tmp_path) - cpu_keys
    assert gpu_keys and all('"device": "cuda:0"' in key for key in gpu_keys)
