"""Model versions in one process: a rollout under open-loop load (load v2, canary, all traffic, unload v1),
failed loads, the admin API's refusals, and a SIGHUP that adds one model and removes another.

Each version's simulated GPU puts its version before every output (`tag`), so an answer shows which
version computed it; each version's own call log shows what it computed."""

from __future__ import annotations

import asyncio
import hashlib
import random
import signal
import time

import aiohttp

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig

from .. import fakes
from ..helpers import PYTHON, ServerProcess, infer, running_server, sim_model, until, write_config

ADMIN_KEY = "admin-key-for-rollouts"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier="default",
                            admin_key_sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest()))


def version_table(version: str, **options) -> dict:  # type: ignore[no-untyped-def]
    return {"name": "m", "version": version, "backend": "inferd.backends.sim:create", "max_batch_size": 16,
            "max_wait_ms": 5, "options": {"latency_ms": 20, "max_batch_size": 16, "record_inputs": True,
                                          "tag": f"v{version}:", **options}}


async def admin(http, method: str, url: str, body=None) -> tuple[int, dict]:  # type: ignore[no-untyped-def]
    async with http.request(method, url, json=body, headers=ADMIN) as resp:
        return resp.status, await resp.json()


async def state_of(http, url: str, version: str) -> str | None:  # type: ignore[no-untyped-def]
    _, body = await admin(http, "GET", f"{url}/v1/admin/models")
    return body["models"].get("m", {}).get("versions", {}).get(version, {}).get("state")


async def test_a_rollout_under_load_loses_nothing_and_never_answers_from_another_version(http):
    first = sim_model(latency_ms=20, max_batch_size=16, options={"tag": "v1:"})
    # (running_server hides the start-up heap from the collector as `inferd serve` does, so the collection
    # after an unload scans only what came later)
    await _rollout_under_load(http, first)


async def _rollout_under_load(http, first) -> None:  # type: ignore[no-untyped-def]
    async with running_server(first, **AUTH) as srv:
        url, answers, pinned = srv.url, [], {"1": True, "2": False}
        done = asyncio.Event()

        in_flight = {"1": 0, "2": 0, None: 0}

        async def one(i: int, version: str | None) -> None:
            text = f"req {i}"
            body = {"input": text, "timeout_ms": 5000, **({"version": version} if version else {})}
            sent = time.monotonic()
            async with http.post(f"{url}/v1/inference", json=body) as resp:
                answers.append((text, version, resp.status, await resp.json(), resp.headers.get("X-Model-Version"),
                                sent, time.monotonic()))
            in_flight[version] -= 1

        def answered_by(version: str) -> int:
            return sum(1 for a in answers if a[4] == version)

        async def load() -> None:  # open loop, ~200 req/s: a tenth pinned to each version that may be pinned
            tasks, rng, i = [], random.Random(7), 0
            while not done.is_set():
                draw = rng.random()
                version = "1" if draw < 0.1 and pinned["1"] else "2" if draw < 0.2 and pinned["2"] else None
                in_flight[version] += 1  # (here, not when the task first runs: one made just before v1's pin ends counts)
                tasks.append(asyncio.ensure_future(one(i, version)))
                i += 1
                await asyncio.sleep(rng.expovariate(200))
            await asyncio.gather(*tasks)

        loading = asyncio.ensure_future(load())
        marks = {"start": time.monotonic()}
        await until(lambda: len(answers) >= 200)  # v1 alone, under load for a while
        marks["load"] = time.monotonic()
        status, body = await admin(http, "POST", f"{url}/v1/admin/models", version_table("2"))
        assert status == 202 and body["state"] == "loading"
        await until(lambda: srv.models.served["m"].versions["2"].model.ready)
        await until(lambda: srv.models.served["m"].versions["2"].state.value == "ready")
        pinned["2"] = True
        status, body = await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"1": 90, "2": 10})
        assert status == 200 and body["traffic"] == {"1": 0.9, "2": 0.1}
        assert (await admin(http, "GET", f"{url}/v1/admin/models"))[1]["models"]["m"]["traffic"] == body["traffic"]
        canary = answered_by("2")
        await until(lambda: sum(1 for a in answers if a[4] == "2" and a[1] is None) >= 10 and answered_by("2") > canary + 20)
        assert (await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"2": 1}))[0] == 200
        moved = answered_by("2")
        await until(lambda: answered_by("2") >= moved + 120)  # all of it to v2 for a while
        pinned["1"] = False
        await until(lambda: in_flight["1"] == 0)  # (pinned requests already sent to v1 are still answered by it)
        v1_gpu = srv.models.served["m"].versions["1"].model.workers[0].backend  # (before an unload lets go of it)
        v2_gpu = srv.models.served["m"].versions["2"].model.workers[0].backend
        marks["unload"] = time.monotonic()
        status, body = await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/1")
        assert status == 202 and body["state"] == "draining"
        await until(lambda: "1" not in srv.models.served["m"].versions)  # unloaded, and let go of
        assert [(r.version, r.state.value) for r in srv.models.served["m"].retired] == [("1", "unloaded")]
        unloaded = len(answers)
        await until(lambda: len(answers) >= unloaded + 120)  # v2 alone, after the unload
        done.set()
        await loading
        assert len(answers) > 500
        for text, version, status, body, header, _, _ in answers:
            assert status == 200, body  # nothing lost, nothing refused
            assert body["output"] == f"v{header}:" + expected_output(text) and body["model_version"] == header
            assert version is None or header == version  # a pinned request is answered by its version
        by_version = {v: {t for t, _, _, _, h, _, _ in answers if h == v} for v in ("1", "2")}
        assert set(v1_gpu.computed) - {"warmup"} == by_version["1"] and set(v2_gpu.computed) - {"warmup"} == by_version["2"]
        canary = [h for _, v, _, _, h, sent, _ in answers if v is None and marks["load"] < sent < marks["unload"]]
        assert canary.count("2") > 10 and canary.count("1") > 10
        steady = sorted(end - sent for _, _, _, _, _, sent, end in answers if sent < marks["load"])
        switching = sorted(end - sent for _, _, _, _, _, sent, end in answers if sent >= marks["load"])
        p99 = lambda xs: xs[int(0.99 * (len(xs) - 1))]  # noqa: E731
        # The benchmark (S11) holds the 1.5x bound; here a loose one, for a shared 2-core CI box.
        assert p99(switching) < 3 * p99(steady) + 0.05, (p99(steady), p99(switching))


