"""The router and the operations endpoints, in-process (`wiring`): exact paths as sent, a 405 that says
what is allowed, errors of OpenAI's routes in OpenAI's shape whatever the cause."""

from __future__ import annotations

from inferd.config import AuthConfig

from .wiring import wired


async def test_routes_match_the_path_exactly_as_sent():
    async with wired() as w:
        assert (await w.client.get("/healthz?probe=1")).status == 200  # (a query is not part of the path)
        for path in ("/healthz/", "/HEALTHZ", "/v1/stats/x"):
            resp = await w.client.get(path)
            body = await resp.json()
            assert resp.status == 404 and body["error"] == "NOT_FOUND" and path.split("?")[0] in body["message"]
        resp = await w.client.get("/v1/inference", headers={"X-Request-ID": "mine-1"})
        assert resp.status == 405 and resp.headers["Allow"] == "POST"
        assert (await resp.json())["error"] == "METHOD_NOT_ALLOWED" and resp.headers["X-Request-ID"] == "mine-1"


async def test_openai_routes_answer_errors_in_openais_shape_even_where_nothing_serves_them():
    async with wired() as w:
        # No generation model here: the route is not served, and an OpenAI client still reads why.
        resp = await w.client.post("/v1/chat/completions", json={"model": "m", "messages": []})
        body = await resp.json()
        assert resp.status == 404 and body["error"]["code"] == "MODEL_NOT_FOUND"
        assert body["error"]["type"] == "invalid_request_error" and "no generation model" in body["error"]["message"]
        resp = await w.client.get("/v1/embeddings")
        assert resp.status == 405 and (await resp.json())["error"]["code"] == "METHOD_NOT_ALLOWED"
        resp = await w.client.get("/v1/models/nope")
        assert resp.status == 404 and (await resp.json())["error"]["code"] == "MODEL_NOT_FOUND"
        resp = await w.client.post("/v1/models")
        assert resp.status == 405 and (await resp.json())["error"]["code"] == "METHOD_NOT_ALLOWED"
        resp = await w.client.get("/v1/nothing-here")  # not one of OpenAI's routes: inferd's shape
        assert resp.status == 404 and (await resp.json())["error"] == "NOT_FOUND"


async def test_operations_behind_a_key_refuse_openai_routes_in_openais_shape():
    async with wired(auth=AuthConfig(enabled=True, anonymous_tier="default", operations="key")) as w:
        models = await w.client.get("/v1/models")
        stats = await w.client.get("/v1/stats")
        assert models.status == stats.status == 401
        assert (await models.json())["error"]["code"] == "UNAUTHORIZED" and (await stats.json())["error"] == "UNAUTHORIZED"

