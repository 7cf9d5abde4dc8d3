"""deploy/k8s against the Kubernetes schemas that kubernetes-validate ships (strict: unknown
fields are errors), for the base and for the GPU overlay rendered the way kustomize renders it
(its resources, then its RFC 6902 patches applied with jsonpatch). The ServiceMonitor is a CRD of
the Prometheus Operator, for which no schema ships offline: its metadata, selector and secret
reference are validated against Kubernetes' own ObjectMeta, LabelSelector and SecretKeySelector
schemas; its endpoint fields are not schema-checked."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonpatch
import jsonschema
import kubernetes_validate
import pytest
import yaml
from referencing import Registry, Resource

from gateway.settings import ServingSettings
from tests.deploy.conftest import DEPLOY, load_all, load_one

K8S = DEPLOY / "k8s"
KUBERNETES_VERSION = "1.30"  # the oldest version still in upstream support when written
_KUSTOMIZATION_KEYS = {"apiVersion", "kind", "resources", "patches"}


def render(folder: Path) -> list[dict[str, Any]]:
    """The manifests of a kustomization using only ``resources`` and JSON 6902 ``patches``
    (any other key fails, so nothing is silently left out)."""
    kustomization = load_one(folder / "kustomization.yaml")
    unknown = set(kustomization) - _KUSTOMIZATION_KEYS
    assert not unknown, f"{folder}: kustomization keys this renderer does not apply: {unknown}"
    docs: list[dict[str, Any]] = []
    for entry in kustomization["resources"]:
        path = folder / entry
        docs += render(path) if path.is_dir() else load_all(path)
    for patch in kustomization.get("patches", []):
        ops = jsonpatch.JsonPatch(yaml.safe_load((folder / patch["path"]).read_text()))
        target = patch["target"]
        matched = [
            i
            for i, d in enumerate(docs)
            if d["kind"] == target["kind"] and d["metadata"]["name"] == target["name"]
        ]
        assert matched, f"{folder}: patch target {target} matches nothing"
        for i in matched:
            docs[i] = ops.apply(docs[i])
    return docs


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
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
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


def _core_validator(schema_file: str) -> jsonschema.Draft202012Validator:
    """A validator for one Kubernetes type, from kubernetes-validate's strict schemas."""
    folder = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    strict = folder / f"v{kubernetes_validate.latest_version()}-local-strict"
    schema = json.loads((strict / schema_file).read_text())
    definitions = json.loads((strict / "_definitions.json").read_text())
    registry = Resource.from_contents(definitions) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.Draft202012Validator(schema, registry=registry)


def test_service_monitor_core_parts_and_selection() -> None:
    monitor = load_one(K8S / "monitoring" / "servicemonitor.yaml")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["kind"] == "ServiceMonitor"
    _core_validator("objectmeta-meta-v1.json").validate(monitor["metadata"])
    _core_validator("labelselector-meta-v1.json").validate(monitor["spec"]["selector"])
    (endpoint,) = monitor["spec"]["endpoints"]
    _core_validator("secretkeyselector-v1.json").validate(endpoint["bearerTokenSecret"])
    # It selects the client Service (one target per pod), not the headless one as well.
    services = [d for d in render(K8S / "base") if d["kind"] == "Service"]
    wanted = monitor["spec"]["selector"]["matchLabels"].items()
    selected = [s for s in services if wanted <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["iotgw"]
    (port,) = selected[0]["spec"]["ports"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"


def test_validator_rejects_a_broken_manifest() -> None:
    """The schemas are really applied: a misspelt field fails."""
    sts = _statefulset("base")
    sts["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, KUBERNETES_VERSION, strict=True)
