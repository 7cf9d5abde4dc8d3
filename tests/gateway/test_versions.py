"""The version rule shared by the serving process and the ingest processes' catalog: which
version a request gets, and the refusals, an unknown model's naming the models there are."""

from __future__ import annotations

import pytest

from gateway.errors import ModelUnavailable, NotFound
from gateway.versions import MAX_LISTED, Catalog, CatalogEntry, pick_version, unknown_model

ENTRIES = {1: "v1", 2: "v2", 3: "v3"}


def _pick(version: int | str | None, ready: set[int]) -> str:
    return pick_version("m", version, ENTRIES, None, lambda e: int(e[1:]) in ready)


def test_the_highest_ready_version_serves_unless_one_is_named() -> None:
    assert _pick(None, {1, 2}) == "v2"
    assert _pick(None, set()) == "v3"  # none ready: the highest, which then refuses itself
    assert _pick("1", set()) == "v1"
    with pytest.raises(NotFound, match="model 'm' has no version 9"):
        _pick(9, {1})
    with pytest.raises(NotFound, match="model 'm' has no version 'x'"):
        _pick("x", {1})


def test_a_broken_version_is_unavailable_with_its_reason() -> None:
    with pytest.raises(ModelUnavailable, match="version 2 is unavailable: bad toml"):
        pick_version("m", 2, None, {2: "bad toml"}, bool)
    with pytest.raises(ModelUnavailable, match="is unavailable: bad toml"):
        pick_version("m", None, None, {2: "bad toml"}, bool)


@pytest.mark.parametrize("version", [None, "1"])
def test_an_unknown_model_is_refused_naming_the_served_ones(version: str | None) -> None:
    with pytest.raises(NotFound) as refused:
        pick_version(
            "sensor_mpl", version, None, None, bool, served=lambda: ["vision_cnn", "sensor_mlp"]
        )
    assert refused.value.status == 404
    assert str(refused.value) == "unknown model 'sensor_mpl'; served: sensor_mlp, vision_cnn"


def test_the_served_names_are_asked_only_for_an_unknown_model() -> None:
    def served() -> list[str]:
        raise AssertionError("a known model's lookup asked for every name")

    assert pick_version("m", None, ENTRIES, None, bool, served=served) == "v3"


def test_the_listing_is_bounded_and_says_where_the_rest_are() -> None:
    names = [f"model_{i:03d}" for i in range(MAX_LISTED + 5)]
    message = str(unknown_model("x", names))
    assert message.endswith(f"model_{MAX_LISTED - 1:03d} and 5 more (POST /v2/repository/index)")
    assert f"model_{MAX_LISTED:03d}" not in message
    assert str(unknown_model("x", [])) == "unknown model 'x'; the gateway serves no models"
    assert str(unknown_model("x")) == "unknown model 'x'"  # no names given: none listed


def test_the_catalog_knows_every_model_the_service_does() -> None:
    entry = CatalogEntry(ready=True, metadata=None, unavailable="")
    catalog = Catalog(
        versions={"b": {1: entry}}, broken={"c": {1: "bad toml"}}, unloaded=frozenset({"a"})
    )
    assert catalog.model_names() == ["a", "b", "c"]
