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
    assert model.traffic == {"1": 0.9, "2": 0.1}  # shares, whatever weights were given: one shape everywhere
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


def test_two_hundred_rollouts_keep_a_short_history_not_two_hundred_models():
    model = served("0")
    for i in range(1, 201):  # v(i) loads, takes the traffic, v(i-1) is unloaded
        model.add(SimpleNamespace(version=str(i), ready=True, config=SimpleNamespace(backend="b")), VersionState.READY)  # type: ignore[arg-type]
        model.set_traffic({str(i): 1})
        model.versions[str(i - 1)].model.config = SimpleNamespace(backend="b")  # type: ignore[attr-defined]
        model.versions[str(i - 1)].enter(VersionState.UNLOADED)
        model.retire(str(i - 1))
    assert list(model.versions) == ["200"]  # the others' models are let go of
    assert len(model.retired) == 16 and model.retired[-1].version == "199" and model.retired[-1].state is VersionState.UNLOADED
