"""The Open Inference Protocol over gRPC (`[server] grpc_port`), spoken to by NVIDIA's own
`tritonclient.grpc` (its sync client on a thread) and `tritonclient.grpc.aio` (in the test's loop), and
by a bare gRPC stub where the trailing metadata is what is checked."""

from __future__ import annotations

import asyncio
import hashlib
import socket

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from inferd.backends.sim import expected_output
from inferd.config import AuthConfig, TenantConfig

from ..helpers import backend_of, running_server, sim_model, until

KEY = "key-acme"
AUTH = dict(auth=AuthConfig(enabled=True, anonymous_tier=None),
            tenants=(TenantConfig("acme", "default", hashlib.sha256(KEY.encode()).hexdigest()),))
KEYED = {"authorization": f"Bearer {KEY}"}


def text_tensor(texts: list[str], shape: list[int] | None = None) -> triton.InferInput:
    tensor = triton.InferInput("text", shape or [len(texts)], "BYTES")
    tensor.set_data_from_numpy(np.array(texts, dtype=object).reshape(shape or [len(texts)]))
    return tensor


def address(srv) -> str:
    return f"127.0.0.1:{srv.grpc_port}"


async def test_the_sync_client_sees_health_metadata_config_and_batched_answers():
    models = (sim_model(latency_ms=20, max_batch_size=4),
              sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=10, max_batch_size=4))
    async with running_server(*models, grpc_port=0) as srv:
        texts = [f"row {i}" for i in range(10)]  # more than one batch of 4

        def talk() -> dict:
            client = triton.InferenceServerClient(address(srv))
            seen = {"live": client.is_server_live(), "ready": client.is_server_ready(),
                    "server": client.get_server_metadata(as_json=True), "meta": client.get_model_metadata("m", as_json=True),
                    "model_ready": client.is_model_ready("m", "1"), "config": client.get_model_config("m", as_json=True),
                    "index": client.get_model_repository_index(as_json=True)}
            rows = client.infer("m", [text_tensor(texts)], outputs=[triton.InferRequestedOutput("output")])
            as_rows = client.infer("m", [text_tensor(texts[:3], [3, 1])], model_version="1", request_id="call-7")
            embedded = client.infer("emb", [text_tensor(["ab", "cd"])])
            seen.update(rows=rows.as_numpy("output"), as_rows=as_rows.as_numpy("output"), id=as_rows.get_response().id,
                        embedded=embedded.as_numpy("output"), stats=client.get_inference_statistics("m", as_json=True),
                        every=client.get_inference_statistics(as_json=True))
            client.close()
            return seen

        seen = await asyncio.to_thread(talk)
        assert seen["live"] and seen["ready"] and seen["model_ready"]
        assert seen["server"]["name"] == "inferd" and "binary_tensor_data" in seen["server"]["extensions"]
        assert seen["meta"]["inputs"] == [{"name": "text", "datatype": "BYTES", "shape": ["-1"]}]  # (int64 as JSON text)
        assert seen["config"]["config"]["max_batch_size"] == 4
        assert seen["config"]["config"]["input"][0]["data_type"] == "TYPE_STRING"
        assert seen["config"]["config"]["dynamic_batching"]["max_queue_delay_microseconds"] == "5000"  # (max_wait_ms 5)
        assert sorted((m["name"], m["version"], m["state"]) for m in seen["index"]["models"]) == \
            [("emb", "1", "READY"), ("m", "1", "READY")]
        assert [b.decode() for b in seen["rows"]] == [expected_output(t) for t in texts]
        assert [b.decode() for b in seen["as_rows"]] == [expected_output(t) for t in texts[:3]] and seen["id"] == "call-7"
        assert seen["embedded"].dtype == np.float32 and seen["embedded"].shape == (2, 4)
        assert seen["embedded"][0].tolist() == [97.0, 98.0, 32.0, 32.0]  # the fake embedder's codes of "ab  "
        assert srv.models["m"].stats.batch_sizes[4] >= 2  # the ten rows went through the batcher like ten requests
        assert backend_of(srv).computed["row 9"] == 1
        # Triton's statistics over gRPC, as over HTTP (int64 as JSON text): 13 rows computed in m's batches
        (stats,) = seen["stats"]["model_stats"]
        assert (stats["name"], stats["version"], int(stats["inference_count"])) == ("m", "1", 13)
        assert int(stats["execution_count"]) == srv.models["m"].stats.batches
        assert int(stats["inference_stats"]["success"]["count"]) == 2
        assert sorted(s["name"] for s in seen["every"]["model_stats"]) == ["emb", "m"]  # (no name: every model)


