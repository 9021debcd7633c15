"""Responses written whole (status line, headers, body in one write), seen from a raw socket: framing,
keep-alive and close as HTTP/1.0 and HTTP/1.1 clients expect them."""

from __future__ import annotations

import asyncio

import orjson

from inferd.backends.sim import expected_output

from ..helpers import running_server, sim_model


def post(body: bytes, version: str = "1.1", extra: str = "") -> bytes:
    return (f"POST /v1/inference HTTP/{version}\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    head = (await reader.readuntil(b"\r\n\r\n")).decode()
    status, *lines = head.split("\r\n")[:-2]
    headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
    body = await reader.readexactly(int(headers["content-length"]))
    return status, headers, body


async def test_pipelined_keep_alive_requests_are_answered_in_order_on_one_connection():
    async with running_server(sim_model(latency_ms=5)) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"".join(post(orjson.dumps({"input": f"p{i}"})) for i in range(3)))
        await writer.drain()
        for i in range(3):
            status, headers, body = await read_response(reader)
            assert status == "HTTP/1.1 200 OK"
            assert orjson.loads(body)["output"] == expected_output(f"p{i}")
            assert headers["content-type"] == "application/json" and headers["x-request-id"]
            assert headers["date"].endswith("GMT") and headers["server"] == "inferd"
            assert "connection" not in headers  # kept alive
        writer.write(post(b'{"input": 3}'))  # an error answer keeps the connection too
        status, headers, body = await read_response(reader)
        assert status == "HTTP/1.1 400 Bad Request" and orjson.loads(body)["error"] == "INVALID_INPUT"
        writer.close()


async def test_an_http_1_0_client_without_keep_alive_gets_connection_close_and_the_socket_closes():
    async with running_server(sim_model(latency_ms=5)) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(post(b'{"input": "old"}', version="1.0"))
        status, headers, body = await read_response(reader)
        assert status.endswith("200 OK") and headers["connection"] == "close"
        assert orjson.loads(body)["output"] == expected_output("old")
        assert await asyncio.wait_for(reader.read(), 5) == b""  # the server closed it
        writer.close()


async def test_a_wrong_method_answers_405_with_allow():
    async with running_server(sim_model(latency_ms=5)) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"GET /v1/inference HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = await read_response(reader)
        assert status == "HTTP/1.1 405 Method Not Allowed" and headers["allow"] == "POST"
        assert orjson.loads(body)["error"] == "METHOD_NOT_ALLOWED"
        writer.close()
