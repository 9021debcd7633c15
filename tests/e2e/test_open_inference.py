"""The Open Inference Protocol (KServe v2), spoken to by NVIDIA's own `tritonclient` (its sync client on a
thread, its asyncio client in the test's loop) and checked against what the simulated GPU computed."""

from __future__ import annotations

import asyncio
import hashlib

import numpy as np
import pytest
import tritonclient.http as triton
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig, TenantConfig

from ..helpers import backend_of, running_server, sim_model, until

KEY = "key-acme"
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier=None),
            tenants=(TenantConfig("acme", "default", hashlib.sha256(KEY.encode()).hexdigest()),))


def text_tensor(texts: list[str], shape: list[int] | None = None, binary: bool = True) -> triton.InferInput:
    tensor = triton.InferInput("text", shape or [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(shape or [len(texts)]), binary_data=binary)
    return tensor


async def test_the_sync_client_sees_health_metadata_and_answers_in_binary_and_json(http):
    models = (sim_model(latency_ms=20, max_batch_size=4),
              sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=10, max_batch_size=4))
    async with running_server(*models) as srv:
        texts = [f"row {i}" for i in range(10)]  # more than one batch of 4

        def talk() -> dict:
            client = triton.InferenceServerClient(srv.url.removeprefix("http://"))
            seen = {"live": client.is_server_live(), "ready": client.is_server_ready(),
                    "server": client.get_server_metadata(), "meta": client.get_model_metadata("m"),
                    "model_ready": client.is_model_ready("m", "1"), "config": client.get_model_config("m"),
                    "index": client.get_model_repository_index()}
            binary = client.infer("m", [text_tensor(texts)], outputs=[triton.InferRequestedOutput("output")])
            as_json = client.infer("m", [text_tensor(texts[:3], [3, 1], binary=False)], model_version="1",
                                   outputs=[triton.InferRequestedOutput("output", binary_data=False)])
            embedded = client.infer("emb", [text_tensor(["ab", "cd"])])
            seen.update(binary=binary.as_numpy("output"), as_json=as_json.as_numpy("output"),
                        embedded=embedded.as_numpy("output"), json_response=as_json.get_response(),
                        stats=client.get_inference_statistics("m"), versioned=client.get_inference_statistics("m", "1"))
            client.close()
            return seen

        seen = await asyncio.to_thread(talk)
        assert seen["live"] and seen["ready"] and seen["model_ready"] and seen["server"]["name"] == "inferd"
        assert seen["meta"]["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": [-1]}]
        assert seen["config"]["max_batch_size"] == 4 and seen["config"]["input"][0]["data_type"] == "TYPE_STRING"
        assert seen["config"]["dynamic_batching"]["max_queue_delay_microseconds"] == 5000  # (max_wait_ms 5)
        assert sorted((m["name"], m["version"], m["state"]) for m in seen["index"]) == [("emb", "1", "READY"), ("m", "1", "READY")]
        assert [b.decode() for b in seen["binary"]] == [expected_output(t) for t in texts]
        assert list(seen["as_json"]) == [expected_output(t) for t in texts[:3]]  # (JSON data: str, not bytes)
        assert seen["json_response"]["outputs"][0]["data"] == [expected_output(t) for t in texts[:3]]
        assert seen["embedded"].dtype == np.float32 and seen["embedded"].shape == (2, 4)
        assert seen["embedded"][0].tolist() == [97.0, 98.0, 32.0, 32.0]  # the fake embedder's codes of "ab  "
        served = srv.models["m"]
        assert served.stats.batch_sizes[4] >= 2  # the ten rows went through the batcher like ten requests
        assert backend_of(srv).computed["row 9"] == 1
        # Triton's statistics: 13 rows computed (10 then 3) in the batches the batcher made, two calls answered
        (stats,) = seen["stats"]["model_stats"]
        assert seen["versioned"] == seen["stats"]
        assert (stats["name"], stats["version"], stats["inference_count"]) == ("m", "1", served.stats.requests_computed) == ("m", "1", 13)
        assert stats["execution_count"] == served.stats.batches and stats["inference_stats"]["success"]["count"] == 2
        assert stats["inference_stats"]["queue"]["count"] == 13 and stats["inference_stats"]["compute_infer"]["ns"] > 0
        assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == dict(served.stats.batch_sizes)
        assert stats["last_inference"] > 1.7e12  # (ms since the epoch)


