"""``iotgw train --serve-dir <repo>/<model>/<version>`` writes a folder the gateway serves as it
is (docs/training.md), and a checkpoint in a folder whose config.toml lacks
``format = "checkpoint"`` is refused with a message naming that key."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from models.repository import CONFIG_FILE, BrokenVersion, ModelVersion, scan_repository
from models.train.cli import main as train
from models.train.data import load_digits_split
from tests.gateway.helpers import base_url, json_request, running_gateway

QUICK = ["--max-steps", "2", "--nodes", "1", "--per-node", "2", "--micro-batch", "4"]


@pytest.fixture(scope="module")
def served_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("train") / "repo"
    assert train([*QUICK, "--no-progress", "--serve-dir", str(repo / "digits" / "1")]) == 0
    return repo


async def test_serve_dir_is_served_by_the_gateway(served_repo: Path, tmp_path: Path) -> None:
    (version,) = scan_repository(served_repo)
    assert isinstance(version, ModelVersion), version
    assert version.config.format == "checkpoint" and version.config.runtime == "onnxruntime"
    images = load_digits_split().test.x[:4]
    async with (
        running_gateway(served_repo, tmp_path / "cache") as gw,
        aiohttp.ClientSession() as client,
    ):
        body = json_request({"image": images})
        async with client.post(f"{base_url(gw)}/v2/models/digits/infer", json=body) as reply:
            assert reply.status == 200, await reply.text()
            (out,) = (await reply.json())["outputs"]
    assert out["shape"] == [4, 10]
    np.testing.assert_allclose(np.asarray(out["data"]).reshape(4, 10).sum(axis=1), 1, rtol=1e-4)


def test_serve_dir_without_a_version_is_refused_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert train([*QUICK, "--serve-dir", str(tmp_path / "repo" / "digits")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "<repo>/<model>/<version>" in err[0], err
    assert not (tmp_path / "repo").exists()


def test_a_checkpoint_without_format_names_the_key(served_repo: Path, tmp_path: Path) -> None:
    target = tmp_path / "repo" / "digits" / "1"
    target.mkdir(parents=True)
    shutil.copy(served_repo / "digits" / "1" / "model.safetensors", target)
    (target / CONFIG_FILE).write_text('runtime = "onnxruntime"\npath = "model.safetensors"\n')
    (found,) = scan_repository(tmp_path / "repo")
    assert isinstance(found, BrokenVersion)
    assert 'add format = "checkpoint" to' in found.reason and str(target) in found.reason
    # The same file under another name is recognised by its content.
    (target / "model.safetensors").rename(target / "weights.bin")
    (target / CONFIG_FILE).write_text('runtime = "tensorflow"\npath = "weights.bin"\n')
    (found,) = scan_repository(tmp_path / "repo")
    assert isinstance(found, BrokenVersion) and 'format = "checkpoint"' in found.reason
