"""Error bodies in inferd's and OpenAI's shapes, and a whole response's bytes."""

from __future__ import annotations

from types import SimpleNamespace

import orjson

from inferd.errors import RateLimited, ServiceOverloaded
from inferd.http.responses import WholeResponse, error_response


def test_inferd_and_openai_error_shapes_with_retry_advice():
    error = ServiceOverloaded("queue full", retry_after_ms=1500)
    ours = error_response(error, "r1")
    assert orjson.loads(ours._whole_body) == {"error": "SERVICE_OVERLOADED", "message": "queue full", "request_id": "r1",
                                              "retry_after_ms": 1500}
    assert ("Retry-After", "2") in ours._extra
    theirs = orjson.loads(error_response(RateLimited("slow down", retry_after_ms=10), "r2", openai=True)._whole_body)
    assert theirs["error"] == {"message": "slow down", "type": "rate_limit_error", "param": None, "code": "RATE_LIMITED",
                               "retry_after_ms": 10}


class Writer:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data


async def test_a_whole_response_is_one_write_with_its_length_and_keep_alive_decided_by_the_request():
    writer = Writer()
    response = WholeResponse(201, b'{"a":1}', (("X-Request-ID", "r"),))
    await response.prepare(SimpleNamespace(method="POST", keep_alive=True, writer=writer))  # type: ignore[arg-type]
    head, body = writer.data.split(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 201 Created" and body == b'{"a":1}'
    assert b"Content-Length: 7" in lines and b"X-Request-ID: r" in lines and b"Connection: close" not in lines
    assert response.keep_alive
    closing, writer = WholeResponse(503, b"{}", close=True), Writer()
    await closing.prepare(SimpleNamespace(method="POST", keep_alive=True, writer=writer))  # type: ignore[arg-type]
    assert b"Connection: close\r\n" in writer.data and not closing.keep_alive
    await closing.prepare(SimpleNamespace(method="POST", keep_alive=True, writer=writer))  # a second prepare writes nothing
    assert writer.data.count(b"HTTP/1.1") == 1
