"""`inferd.client` against the real server: results, typed errors, and retries of what is safe only."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from inferd.backends.sim import expected_output
from inferd.client import (
    AsyncClient,
    BadRequest,
    Client,
    ConnectionFailed,
    InferenceFailed,
    NotFound,
    Unavailable,
)

from ..helpers import running_server, sim_model, until


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def failures(srv, status: int) -> int:
    return sum(n for (_, _, _, code, _), n in srv.models["m"].metrics.requests.items() if code == status)


async def test_both_clients_return_the_output_with_the_request_id_they_sent(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        async with AsyncClient(srv.url) as client:
            answer = await client.infer("hello", request_id="mine-7")
        assert (answer.output, answer.request_id, answer.model, answer.attempts) == (
            expected_output("hello"), "mine-7", "m", 1)

        def sync() -> list:
            with Client(srv.url) as client:
                return [client.infer(f"s{i}") for i in range(3)]  # one kept-alive connection

        answers = await asyncio.to_thread(sync)
        assert [a.output for a in answers] == [expected_output(f"s{i}") for i in range(3)]
        assert len({a.request_id for a in answers}) == 3


async def test_a_503_is_retried_after_the_servers_retry_after_and_typed_when_retries_run_out(http):
    model = sim_model(latency_ms=5, backend="inferd.backends.faulty:create")
    model = type(model)(**{**model.__dict__, "options": {**model.options, "startup_delay_ms": 700}})
    async with running_server(model, wait_ready=False) as srv:
        async with AsyncClient(srv.url, retries=0) as impatient:
            with pytest.raises(Unavailable) as caught:
                await impatient.infer("too early")
        assert caught.value.code == "NOT_READY" and caught.value.retry_after_ms == 1000
        started = time.monotonic()
        async with AsyncClient(srv.url, retries=3) as patient:
            answer = await patient.infer("later")
        assert answer.output == expected_output("later") and answer.attempts >= 2
        assert time.monotonic() - started >= 0.9  # it waited the server's retry_after_ms, not less


async def test_a_500_and_a_400_are_raised_at_once_never_retried(http):
    model = sim_model(latency_ms=5, max_wait_ms=0, backend="inferd.backends.faulty:create")
    model = type(model)(**{**model.__dict__, "options": {**model.options, "fail_marker": "POISON"}})
    async with running_server(model) as srv:
        async with AsyncClient(srv.url, retries=3) as client:
            with pytest.raises(InferenceFailed) as failed:
                await client.infer("POISON here")
            with pytest.raises(BadRequest):
                await client.infer("x" * 200_000)
            with pytest.raises(NotFound) as missing:
                await client.infer("x", model="nope")
        assert failed.value.code == "INFERENCE_FAILED" and failed.value.request_id
        assert missing.value.code == "MODEL_NOT_FOUND"
        await until(lambda: failures(srv, 500) == 1)
        assert failures(srv, 500) == 1  # one 500: the poison input was not sent again


async def test_a_refused_connection_is_retried_then_typed(http):
    port = closed_port()
    started = time.monotonic()
    async with AsyncClient(f"http://127.0.0.1:{port}", retries=2, timeout_s=5) as client:
        with pytest.raises(ConnectionFailed) as caught:
            await client.infer("anyone?")
    assert caught.value.code == "CONNECTION_FAILED" and time.monotonic() - started < 5

    def sync() -> str:
        try:
            Client(f"http://127.0.0.1:{port}", retries=1).infer("anyone?")
        except ConnectionFailed as exc:
            return exc.code
        return "answered"

    assert await asyncio.to_thread(sync) == "CONNECTION_FAILED"


async def test_an_idempotency_key_is_sent_on_every_attempt_and_the_server_computes_once(http):
    from ..helpers import backend_of

    async with running_server(sim_model(latency_ms=10)) as srv:
        first = await asyncio.to_thread(lambda: Client(srv.url).infer("pay 7", idempotency_key="order-7"))
        async with AsyncClient(srv.url) as client:
            again = await client.infer("pay 7", idempotency_key="order-7")
        assert first.output == again.output == expected_output("pay 7")
        assert backend_of(srv).computed["pay 7"] == 1  # the repeat got the first answer