async def test_errors_end_calls_with_the_mapped_status_and_inferds_code():
    async with running_server(sim_model(latency_ms=5, max_batch_size=8, max_inputs_per_call=8), grpc_port=0, **AUTH) as srv:
        client = triton_aio.InferenceServerClient(address(srv))
        try:
            for model in ("m", "nope"):  # no key: an unknown caller learns nothing of which models exist
                with pytest.raises(InferenceServerException) as refused:
                    await client.infer(model, [text_tensor(["x"])])
                assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
            with pytest.raises(InferenceServerException) as missing:
                await client.infer("nope", [text_tensor(["x"])], headers=KEYED)
            assert missing.value.status() == "StatusCode.NOT_FOUND" and "nope" in missing.value.message()
            with pytest.raises(InferenceServerException) as missing:
                await client.get_model_metadata("m", model_version="2", headers=KEYED)
            assert missing.value.status() == "StatusCode.NOT_FOUND"
            assert (await client.get_model_metadata("m", headers=KEYED, as_json=True))["name"] == "m"
            wrong = triton.InferInput("other", [1], "BYTES")
            wrong.set_data_from_numpy(np.array(["x"], dtype=object))
            for inputs in ([wrong], [text_tensor(["x"] * 9)], [text_tensor(["a"]), text_tensor(["b"])]):
                with pytest.raises(InferenceServerException) as bad:
                    await client.infer("m", inputs, headers=KEYED)
                assert bad.value.status() == "StatusCode.INVALID_ARGUMENT", inputs
        finally:
            await client.close()
        async with grpc.aio.insecure_channel(address(srv)) as channel:  # (the code travels in trailing metadata)
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="m")
            request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"\xff")
            with pytest.raises(grpc.aio.AioRpcError) as not_text:
                await stub.ModelInfer(request, metadata=tuple(KEYED.items()))
            trailing = dict(not_text.value.trailing_metadata())
            assert not_text.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in not_text.value.details()
            assert trailing["inferd-code"] == "INVALID_INPUT" and trailing["x-request-id"]
            request.inputs[0].contents.bytes_contents[0] = b"fine"
            call = stub.ModelInfer(request, metadata=(*KEYED.items(), ("x-request-id", "abc-1")))
            assert (await call).raw_output_contents[0][4:].decode() == expected_output("fine")
            assert dict(await call.trailing_metadata())["x-request-id"] == "abc-1"
        assert sum(backend_of(srv).computed.values()) == 2  # the warm-up's input and "fine": nothing refused ran


async def test_made_up_model_names_and_unknown_callers_leave_no_labels_in_the_metrics(http):
    async with running_server(sim_model(latency_ms=5), grpc_port=0, **AUTH) as srv:
        async with grpc.aio.insecure_channel(address(srv)) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for i in range(40):  # half with the key (NOT_FOUND), half without (UNAUTHENTICATED)
                request = pb.ModelInferRequest(model_name=f"made-up-{i}")
                request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ModelInfer(request, metadata=tuple(KEYED.items()) if i % 2 else ())
                assert refused.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAUTHENTICATED)
        async with http.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
        assert "made-up" not in text
        series = [line for line in text.splitlines() if line.startswith("inferd_requests_total{")]
        assert {line.split('model="')[1].split('"')[0] for line in series} == {"-"}, series  # the refused, under one label


async def test_a_cancelled_call_and_a_passed_deadline_withdraw_their_inputs():
    # Batches holding SLOW take 600 ms more than the usual 20: what is admitted behind one waits far
    # longer than predicted, so its deadline passes in the queue.
    slow = sim_model(backend="inferd.backends.faulty:create", latency_ms=20, max_batch_size=1, max_wait_ms=0,
                     options={"slow_marker": "SLOW", "slow_ms": 600})
    async with running_server(slow, grpc_port=0) as srv:
        waiting = lambda: sum(srv.models["m"].snapshot(0).waiting_by_tier.values())  # noqa: E731
        client = triton_aio.InferenceServerClient(address(srv))
        try:
            busy = asyncio.ensure_future(client.infer("m", [text_tensor(["SLOW first"])]))
            await until(lambda: srv.models["m"].workers[0].current is not None)
            gone = asyncio.ensure_future(client.infer("m", [text_tensor(["cancelled"])]))
            await until(lambda: waiting() == 1)
            gone.cancel()  # the client goes: its input leaves the queue
            await until(lambda: waiting() == 0)
            for asked in ({"client_timeout": 0.2}, {"timeout": 200_000}):  # the gRPC deadline, the `timeout` parameter
                with pytest.raises(InferenceServerException) as late:
                    await client.infer("m", [text_tensor([f"too late {asked}"])], **asked)
                assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED", asked
            assert (await busy).as_numpy("output")[0].decode() == expected_output("SLOW first")
        finally:
            await client.close()
        await until(lambda: waiting() == 0)
        computed = backend_of(srv).computed
        assert computed["SLOW first"] == 1 and not [text for text in computed if "late" in text or text == "cancelled"]


async def test_a_grpc_port_in_use_stops_the_start_with_the_port_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError) as refused:
            async with running_server(sim_model(latency_ms=5), grpc_port=port):
                pass
    assert refused.value.filename == f"127.0.0.1:{port}"


async def test_a_bug_answering_a_call_is_internal_with_inferds_code_and_the_next_call_is_served(monkeypatch):
    from inferd.grpc import open_inference

    real = open_inference.infer_response

    def breaks(model, version, call_id, outputs):  # type: ignore[no-untyped-def]
        if call_id == "breaks":
            raise TypeError("a bug")
        return real(model, version, call_id, outputs)

    monkeypatch.setattr(open_inference, "infer_response", breaks)
    async with running_server(sim_model(latency_ms=5), grpc_port=0) as srv:
        async with grpc.aio.insecure_channel(address(srv)) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            request = pb.ModelInferRequest(model_name="m", id="breaks")
            request.inputs.add(name="text", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await stub.ModelInfer(request)
            assert failed.value.code() == grpc.StatusCode.INTERNAL
            assert dict(failed.value.trailing_metadata())["inferd-code"] == "INTERNAL_ERROR"
            request.id = "fine"
            assert (await stub.ModelInfer(request)).id == "fine"
