"""``iotgw serve --model-repo <checkpoint file>`` serves that one checkpoint with no folder
layout or config.toml written by hand (docs/quantized-checkpoints.md): a one-model repository
in the cache folder whose version links to the file."""

from __future__ import annotations

import shutil
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from gateway.lifecycle import StartupError
from gateway.main import Gateway
from models.repository import (
    CHECKPOINT_REPOS,
    CONFIG_FILE,
    ModelVersion,
    RepositoryError,
    checkpoint_repository,
    scan_repository,
)
from models.train.data import load_digits_split
from models.train.demo_weights import TRAINED_FILES, WEIGHTS_DIR
from tests.gateway.helpers import base_url, json_request, running_gateway, settings_for

# The committed int4 digits checkpoint, the one docs/quantized-checkpoints.md serves.
COMMITTED_INT4 = WEIGHTS_DIR / TRAINED_FILES[("digits_cnn", 4)]


def test_the_repository_holds_one_version_linking_to_the_file(tmp_path: Path) -> None:
    root = checkpoint_repository(COMMITTED_INT4, tmp_path / "cache")
    assert root.parent == tmp_path / "cache" / CHECKPOINT_REPOS
    (version,) = scan_repository(root)
    assert isinstance(version, ModelVersion), version
    assert (version.name, version.version) == ("digits_cnn_int4", 1)
    assert version.config.runtime == "onnxruntime" and version.config.format == "checkpoint"
    assert version.model_path.is_symlink()  # a link: a reload reads the file as it is then
    assert version.model_path.resolve() == COMMITTED_INT4.resolve()
    # Built once: the second call finds the folder complete and leaves it as it is.
    mtime = (version.directory / CONFIG_FILE).stat().st_mtime_ns
    assert checkpoint_repository(COMMITTED_INT4, tmp_path / "cache") == root
    assert (version.directory / CONFIG_FILE).stat().st_mtime_ns == mtime


def test_two_files_of_one_name_get_two_repositories(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "m.safetensors", tmp_path / "b" / "m.safetensors"
    for path in (a, b):
        path.parent.mkdir()
        shutil.copy(COMMITTED_INT4, path)
    roots = {checkpoint_repository(p, tmp_path / "cache") for p in (a, b)}
    assert len(roots) == 2
    versions = [v for root in roots for v in scan_repository(root)]
    assert all(isinstance(v, ModelVersion) and v.name == "m" for v in versions), versions
    assert {v.directory.joinpath("m.safetensors").resolve() for v in versions} == {a, b}


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint")
    with pytest.raises(RepositoryError, match="neither a directory nor a block-quantized"):
        checkpoint_repository(text, tmp_path / "cache")
    badly_named = tmp_path / "-x.safetensors"
    shutil.copy(COMMITTED_INT4, badly_named)
    with pytest.raises(RepositoryError, match=r"cannot be a model name.*rename the file"):
        checkpoint_repository(badly_named, tmp_path / "cache")
    assert not (tmp_path / "cache" / CHECKPOINT_REPOS).exists()  # refused before anything


async def test_the_gateway_serves_a_checkpoint_file_given_as_its_repository(
    tmp_path: Path,
) -> None:
    split = load_digits_split().test
    images, labels = split.x[:16], split.y[:16]
    async with (
        running_gateway(COMMITTED_INT4, tmp_path / "cache") as gw,
        aiohttp.ClientSession() as client,
    ):
        url = f"{base_url(gw)}/v2/models/digits_cnn_int4"
        async with client.get(url) as reply:
            assert reply.status == 200, await reply.text()
            meta = await reply.json()
        assert [i["name"] for i in meta["inputs"]] == ["image"]
        async with client.post(f"{url}/infer", json=json_request({"image": images})) as reply:
            assert reply.status == 200, await reply.text()
            (out,) = (await reply.json())["outputs"]
    probabilities = np.asarray(out["data"]).reshape(16, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1, rtol=1e-4)
    # The trained int4 model gets 98.9% of the test split; its first 16 images are all right.
    assert (probabilities.argmax(axis=1) == labels).sum() >= 15


async def test_a_file_that_is_no_checkpoint_stops_the_start(tmp_path: Path) -> None:
    text = tmp_path / "model.txt"
    text.write_text("not a checkpoint")
    gw = Gateway(settings_for(text, tmp_path / "cache"))
    with pytest.raises(StartupError, match="neither a directory nor a block-quantized"):
        await gw.start()