async def test_the_asyncio_client_gets_errors_in_the_protocols_shape():
    async with running_server(sim_model(latency_ms=300, max_batch_size=8), **AUTH) as srv:
        client = triton_aio.InferenceServerClient(srv.url.removeprefix("http://"), conn_limit=8)
        try:
            with pytest.raises(InferenceServerException) as refused:
                await client.infer("m", [text_tensor(["x"])])  # no key: 401
            assert refused.value.status() == "401"
            for model, version in (("nope", ""), ("m", "2")):  # nor does it learn which models exist
                with pytest.raises(InferenceServerException) as refused:
                    await client.infer(model, [text_tensor(["x"])], model_version=version)
                assert refused.value.status() == "401"
            key = {"Authorization": f"Bearer {KEY}"}
            with pytest.raises(InferenceServerException) as missing:
                await client.infer("nope", [text_tensor(["x"])], headers=key)
            assert missing.value.status() == "404" and "nope" in missing.value.message()
            with pytest.raises(InferenceServerException) as version:
                await client.infer("m", [text_tensor(["x"])], model_version="2", headers=key)
            assert version.value.status() == "404"
            busy = asyncio.ensure_future(client.infer("m", [text_tensor(["first"])], headers=key))
            await until(lambda: any(w.running_requests for w in srv.models["m"].snapshot(0).workers))
            with pytest.raises(InferenceServerException) as late:  # 50 ms cannot be met behind a 300 ms batch
                await client.infer("m", [text_tensor(["late"])], headers=key, timeout=50_000)
            assert late.value.status() == "503"
            result = await busy
            assert result.as_numpy("output")[0].decode() == expected_output("first")
        finally:
            await client.close()


async def test_rows_in_json_data_answer_in_their_own_positions(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        for shape, data in (([2, 1], [["first"], ["second"]]), ([2, 2], [["a", "b"], ["c", "d"]])):
            body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": shape, "data": data}]}
            async with http.post(f"{srv.url}/v2/models/m/infer", json=body) as resp:
                output = (await resp.json())["outputs"][0]
            rows = [text for row in data for text in row]  # row-major
            assert resp.status == 200 and output["data"] == [expected_output(t) for t in rows], output
            timing = dict(p.strip().split(";dur=") for p in resp.headers["Server-Timing"].split(","))
            assert set(timing) == {"total", "queue", "compute"} and float(timing["compute"]) >= 4  # (5 ms batches)


async def test_bad_tensors_are_400s_and_nothing_is_computed(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        bad_bodies = [
            {"inputs": [{"name": "text", "datatype": "FP32", "shape": [1], "data": [1.0]}]},
            {"inputs": [{"name": "other", "datatype": "BYTES", "shape": [1], "data": ["x"]}]},
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2], "data": ["x"]}]},
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "outputs": [{"name": "o"}]},
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["x"]}], "parameters": {"timeout": 0}},
            {"inputs": []},
            {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [3], "data": ["x1", ["x2"], "x3"]}]},
        ]
        for body in bad_bodies:
            async with http.post(f"{srv.url}/v2/models/m/infer", json=body) as resp:
                answer = await resp.json()
                assert resp.status == 400 and answer["code"] == "INVALID_INPUT" and answer["error"], body
        async with http.get(f"{srv.url}/v2/models/m/infer") as resp:
            assert resp.status == 405 and resp.headers["Allow"] == "POST"
        async with http.get(f"{srv.url}/v2/nothing") as resp:
            assert resp.status == 404 and "error" in await resp.json()
        for method in ("GET", "POST"):  # no route is a 404 whatever the method (POST /v2/rerank once said "GET only")
            async with http.request(method, f"{srv.url}/v2/rerank") as resp:
                assert resp.status == 404 and "no route" in (await resp.json())["error"]
        assert sum(backend_of(srv).computed.values()) == 1  # the warm-up's input only
