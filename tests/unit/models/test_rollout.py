"""Rollouts without HTTP: real batch models on the simulated GPU, loaded, given traffic and unloaded in
one loop, each step awaited on the state it waits for (never a fixed time)."""

from __future__ import annotations

import asyncio

import pytest

from inferd.backends.sim import expected_output
from inferd.config import ModelConfig, ServerConfig
from inferd.errors import InvalidInput, ModelNotFound, VersionConflict
from inferd.models.batch_model import BatchModel
from inferd.models.config_reload import ConfigReload
from inferd.models.registry import Models
from inferd.models.rollout import Rollouts, configured_traffic
from inferd.models.versions import VersionState
from inferd.observability.metrics import RequestMetrics

from ... import fakes
from ...helpers import until


def version(v: str, backend: str = "inferd.backends.sim:create", **kw) -> ModelConfig:  # type: ignore[no-untyped-def]
    return ModelConfig(name="m", version=v, backend=backend, max_wait_ms=1,
                       options={"latency_ms": 2, "tag": f"v{v}:", **kw.pop("options", {})}, **kw)


@pytest.fixture
async def rollouts():  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    models = Models({}, {}, default="m")
    built: list[BatchModel] = []

    def build(config: ModelConfig) -> BatchModel:
        model = BatchModel(config, loop, RequestMetrics())
        built.append(model)
        return model

    rollouts = Rollouts(models, build, headroom_bytes=0, grace_s=5.0)
    yield rollouts
    await rollouts.close()
    for model in built:
        await model.stop(ModelNotFound("test over"))
        model.pool.release()


async def answer(model: BatchModel, text: str) -> str:
    return await model.take("r", [text], 5.0, "default", "t")[0].future


def test_the_configured_split_is_the_versions_traffic_or_all_to_the_first():
    assert configured_traffic([version("1"), version("2")]) == {"1": 1.0}
    assert configured_traffic([version("1", traffic=0.9), version("2", traffic=0.1)]) == {"1": 0.9, "2": 0.1}


async def test_a_new_version_loads_beside_the_serving_one_and_takes_traffic_only_when_given(rollouts):
    rollouts.add_configured([version("1")])
    first = rollouts.models.served["m"].versions["1"].model
    first.start()
    await until(lambda: rollouts.state("m", "1") is VersionState.READY)
    second = rollouts.load(version("2"))
    assert second.state is VersionState.LOADING
    with pytest.raises(VersionConflict, match="loading already"):
        rollouts.load(version("2"))
    await until(lambda: second.state is VersionState.READY)
    served = rollouts.models.served["m"]
    assert served.traffic == {"1": 1.0} and not second.model.takes_traffic
    assert await answer(rollouts.models.route("m"), "x") == "v1:" + expected_output("x")  # (the sim tags each output)
    assert await answer(rollouts.models.route("m@2"), "x") == "v2:" + expected_output("x")  # pinned: it serves before it has traffic
    with pytest.raises(VersionConflict, match="only ready versions take traffic"):
        rollouts.set_traffic("m", {"3": 1.0})
    with pytest.raises(InvalidInput, match="add up to more than 0"):
        rollouts.set_traffic("m", {"1": 0, "2": 0})
    with pytest.raises(InvalidInput, match="numbers >= 0"):
        rollouts.set_traffic("m", {"1": -1, "2": 2})
    with pytest.raises(InvalidInput, match="not overflow"):  # (each finite, their sum not: every share NaN)
        rollouts.set_traffic("m", {"1": 1e308, "2": 1e308})
    rollouts.set_traffic("m", {"1": 1, "2": 3})
    assert served.traffic == {"1": 0.25, "2": 0.75} and second.model.takes_traffic


async def test_a_load_that_fails_leaves_the_split_as_it_was_and_says_why(rollouts):
    rollouts.add_configured([version("1")])
    rollouts.models.served["m"].versions["1"].model.start()
    await until(lambda: rollouts.state("m", "1") is VersionState.READY)
    fakes.build_failing.set()
    try:
        failed = rollouts.load(version("2", backend="tests.fakes:switchable"), traffic_when_ready={"2": 1.0})
        await until(lambda: failed.state is VersionState.FAILED)
    finally:
        fakes.build_failing.clear()
    assert "CUDA out of memory" in (failed.reason or "")
    assert rollouts.models.served["m"].traffic == {"1": 1.0}
    assert rollouts.unload("m", "2") is failed and "2" not in rollouts.models.served["m"].versions  # forgotten