async def test_a_failed_load_leaves_the_serving_version_untouched(http):
    fakes.reset()
    async with running_server(sim_model(latency_ms=10, options={"tag": "v1:"}), **AUTH) as srv:
        url = srv.url
        serving = asyncio.ensure_future(asyncio.gather(*(infer(http, url, {"input": f"x{i}"}) for i in range(50))))
        status, body = await admin(http, "POST", f"{url}/v1/admin/models", version_table("9", memory_mb=10**9))
        assert status == 507 and body["error"] == "INSUFFICIENT_MEMORY" and "MiB" in body["message"]
        fakes.build_failing.set()
        try:
            broken = {**version_table("2"), "backend": "tests.fakes:switchable", "options": {"latency_ms": 10}}
            assert (await admin(http, "POST", f"{url}/v1/admin/models", broken))[0] == 202
            await until(lambda: srv.models.served["m"].versions["2"].state.value == "failed")
        finally:
            fakes.reset()
        assert "out of memory" in (await admin(http, "GET", f"{url}/v1/admin/models"))[1]["models"]["m"]["versions"]["2"]["reason"]
        status, body = await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"2": 1})
        assert status == 409 and body["error"] == "VERSION_CONFLICT"  # a failed version takes no traffic
        assert all(s == 200 for s, _, _ in await serving)
        status, body, headers = await infer(http, url, {"input": "after"})
        assert status == 200 and headers["X-Model-Version"] == "1" and srv.ready
        status, body, _ = await infer(http, url, {"input": "pinned", "model": "m@2"})
        assert status == 404
        assert (await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/2"))[0] == 202  # a failed one is deleted
        models = (await admin(http, "GET", f"{url}/v1/admin/models"))[1]["models"]["m"]
        assert "2" not in models["versions"] and models["retired"][-1]["state"] == "failed"
        # the last version is not deleted by a slip: that takes the model away (and /readyz with it)
        status, body = await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/1")
        assert status == 409 and "?last=true" in body["message"] and srv.ready
        assert (await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/1?last=true"))[0] == 202
        await until(lambda: "m" not in srv.models.served)
        assert (await infer(http, url, {"input": "gone"}))[0] == 404


async def test_a_model_whose_first_version_failed_takes_its_second_and_readiness_follows(http):
    fakes.reset()
    async with running_server(sim_model(latency_ms=10), **AUTH) as srv:
        url = srv.url
        fakes.build_failing.set()
        try:
            broken = {**version_table("1"), "name": "n", "backend": "tests.fakes:switchable", "options": {"latency_ms": 10}}
            assert (await admin(http, "POST", f"{url}/v1/admin/models", broken))[0] == 202
            await until(lambda: srv.models.served["n"].versions["1"].state.value == "failed")
        finally:
            fakes.reset()
        async with http.get(f"{url}/readyz") as resp:
            assert resp.status == 503  # the host cannot serve n: a balancer should know
        good = {**version_table("2"), "name": "n"}
        assert (await admin(http, "POST", f"{url}/v1/admin/models", good))[0] == 202
        await until(lambda: srv.models.served["n"].versions["2"].state.value == "ready")
        status, body, headers = await infer(http, url, {"input": "x", "model": "n"})
        assert status == 200 and headers["X-Model-Version"] == "2"  # the ready version takes the traffic
        async with http.get(f"{url}/readyz") as resp:
            assert resp.status == 200


async def test_a_new_version_inherits_what_it_leaves_out_and_a_backend_that_does_not_import_is_a_400(http):
    async with running_server(sim_model(latency_ms=10, max_batch_size=8, max_wait_ms=7), **AUTH) as srv:
        status, body = await admin(http, "POST", f"{srv.url}/v1/admin/models", {"name": "m", "version": "2"})
        assert status == 202 and {"backend", "max_wait_ms", "options"} <= set(body["inherited"])
        second = srv.models.served["m"].versions["2"].model.config
        first = srv.models.served["m"].versions["1"].model.config
        assert (second.backend, second.max_wait_ms, second.max_batch_size, dict(second.options)) == (
            first.backend, 7, 8, dict(first.options))
        status, body = await admin(http, "POST", f"{srv.url}/v1/admin/models",
                                   {"name": "m", "version": "3", "backend": "no_such_module_here:create"})
        assert status == 400 and "no_such_module_here" in body["message"]


async def test_the_admin_api_needs_the_admin_key_and_refuses_what_states_do_not_allow(http):
    async with running_server(sim_model(latency_ms=10), **AUTH) as srv:
        url = srv.url
        async with http.get(f"{url}/v1/admin/models") as resp:
            assert resp.status == 401
        async with http.get(f"{url}/v1/admin/models", headers={"Authorization": "Bearer nope"}) as resp:
            assert resp.status == 403
        async with http.put(f"{url}/v1/admin/models", headers=ADMIN) as resp:
            assert resp.status == 405
        assert (await admin(http, "POST", f"{url}/v1/admin/models", {"name": "m", "backend": 5}))[0] == 400
        status, body = await admin(http, "POST", f"{url}/v1/admin/models", version_table("1"))
        assert status == 409  # loaded already
        status, body = await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/7")
        assert status == 404
        assert (await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"1": -1}))[0] == 400
        slow = {**version_table("2"), "options": {"latency_ms": 10, "tag": "v2:"}, "warmup_inputs": ["w"] * 1}
        assert (await admin(http, "POST", f"{url}/v1/admin/models", slow))[0] == 202
        await until(lambda: srv.models.served["m"].versions["2"].state.value == "ready")
        status, body = await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/1")
        assert status == 409 and "give it to" in body["message"]  # v1 holds all the traffic
        await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"2": 1})
        assert (await admin(http, "DELETE", f"{url}/v1/admin/models/m/versions/1"))[0] == 202
        await until(lambda: "1" not in srv.models.served["m"].versions)
        async with http.get(f"{url}/v1/models/m") as resp:
            described = await resp.json()
        assert described["version"] == "2" and described["batch_key"]["version"] == "2"
        assert (await infer(http, url, {"input": "a", "model": "m@1"}))[0] == 404


