"""A model's versions and its traffic split, without workers (stand-in models)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferd.config import ModelConfig
from inferd.errors import ModelNotFound
from inferd.models.rollout import configured_traffic
from inferd.models.versions import ServedModel, VersionState


def served(*versions: str, ready: bool = True) -> ServedModel:
    model = ServedModel("m")
    for v in versions:
        model.add(SimpleNamespace(version=v, ready=ready), VersionState.READY)  # type: ignore[arg-type]
    return model


def test_one_version_taking_traffic_is_picked_without_a_draw():
    model = served("1", "2")
    model.set_traffic({"1": 1.0, "2": 0})
    model._draw = lambda: pytest.fail("no draw needed")  # type: ignore[method-assign]
    assert model.pick().version == "1" and model.default == "1" and model.traffic == {"1": 1.0}


def test_the_split_follows_the_weights_and_skips_a_version_without_a_healthy_worker():
    model = served("1", "2")
    model.set_traffic({"1": 90, "2": 10})
    draws = iter(i / 1000 for i in range(1000))
    model._draw = lambda: next(draws)  # type: ignore[method-assign]
    picked = [model.pick().version for _ in range(1000)]
    assert picked.count("2") == 100 and picked.count("1") == 900
    model.versions["1"].model.ready = False  # type: ignore[misc]
    model._draw = lambda: 0.0  # type: ignore[method-assign]  # (a draw that would have picked v1)
    assert {model.pick().version for _ in range(20)} == {"2"}


def test_a_pinned_version_is_served_unless_it_is_gone_or_leaving():
    model = served("1", "2")
    model.set_traffic({"1": 1})
    assert model.pick("2").version == "2"  # pinned: outside the split
    model.versions["2"].enter(VersionState.DRAINING)
    with pytest.raises(ModelNotFound, match="being unloaded"):
        model.pick("2")
    with pytest.raises(ModelNotFound, match="no version '3'"):
        model.pick("3")


def test_the_configured_split_is_the_versions_traffic_or_all_to_the_first():
    first, second = ModelConfig("m", "x"), ModelConfig("m", "x", version="2")
    assert configured_traffic([first, second]) == {"1": 1.0}
    assert configured_traffic([first, ModelConfig("m", "x", version="2", traffic=0.25)]) == {"1": 0.0, "2": 0.25}
