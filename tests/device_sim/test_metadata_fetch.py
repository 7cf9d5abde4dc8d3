"""The simulator reads a model's inputs from the gateway; a model the gateway does not have is
named in words the gateway used, not as a Python bytes literal."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from device_sim.tensors import fetch_metadata
from tests.gateway.helpers import base_url, make_repo, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="function")


async def test_unknown_model_is_named_in_plain_words(demo_repo: Path, tmp_path: Path) -> None:
    repo = make_repo(tmp_path / "repo", demo_repo, {"sensor_mlp": None})
    async with running_gateway(repo, tmp_path / "cache") as gw, aiohttp.ClientSession() as s:
        spec = await fetch_metadata(s, base_url(gw), "sensor_mlp")
        assert spec.name == "sensor_mlp"
        with pytest.raises(ValueError) as refused:
            await fetch_metadata(s, base_url(gw), "sensor_mpl")
    message = str(refused.value)
    assert message.endswith("answered 404: unknown model 'sensor_mpl'; served: sensor_mlp"), message
    assert "b'" not in message and 'b"' not in message
