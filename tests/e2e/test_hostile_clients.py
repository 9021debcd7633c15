"""What a hostile client or a careless proxy sends: every answer JSON, with a code and a request id."""

from __future__ import annotations

import asyncio
import hashlib

import orjson

from inferd.config import AuthConfig, TenantConfig, TierConfig
from inferd.http.routes import Route

from ..helpers import infer, running_server, sim_model, until
from .test_connections import connect

KEY, ADMIN = "tenant-key", "admin-key"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def with_auth(operations: str = "open", anonymous: str | None = None) -> dict:
    return dict(auth=AuthConfig(enabled=True, anonymous_tier=anonymous, admin_key_sha256=digest(ADMIN), operations=operations),
                tiers=(TierConfig("paid", priority=1), TierConfig("free")),
                tenants=(TenantConfig("acme", "paid", digest(KEY)),))


async def exchange(url: str, raw: bytes, *, half_close: bool = False) -> tuple[int, dict[str, str], dict]:
    """One raw request; the status, headers and JSON body of the answer."""
    reader, writer = await connect(url)
    writer.write(raw)
    if half_close:
        writer.write_eof()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers["content-length"]))
    writer.close()
    return int(lines[0].split()[1]), headers, orjson.loads(body)


async def test_a_body_that_is_not_the_gzip_it_claims_is_a_400_counted(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        status, headers, body = await exchange(
            srv.url, b"POST /v1/inference HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\nContent-Length: 10\r\n\r\n0123456789")
        counted = sum(n for (_, _, _, code, error), n in srv.models["m"].metrics.requests.items()
                      if (code, error) == (400, "INVALID_INPUT"))
    assert (status, body["error"]) == (400, "INVALID_INPUT") and "gzip" in body["message"]
    assert headers["x-request-id"] == body["request_id"] and headers["server"] == "inferd"
    assert counted == 1


async def test_what_the_http_parser_refuses_is_json_with_a_request_id_and_counted(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        status, headers, body = await exchange(srv.url, b"GARBAGE / HTTP/1.1\r\n\r\n")
        answers = dict(srv.models["m"].metrics.requests)
    assert (status, body["error"]) == (400, "MALFORMED_REQUEST") and headers["x-request-id"] == body["request_id"]
    assert answers.get(("-", "", "-", 400, "MALFORMED_REQUEST")) == 1


async def test_a_malformed_chunk_after_the_headers_is_a_400_at_once_not_a_timeout(http):
    async with running_server(sim_model(latency_ms=5), body_timeout_s=30) as srv:
        reader, writer = await connect(srv.url)
        writer.write(b"POST /v1/inference HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"inp\r\n")
        await until(lambda: any(h._current_request is not None for h in srv.connections._connections))  # reading it
        started = asyncio.get_running_loop().time()
        writer.write(b"ZZ\r\nnot a chunk\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        took = asyncio.get_running_loop().time() - started
        body = orjson.loads(await reader.read())
        writer.close()
    assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head, head
    assert body["error"] == "INVALID_INPUT" and "malformed body" in body["message"] and took < 5, body


async def test_a_bug_in_a_handler_is_a_json_500_for_that_request_alone(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        async def broken(request):
            raise RuntimeError("a bug")
        srv.api.routes["/healthz"] = Route("GET", broken)
        async with http.get(f"{srv.url}/healthz", headers={"X-Request-ID": "mine-1"}) as resp:
            status, body = resp.status, await resp.json()
        assert (status, body["error"], body["request_id"]) == (500, "INTERNAL_ERROR", "mine-1")
        assert (await infer(http, srv.url, {"input": "others are fine"}))[0] == 200


async def test_routing_is_on_the_path_as_sent_not_percent_decoded(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        status, _, body = await exchange(srv.url, b"GET /%6Detrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (status, body["error"]) == (404, "NOT_FOUND")
        async with http.get(f"{srv.url}/v1/models?verbose=1") as resp:
            assert resp.status == 200  # a query string is not part of the path


async def test_with_answer_half_closed_a_client_that_half_closes_after_sending_gets_its_answer(http):
    # (By default its end of input means it went away: tests/e2e/test_server.py, the disconnected client.)
    async with running_server(sim_model(latency_ms=50), answer_half_closed=True) as srv:
        status, _, body = await exchange(
            srv.url, b'POST /v1/inference HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\n\r\n{"input": "bye"}', half_close=True)
    assert status == 200 and body["output"].startswith("bye")


async def test_auth_comes_first_and_401_says_how_to_authenticate(http):
    async with running_server(sim_model(latency_ms=5), **with_auth()) as srv:
        for path, payload in (("/v1/inference", {"model": "nope"}), ("/v1/embeddings", {"input": 5, "model": "nope"})):
            async with http.post(f"{srv.url}{path}", json=payload) as resp:
                assert resp.status == 401, path
                assert resp.headers["WWW-Authenticate"].startswith("Bearer")


async def test_operations_endpoints_can_require_a_key_or_the_admin_key(http):
    async with running_server(sim_model(latency_ms=5), **with_auth("key", anonymous="free")) as srv:
        for path in ("/metrics", "/v1/stats", "/v1/models", "/info"):  # (/info names the models, as /v1/models)
            async with http.get(f"{srv.url}{path}") as resp:
                assert resp.status == 401, path
            for key in (KEY, ADMIN):
                async with http.get(f"{srv.url}{path}", headers={"Authorization": f"Bearer {key}"}) as resp:
                    assert resp.status == 200 and resp.headers["Server"] == "inferd", path
        for path in ("/healthz", "/health", "/readyz"):
            async with http.get(f"{srv.url}{path}") as resp:
                assert resp.status == 200, path  # health checks stay open...
                assert "models" not in await resp.json(), path  # ...and name no model to a caller without a key
        async with http.get(f"{srv.url}/readyz", headers={"Authorization": f"Bearer {KEY}"}) as resp:
            assert (await resp.json())["models"]["m"]["ready"]  # (with one: the details)
    async with running_server(sim_model(latency_ms=5), **with_auth("admin")) as srv:
        async with http.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {KEY}"}) as resp:
            assert resp.status == 403
        async with http.get(f"{srv.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}) as resp:
            assert resp.status == 200


async def test_a_request_target_in_absolute_form_is_routed_by_its_path(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        host = srv.url.removeprefix("http://")
        status, _, body = await exchange(
            srv.url, f'POST http://{host}/v1/inference HTTP/1.1\r\nHost: {host}\r\nContent-Length: 16\r\n\r\n'
                     '{"input": "abs"}'.encode())
        assert status == 200 and body["output"].startswith("abs")
        status, _, body = await exchange(srv.url, f"GET http://{host}/%6Detrics HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert (status, body["error"]) == (404, "NOT_FOUND")  # still the path as sent
        status, _, body = await exchange(srv.url, f"GET http://{host}/v1/models/m?x=1 HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        assert (status, body["id"]) == (200, "m")