CONFIG = """
[server]
grace_period_s = 5

[[models]]
name = "m"
backend = "inferd.backends.sim:create"
[models.options]
latency_ms = 10

[[models]]
name = "{second}"
backend = "inferd.backends.sim:create"
[models.options]
latency_ms = 10
tag = "{second}:"
"""


async def test_sighup_applies_an_edited_config_adding_one_model_and_removing_another(tmp_path):
    config = write_config(tmp_path / "inferd.toml", CONFIG.replace("{second}", "old"))
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        url = server.wait_listening()
        async with aiohttp.ClientSession() as http:
            await until(lambda: any("inferd ready" in line for line in server.lines), timeout_s=60)
            assert (await infer(http, url, {"input": "a", "model": "old"}))[0] == 200
            write_config(config, CONFIG.replace("{second}", "new"))
            results = asyncio.ensure_future(asyncio.gather(*(infer(http, url, {"input": f"x{i}", "model": "m"})
                                                             for i in range(100))))
            server.signal(signal.SIGHUP)

            async def both_served() -> bool:
                async with http.get(f"{url}/v1/models") as resp:
                    return {m["id"] for m in (await resp.json())["data"]} == {"m", "new"}

            await until(both_served, timeout_s=10, step_s=0.02)
            status, body, _ = await infer(http, url, {"input": "b", "model": "new"})
            assert status == 200 and body["output"] == "new:" + expected_output("b")
            assert (await infer(http, url, {"input": "c", "model": "old"}))[0] == 404
            assert all(status == 200 for status, _, _ in await results)  # the model left alone never noticed
    finally:
        assert server.stop() == 0
    assert any("config reload: new@1: loading" in line for line in server.lines)