async def test_unload_drains_what_was_admitted_and_a_models_last_version_goes_only_when_asked(rollouts):
    rollouts.add_configured([version("1", options={"latency_ms": 50})])
    first = rollouts.models.served["m"].versions["1"].model
    first.start()
    await until(lambda: rollouts.state("m", "1") is VersionState.READY)
    with pytest.raises(VersionConflict, match="last"):
        rollouts.unload("m", "1")
    admitted = first.take("r", ["still answered"], 5.0, "default", "t")[0]
    draining = rollouts.unload("m", "1", last_too=True)
    assert draining.state is VersionState.DRAINING
    assert await admitted.future == "v1:" + expected_output("still answered")  # admitted before the unload: answered, not dropped
    await until(lambda: draining.state is VersionState.UNLOADED)
    assert "m" not in rollouts.models.served and rollouts.models.route("m") is None
    assert first.metrics.retired[("m", "1")].version == "1"  # its counters stay exported (the exporter's test)
    with pytest.raises(ModelNotFound):
        rollouts.unload("m", "1")


async def test_the_version_taking_all_traffic_is_unloaded_only_after_its_traffic_moves(rollouts):
    rollouts.add_configured([version("1"), version("2")])
    for found in rollouts.models.served["m"].versions.values():
        found.model.start()
    await until(lambda: all(rollouts.state("m", v) is VersionState.READY for v in ("1", "2")))
    with pytest.raises(VersionConflict, match=r"give it to \['2'\] first"):
        rollouts.unload("m", "1")
    rollouts.set_traffic("m", {"2": 1.0})
    rollouts.unload("m", "1")
    await until(lambda: rollouts.state("m", "1") is None)  # retired
    assert await answer(rollouts.models.route("m"), "y") == "v2:" + expected_output("y")
    assert [r.version for r in rollouts.models.served["m"].retired] == ["1"]


async def serving_first(rollouts: Rollouts) -> ConfigReload:
    """m@1 from the file, ready and serving; the reload that follows the file."""
    rollouts.add_configured([version("1")])
    rollouts.models.served["m"].versions["1"].model.start()
    await until(lambda: rollouts.state("m", "1") is VersionState.READY)
    return ConfigReload(rollouts, [version("1")])


async def settled(reload: ConfigReload) -> None:
    await until(lambda: reload._settling is None or reload._settling.done())


async def test_a_reload_whose_replacement_fails_to_build_keeps_the_serving_version(rollouts):
    reload = await serving_first(rollouts)
    fakes.build_failing.set()
    try:
        await reload.apply(ServerConfig(models=(version("2", backend="tests.fakes:switchable"),)))
        await until(lambda: rollouts.state("m", "2") is VersionState.FAILED)
        await settled(reload)
    finally:
        fakes.build_failing.clear()
    assert rollouts.state("m", "1") is VersionState.READY and rollouts.models.served["m"].traffic == {"1": 1.0}
    assert await answer(rollouts.models.route("m"), "x") == "v1:" + expected_output("x")
    assert reload.drift() == {"m": {"file": ["2"], "server": ["1"]}}  # and the server says it differs from its file


async def test_a_reload_reverted_while_its_replacement_loads_keeps_the_model(rollouts):
    reload = await serving_first(rollouts)
    slow = version("2", backend="tests.fakes:switchable", options={"startup_delay_ms": 300})
    await reload.apply(ServerConfig(models=(slow,)))
    assert rollouts.state("m", "2") is VersionState.LOADING
    await reload.apply(ServerConfig(models=(version("1"),)))  # the operator changes their mind meanwhile
    await settled(reload)
    await until(lambda: rollouts.state("m", "2") in (None, VersionState.UNLOADED))
    await asyncio.sleep(0.5)  # (past the moment the first reload would have settled)
    assert rollouts.state("m", "1") is VersionState.READY and rollouts.models.served["m"].traffic == {"1": 1.0}
    assert await answer(rollouts.models.route("m"), "x") == "v1:" + expected_output("x")
    assert reload.drift() == {}


async def test_a_reload_during_an_admin_load_waits_for_it_before_moving_traffic(rollouts):
    reload = await serving_first(rollouts)
    slow = version("2", backend="tests.fakes:switchable", options={"startup_delay_ms": 300})
    loading = rollouts.load(slow)  # the admin API's load, in flight
    await reload.apply(ServerConfig(models=(slow,)))  # the file now lists only m@2
    await asyncio.sleep(0.1)
    assert rollouts.state("m", "1") is VersionState.READY  # still serving while m@2 loads
    assert await answer(rollouts.models.route("m"), "x") == "v1:" + expected_output("x")
    await until(lambda: loading.state is VersionState.READY)
    await settled(reload)
    assert rollouts.models.served["m"].traffic == {"2": 1.0}
    await until(lambda: rollouts.state("m", "1") is None)  # then m@1 goes, as the file says
