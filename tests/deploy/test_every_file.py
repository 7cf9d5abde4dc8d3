"""Which test validates each file under deploy/, and with what: a file added there fails here
until a validator covers it. yamllint (test_yaml.py) reads every YAML file besides."""

from __future__ import annotations

from fnmatch import fnmatch

from tests.deploy.conftest import DEPLOY

VALIDATED = {
    "compose.yaml": "test_compose.py: the compose-spec schema (check-jsonschema)",
    "prometheus/prometheus.yml": "test_prometheus.py: promtool check config",
    "grafana/dashboards/*.json": "test_grafana_schema.py: Grafana 11.3's dashboard model",
    # No published schema: yamllint, and the datasource uid and dashboard path are checked
    # against the compose file and the dashboard.
    "grafana/provisioning/*/*.yaml": "test_yaml.py, test_compose.py",
    "k8s/base/*.yaml": "test_kubernetes.py: kustomize, then the Kubernetes schemas",
    "k8s/overlays/*/*.yaml": "test_kubernetes.py: kustomize, then the Kubernetes schemas",
    "k8s/monitoring/servicemonitor.yaml": "test_kubernetes.py: the prometheus-operator CRD",
    "mosquitto/mosquitto.conf": "test_mosquitto.py: a real Mosquitto loads it",
    "mosquitto/broker.conf": "test_mosquitto.py: a real Mosquitto loads it",
    "mosquitto/acl": "test_mosquitto.py: a real Mosquitto loads it",
}
NOT_CONFIGURATION = {"mosquitto/README.md", "secrets/.gitignore"}


def test_every_file_under_deploy_has_a_validator() -> None:
    files = {
        str(path.relative_to(DEPLOY))
        for path in DEPLOY.rglob("*")
        # deploy/secrets holds the operator's secrets (git-ignored), made at deployment.
        if path.is_file() and (path.parent.name != "secrets" or path.name == ".gitignore")
    }
    unchecked = {
        name
        for name in files - NOT_CONFIGURATION
        if not any(fnmatch(name, pattern) for pattern in VALIDATED)
    }
    assert not unchecked, f"files under deploy/ that no test validates: {sorted(unchecked)}"
    assert all(any(fnmatch(name, p) for name in files) for p in VALIDATED), "stale patterns"
