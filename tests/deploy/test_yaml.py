"""Every YAML file under deploy/ through yamllint (tests/deploy/yamllint.yaml: its defaults, the
project's line length): syntax, duplicate keys (which PyYAML and Grafana's loader would settle
silently, the last one winning), indentation, truthy values that YAML 1.1 reads as booleans. For
the Grafana provisioning files, which have no published schema, this is the only check of the
file itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.deploy.conftest import DEPLOY, program

CONFIG = Path(__file__).with_name("yamllint.yaml")
YAML_FILES = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])


def yamllint(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            program("yamllint"),
            "--strict",
            "--format",
            "parsable",
            "-c",
            str(CONFIG),
            *map(str, paths),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_every_yaml_file_passes_yamllint() -> None:
    assert len(YAML_FILES) >= 10  # compose, Prometheus, Grafana provisioning, Kubernetes
    result = yamllint(*YAML_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


def test_yamllint_rejects_a_duplicate_key(tmp_path: Path) -> None:
    source = DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml"
    broken = tmp_path / "prometheus.yaml"
    text = source.read_text()
    broken.write_text(text.replace("    url: ", "    url: http://elsewhere:9090\n    url: ", 1))
    result = yamllint(broken)
    assert result.returncode != 0
    assert 'duplication of key "url"' in result.stdout
