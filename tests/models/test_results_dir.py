"""Where results files go without ``--out``: ``$IOTGW_RESULTS_DIR``, else the checkout's
``benchmarks/results`` (running from a checkout), else ``./iotgw-results`` for an installed
package, never its own folder in site-packages."""

from __future__ import annotations

from pathlib import Path

import pytest

from models import reporting


def test_the_environment_names_the_folder(tmp_path: Path) -> None:
    assert reporting.default_results_dir({"IOTGW_RESULTS_DIR": str(tmp_path)}) == tmp_path
    assert reporting.results_path("x", quick=True, out_dir=tmp_path) == tmp_path / "x.quick.json"


def test_a_checkout_writes_into_its_benchmarks_results() -> None:
    assert reporting.default_results_dir({}) == reporting.RESULTS_DIR  # this is a checkout
    assert reporting.RESULTS_DIR.parents[1].joinpath("pyproject.toml").is_file()


def test_an_installed_package_writes_into_the_working_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As installed: the package's parent (site-packages) holds no pyproject.toml.
    site = tmp_path / "site-packages" / "benchmarks" / "results"
    monkeypatch.setattr(reporting, "RESULTS_DIR", site)
    monkeypatch.chdir(tmp_path)
    assert reporting.default_results_dir({}) == tmp_path / "iotgw-results"
    path = reporting.write_results(
        "probe", quick=True, out_dir=None, machine={}, summary={}, runs=[], config={}
    )
    assert path == tmp_path / "iotgw-results" / "probe.quick.json" and path.is_file()
    assert not site.exists()
