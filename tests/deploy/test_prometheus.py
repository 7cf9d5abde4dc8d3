"""deploy/prometheus/prometheus.yml through promtool (Prometheus' own checker, from Debian's
prometheus package; the test command installs it). ``--syntax-only``: every field is parsed
as Prometheus parses it (an unknown field is an error), but the files it names are not opened:
the metrics token exists only inside the Prometheus container (test_compose.py checks that the
compose file mounts it there)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.deploy.conftest import DEPLOY, program

CONFIG = DEPLOY / "prometheus" / "prometheus.yml"


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [program("promtool"), "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_prometheus_config_passes_promtool() -> None:
    result = promtool_check(CONFIG)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_rejects_a_misspelt_field(tmp_path: Path) -> None:
    broken = tmp_path / "prometheus.yml"
    broken.write_text(CONFIG.read_text().replace("metrics_path:", "metric_path:"))
    result = promtool_check(broken)
    assert result.returncode != 0
    assert "field metric_path not found" in result.stdout + result.stderr