async def test_a_reload_applies_what_changed_in_the_file_and_never_undoes_the_admin_apis_changes(http):
    from dataclasses import replace

    from inferd.config import ConfigError, parse_model

    first = parse_model(version_table("1"))
    async with running_server(first, **AUTH) as srv:
        url = srv.url
        assert (await admin(http, "POST", f"{url}/v1/admin/models", version_table("2")))[0] == 202
        await until(lambda: srv.models.served["m"].versions["2"].state.value == "ready")
        assert (await admin(http, "PUT", f"{url}/v1/admin/models/m/traffic", {"2": 1}))[0] == 200
        unchanged = srv.config
        assert await srv.reload(unchanged) == []  # the same file: the admin API's version and split stay
        assert set(srv.models.served["m"].versions) == {"1", "2"} and srv.models.served["m"].traffic == {"2": 1.0}
        drift = (await admin(http, "GET", f"{url}/v1/admin/models"))[1]["file_drift"]
        assert drift == {"m": {"file": ["1"], "server": ["1", "2"]}}  # what the admin API changed, shown

        broken = replace(unchanged, models=(first, parse_model({**version_table("3"), "backend": "no_such_module:create"}),
                                            parse_model({**version_table("4"), "name": "other"})))
        try:
            await srv.reload(broken)
            raise AssertionError("a file with a backend that does not import was applied")
        except ConfigError as exc:
            assert "no_such_module" in str(exc) and "\n" not in str(exc)
        assert "other" not in srv.models.served and "3" not in srv.models.served["m"].versions  # none of it

        edited = replace(unchanged, models=(replace(first, traffic=1.0), parse_model({**version_table("3"), "traffic": 1.0})))
        changes = await srv.reload(edited)
        assert "m@3: loading" in changes
        await until(lambda: srv.models.served["m"].traffic == {"1": 0.5, "3": 0.5})  # the file's split, once loaded
        assert "2" in srv.models.served["m"].versions  # the file never listed it: not the file's to unload


async def test_a_second_minilm_version_loads_beside_the_first_and_unloads(http):
    from inferd.config import ModelConfig

    options = {"max_tokens": 64, "bucket_edges": [16, 32]}
    first = ModelConfig(name="minilm", backend="inferd.backends.transformer:create", max_batch_size=8, options=options)
    async with running_server(first, **AUTH) as srv:
        table = {"name": "minilm", "version": "2", "backend": "inferd.backends.transformer:create", "max_batch_size": 8,
                 "options": {**options, "bucket_edges": [32]}}
        assert (await admin(http, "POST", f"{srv.url}/v1/admin/models", table))[0] == 202
        await until(lambda: srv.models.served["minilm"].versions["2"].state.value == "ready", timeout_s=120)
        body = {"model": "minilm", "input": ["a sentence to embed", "another one"]}
        async with http.post(f"{srv.url}/v1/embeddings", json=body) as resp:
            assert resp.headers["X-Model-Version"] == "1"  # no traffic moved: the split still sends all to v1
            one = [d["embedding"] for d in (await resp.json())["data"]]
        async with http.post(f"{srv.url}/v1/embeddings", json={**body, "model": "minilm@2"}) as resp:
            assert resp.headers["X-Model-Version"] == "2"
            two = [d["embedding"] for d in (await resp.json())["data"]]
        assert max(abs(a - b) for x, y in zip(one, two, strict=True) for a, b in zip(x, y, strict=True)) < 1e-4
        async with http.get(f"{srv.url}/v1/models/minilm") as resp:
            described = await resp.json()
        assert described["batch_key"] == {"model": "minilm", "version": "1", "bucket": "per input, from the backend's prepare",
                                          "task": "embedding", "dtype": "float32", "device": "cpu"}
        assert described["other_versions"]["2"]["state"] == "ready" and described["other_versions"]["2"]["traffic"] == 0
        second = srv.models.served["minilm"].versions["2"].model
        assert (await admin(http, "DELETE", f"{srv.url}/v1/admin/models/minilm/versions/2"))[0] == 202
        await until(lambda: "2" not in srv.models.served["minilm"].versions)
        assert second.pool.healthy == 0  # its workers are gone


async def test_a_version_whose_stop_began_admits_nothing_more(http):
    from inferd.errors import Draining

    async with running_server(sim_model(latency_ms=10)) as srv:
        model = srv.models["m"]
        stopping = asyncio.ensure_future(model.stop(Draining("unloaded")))
        await asyncio.sleep(0)  # (its stop has begun: the batcher is stopped, workers are being joined)
        assert not model.ready
        status, body, _ = await infer(http, srv.url, {"input": "late"})
        assert status == 503 and body["error"] == "NOT_READY"  # refused at once, not queued to a stopped batcher
        await stopping
