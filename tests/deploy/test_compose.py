"""deploy/compose.yaml against the compose-spec schema (the copy check-jsonschema ships), and
what it points at: the files it mounts exist, its settings are the gateway's, Prometheus scrapes
every gateway replica, Grafana's provisioning finds the dashboard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway.settings.schema import GatewaySettings, GrpcSettings
from tests.deploy.conftest import DEPLOY, load_one

COMPOSE = DEPLOY / "compose.yaml"
SCHEMA = "vendor.compose-spec"  # the copy of the compose-spec schema check-jsonschema ships


def check_compose_spec(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", SCHEMA, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_compose_file_meets_the_compose_spec() -> None:
    result = check_compose_spec(COMPOSE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_spec_rejects_a_misspelt_key(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("stop_grace_period:", "stop_grace_perod:"))
    result = check_compose_spec(broken)
    assert result.returncode != 0
    assert "stop_grace_perod" in result.stdout + result.stderr


def _gateways(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if name.startswith("gateway-")}


def test_mounted_files_exist_and_secrets_live_under_secrets() -> None:
    compose = load_one(COMPOSE)
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"
    for name, secret in compose["secrets"].items():
        assert secret["file"].startswith("./secrets/"), name  # git-ignored, made by the operator


def test_two_replicas_with_stable_ids_on_one_shared_subscription() -> None:
    gateways = _gateways(load_one(COMPOSE))
    assert len(gateways) == 2
    ids = {g["environment"]["IOTGW_MQTT__CLIENT_ID"] for g in gateways.values()}
    assert len(ids) == 2  # one broker session each
    for name, g in gateways.items():
        env = g["environment"]
        assert env["IOTGW_MQTT__SHARED_SUBSCRIPTION"] == "on", name
        assert env["IOTGW_MQTT__USERNAME"] == env["IOTGW_MQTT__CLIENT_ID"], name
        assert not any(k.endswith(("TOKEN", "PASSWORD")) for k in env), "secrets only from files"


@pytest.mark.parametrize("service", ["gateway-1", "gateway-2"])
def test_gateway_environment_names_real_settings(service: str) -> None:
    env = load_one(COMPOSE)["services"][service]["environment"]
    for name in env:
        section, _, field = name.removeprefix("IOTGW_").lower().partition("__")
        model = GatewaySettings.model_fields[section].annotation
        assert model is not None and field in model.model_fields, name


def test_prometheus_scrapes_every_replica_with_the_metrics_token() -> None:
    compose = load_one(COMPOSE)
    config = load_one(DEPLOY / "prometheus" / "prometheus.yml")
    (job,) = config["scrape_configs"]
    targets = {t for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{name}:8080" for name in _gateways(compose)}
    assert job["authorization"]["credentials_file"] == "/run/secrets/iotgw_metrics_token"
    assert "iotgw_metrics_token" in compose["services"]["prometheus"]["secrets"]


def test_every_replica_publishes_its_http_and_grpc_ports_on_host_ports_of_its_own() -> None:
    host_ports: list[int] = []
    for service in _gateways(load_one(COMPOSE)).values():
        ports = {int(p.split(":")[1]): int(p.split(":")[0]) for p in service["ports"]}
        # The container's own ports: HTTP's and gRPC's defaults (neither is set in the file).
        assert set(ports) == {GatewaySettings().http.port, GrpcSettings().port}, service["ports"]
        host_ports += ports.values()
    assert len(host_ports) == len(set(host_ports)), host_ports


def test_grafana_provisioning_finds_the_dashboard_and_its_datasource() -> None:
    provisioning = DEPLOY / "grafana" / "provisioning"
    (source,) = load_one(provisioning / "datasources" / "prometheus.yaml")["datasources"]
    (provider,) = load_one(provisioning / "dashboards" / "iotgw.yaml")["providers"]
    mounts = load_one(COMPOSE)["services"]["grafana"]["volumes"]
    assert f"./grafana/dashboards:{provider['options']['path']}:ro" in mounts
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "iotgw.json").read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert variable["current"]["value"] == source["uid"]
