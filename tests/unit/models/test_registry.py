"""The server's models by name: routing a request's `model` (and pinned version) and what readiness
says, with stand-in models (no workers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from inferd.errors import InvalidInput, ModelNotFound, NotReady
from inferd.models.registry import Models
from inferd.models.versions import ServedModel, VersionState


def version(v: str, ready: bool = True, start_error: Exception | None = None) -> SimpleNamespace:
    return SimpleNamespace(version=v, ready=ready, start_error=start_error)


def served(name: str, *versions: SimpleNamespace, state: VersionState = VersionState.READY,
           traffic: dict[str, float] | None = None) -> ServedModel:
    model = ServedModel(name)
    for v in versions:
        model.add(v, state)  # type: ignore[arg-type]
    if traffic is not None:
        model.set_traffic(traffic)
    return model


def test_a_request_goes_to_the_split_or_to_the_version_it_pins():
    models = Models({"m": served("m", version("1"), version("2"), traffic={"1": 1.0})}, {}, "m")
    assert models.route("m").version == "1"  # type: ignore[union-attr]
    assert models.route("m@2").version == "2" and models.route("m", "2").version == "2"  # type: ignore[union-attr]
    assert models.route("other") is None  # (the handler says 404, or tries the generation models)
    with pytest.raises(ModelNotFound):
        models.route("m@3")
    with pytest.raises(InvalidInput):
        models.route("m@1", "2")  # two different pins


def test_a_model_loading_its_first_version_is_not_ready_rather_than_missing():
    models = Models({"m": served("m", version("1", ready=False), state=VersionState.LOADING)}, {}, "m")
    with pytest.raises(NotReady):
        models.route("m")
    assert models.ready  # (a first version still loading is not held against the host)


def test_readiness_follows_what_the_host_can_serve():
    assert not Models({}, {}, "").ready  # serving nothing: not ready
    failed = served("m", version("1", ready=False, start_error=RuntimeError("no GPU")), state=VersionState.FAILED)
    models = Models({"m": failed}, {}, "m")
    assert not models.ready and [m.version for m in models.failed()] == ["1"]  # type: ignore[union-attr]
    both = Models({"m": served("m", version("1"), traffic={"1": 1.0})}, {"g": SimpleNamespace(ready=False)}, "m")  # type: ignore[dict-item]
    assert not both.ready  # a generation model still starting holds readiness too
    both.generation["g"].ready = True  # type: ignore[misc]
    assert both.ready


def test_the_batch_view_names_each_models_default_version():
    models = Models({"m": served("m", version("1"), version("2"), traffic={"2": 1.0}),
                     "n": served("n", version("7"))}, {}, "m")
    assert {name: m.version for name, m in models.batch.items()} == {"m": "2", "n": "7"}  # type: ignore[attr-defined]
    assert models["m@1"].version == "1" and models["n"].version == "7"  # type: ignore[union-attr]
