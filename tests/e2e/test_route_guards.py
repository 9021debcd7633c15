"""Every route, walked: the guard that a new route cannot forget (issue 79).

The tables below name every route of the HTTP route table (its exact paths and what lies under its
prefixes) and every call of the gRPC service, each with its scope. A route added without a line here
fails the first test. Against one real server with a model of each kind, under `[auth]` with no
anonymous tier and `operations = "key"`:
- a caller without a key gets 401 (gRPC: UNAUTHENTICATED) on every route but the health probes and
  the API document, and those name no model;
- every call route answers a valid call, and a caller past its rate limit gets 429 on each of them
  (bounded: what a route computes is under the caller's limit);
- every call route is counted by the lifecycle (a drain waits for it);
- after calls that name made-up models, on every route and over gRPC, no metric label carries a name
  the server does not serve.
"""

from __future__ import annotations

import asyncio
import hashlib
import re

import aiohttp
import pytest
import pytest_asyncio

pytest.importorskip("transformers")
grpc = pytest.importorskip("grpc")

from tritonclient.grpc import service_pb2 as pb  # noqa: E402
from tritonclient.grpc import service_pb2_grpc as pb_grpc  # noqa: E402

from inferd.backends.small_models import build_classifier, build_cross_encoder  # noqa: E402
from inferd.config import AuthConfig, ModelConfig, TenantConfig, TierConfig  # noqa: E402

from ..helpers import running_server, sim_model  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="module")

KEYS = {"open": "guard-open-key", "limited": "guard-limited-key", "admin": "guard-admin-key"}
MODELS = {"emb", "sim", "rr", "clf", "gen", "mini"}
V2_INFER = {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["v2 call"]}]}

# Every exact path: (its scope, a valid call's body when it computes, or None).
ROUTES: dict[str, tuple[str, dict | None]] = {
    "/v1/inference": ("key", {"model": "sim", "input": "one"}),
    "/api/inference": ("key", {"model": "sim", "input": "two"}),
    "/v1/embeddings": ("key", {"model": "emb", "input": "three"}),
    "/v1/rerank": ("key", {"model": "rr", "query": "q", "documents": ["a", "b"]}),
    "/rerank": ("key", {"query": "q", "texts": ["a", "b"]}),
    "/embed": ("key", {"inputs": "four"}),
    "/v2/embed": ("key", {"model": "emb", "texts": ["five"], "input_type": "search_document"}),
    "/v1/classify": ("key", {"model": "clf", "input": "six"}),
    "/predict": ("key", {"inputs": "seven"}),
    "/": ("key", {"inputs": "eight"}),
    "/tokenize": ("key", {"inputs": "nine"}),
    "/decode": ("key", {"ids": [101, 102]}),
    "/v1/completions": ("key", {"model": "gen", "prompt": "ten", "max_tokens": 2}),
    "/v1/chat/completions": ("key", {"model": "gen", "messages": [{"role": "user", "content": "eleven"}], "max_tokens": 2}),
    "/embeddings": ("key", {"model": "emb", "input": "twelve"}), "/classify": ("key", {"model": "clf", "input": "thirteen"}),
    "/similarity": ("key", {"inputs": {"source_sentence": "fourteen", "sentences": ["fifteen"]}}),
    "/embed_all": ("key", {"model": "mini", "inputs": "sixteen"}),
    "/models": ("key", None), "/ping": ("probe", None),
    "/healthz": ("probe", None), "/readyz": ("probe", None), "/health": ("probe", None), "/version": ("probe", None),
    "/openapi.json": ("document", None), "/docs": ("document", None), "/docs/swagger-ui.css": ("document", None),
    "/docs/swagger-ui-bundle.js": ("document", None), "/docs/favicon-32x32.png": ("document", None),
    "/info": ("key", None), "/v1/models": ("key", None), "/v1/stats": ("key", None), "/v1/limits": ("key", None),
    "/metrics": ("key", None), "/v1/dead-letters": ("admin", None),
}
# What lies under each prefix: (method, path, scope, a valid call's body when it computes).
UNDER_PREFIXES: dict[str, list[tuple[str, str, str, dict | None]]] = {
    "/v1/admin/models": [("GET", "/v1/admin/models", "admin", None), ("PUT", "/v1/admin/models/sim/traffic", "admin", None),
                         ("DELETE", "/v1/admin/models/sim/versions/9", "admin", None),
                         ("GET", "/v1/admin/models/gen/adapters", "admin", None)],
    "/v2": [("GET", "/v2/health/live", "probe", None), ("GET", "/v2/health/ready", "probe", None),
            ("GET", "/v2", "probe", None), ("POST", "/v2/repository/index", "key", None), ("GET", "/v2/models/sim", "key", None),
            ("GET", "/v2/models/sim/ready", "key", None), ("GET", "/v2/models/sim/config", "key", None),
            ("GET", "/v2/models/sim/stats", "key", None),
            ("GET", "/v2/models/sim/versions/1", "key", None), ("POST", "/v2/models/sim/infer", "key", V2_INFER)],
    "/v1/models/": [("GET", "/v1/models/sim", "key", None)],
}
# Every call of the gRPC service: its scope ("unimplemented": the protocol's, not served).
GRPC_CALLS = {
    "ServerLive": "probe", "ServerReady": "probe", "ServerMetadata": "probe", "ModelReady": "key", "ModelMetadata": "key",
    "ModelConfig": "key", "RepositoryIndex": "key", "ModelInfer": "key", "ModelStatistics": "key",
    **dict.fromkeys(("ModelStreamInfer", "RepositoryModelLoad", "RepositoryModelUnload",
                     "SystemSharedMemoryStatus", "SystemSharedMemoryRegister", "SystemSharedMemoryUnregister",
                     "CudaSharedMemoryStatus", "CudaSharedMemoryRegister", "CudaSharedMemoryUnregister",
                     "TraceSetting", "LogSettings"), "unimplemented"),
}


def bearer(who: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[who]}"}


def every_call() -> list[tuple[str, str, dict]]:
    """(method, path, body) of every route that computes."""
    calls = [("POST", path, body) for path, (_, body) in ROUTES.items() if body is not None]
    return calls + [(m, p, b) for under in UNDER_PREFIXES.values() for m, p, _, b in under if b is not None]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(tmp_path_factory):
    reranker = str(build_cross_encoder(tmp_path_factory.mktemp("rr")))
    classifier = str(build_classifier(tmp_path_factory.mktemp("clf")))
    models = (
        sim_model("emb", backend="tests.fakes:fake_embedder", latency_ms=5),  # (first: the TEI routes' default)
        sim_model("sim", latency_ms=5),
        ModelConfig(name="rr", backend="inferd.backends.transformer:create", max_wait_ms=5,
                    options={"model_path": reranker, "task": "rerank", "max_tokens": 32, "bucket_edges": [32]}),
        ModelConfig(name="clf", backend="inferd.backends.transformer:create", max_wait_ms=5,
                    options={"model_path": classifier, "task": "classification", "max_tokens": 32, "bucket_edges": [32]}),
        ModelConfig(name="gen", kind="generation", backend="inferd.backends.echo_engine"),
        ModelConfig(name="mini", backend="inferd.backends.transformer:create", max_wait_ms=5,  # (the packaged MiniLM: /embed_all)
                    options={"max_tokens": 32, "bucket_edges": [32]}),
    )
    sha = {who: hashlib.sha256(key.encode()).hexdigest() for who, key in KEYS.items()}
    config = dict(
        auth=AuthConfig(enabled=True, anonymous_tier=None, operations="key", admin_key_sha256=sha["admin"]),
        tiers=(TierConfig("unlimited"), TierConfig("limited", rate_per_s=0.001, burst=4)),
        tenants=(TenantConfig("open-co", "unlimited", sha["open"]), TenantConfig("limited-co", "limited", sha["limited"])),
        grpc_port=0,
    )
    async with running_server(*models, ready_timeout_s=120, **config) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client():
    async with aiohttp.ClientSession() as session:
        yield session


async def call(client, server, method, path, body=None, headers=None) -> tuple[int, bytes]:
    async with client.request(method, f"{server.url}{path}", json=body, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_every_route_of_the_table_and_every_grpc_call_has_its_line_here(server):
    api = server.api
    assert set(api.routes) == set(ROUTES), set(api.routes) ^ set(ROUTES)
    assert {prefix for prefix, _ in api.prefixes} == set(UNDER_PREFIXES)
    served = {name for name in dir(pb_grpc.GRPCInferenceServiceServicer) if not name.startswith("_")}
    assert served == set(GRPC_CALLS), served ^ set(GRPC_CALLS)
    for path, (_, body) in ROUTES.items():  # (what computes is counted by the lifecycle: a drain waits for it)
        assert api.routes[path].counted == (body is not None), path


async def test_without_a_key_only_the_probes_and_the_document_answer_and_they_name_no_model(server, client):
    walked = [(route.method, path, scope) for path, route in server.api.routes.items() for scope in [ROUTES[path][0]]]
    walked += [(m, p, scope) for under in UNDER_PREFIXES.values() for m, p, scope, _ in under]
    for method, path, scope in walked:
        status, body = await call(client, server, method, path, {} if method in ("POST", "PUT") else None)
        if scope in ("probe", "document"):
            assert status == 200, (path, status)
            if scope == "probe":
                assert not any(re.search(rf'"{name}"', body.decode()) for name in MODELS), (path, body[:300])
        else:
            assert status == 401, (method, path, status, body[:200])
    for method, path, scope in walked:  # a tenant's key is no admin key
        if scope == "admin":
            status, _ = await call(client, server, method, path, {} if method in ("POST", "PUT") else None, bearer("open"))
            assert status in (401, 403), (path, status)


async def test_every_call_route_answers_and_is_under_the_callers_rate_limit(server, client):
    for method, path, body in every_call():
        status, answer = await call(client, server, method, path, body, bearer("open"))
        assert status == 200, (path, status, answer[:300])
    for method, path, body in every_call():
        statuses = [(await call(client, server, method, path, body, bearer("limited")))[0] for _ in range(6)]
        assert 429 in statuses and set(statuses) <= {200, 429}, (path, statuses)


async def test_made_up_model_names_leave_no_label_behind(server, client):
    for method, path, body in every_call():
        made_up = {**body, "model": "made-up-model"} if "model" in body else body
        if "/v2/models/" in path:
            path = path.replace("/sim/", "/made-up-model/")
        for headers in (bearer("open"), None, {"Authorization": "Bearer made-up-key"}):
            status, _ = await call(client, server, method, path, made_up, headers)
            assert status < 500, (path, status)

    def grpc_calls():
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        codes = []
        for metadata in ((("authorization", f"Bearer {KEYS['open']}"),), ()):
            for name in ("made-up-model", "sim"):
                try:
                    stub.ModelInfer(pb.ModelInferRequest(model_name=name), metadata=metadata, timeout=10)
                except grpc.RpcError as error:
                    codes.append(error.code())
        channel.close()
        return codes

    codes = await asyncio.to_thread(grpc_calls)
    assert grpc.StatusCode.UNAUTHENTICATED in codes and grpc.StatusCode.NOT_FOUND in codes
    status, text = await call(client, server, "GET", "/metrics", None, bearer("open"))
    assert status == 200
    labels = re.findall(r'(model|model_name|tier|tenant)="([^"]*)"', text.decode())
    unknown = {(k, v) for k, v in labels if v not in MODELS | {"-", "", "unlimited", "limited", "open-co", "limited-co"}}
    assert not unknown, sorted(unknown)[:10]


async def test_every_grpc_call_needs_its_key_but_the_probes(server, caplog):
    methods = {name: getattr(pb, f"{name}Request") for name in GRPC_CALLS if name != "ModelStreamInfer"}

    def walk():
        channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
        seen = {}
        for name, request in methods.items():
            call_ = channel.unary_unary(f"/inference.GRPCInferenceService/{name}", request_serializer=request.SerializeToString,
                                        response_deserializer=lambda b: b)
            try:
                call_(request(name="sim") if "name" in request.DESCRIPTOR.fields_by_name else request(), timeout=10)
                seen[name] = grpc.StatusCode.OK
            except grpc.RpcError as error:
                seen[name] = error.code() if hasattr(error, "code") else None
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer",  # (its requests: ModelInfer's)
                                       request_serializer=pb.ModelInferRequest.SerializeToString,
                                       response_deserializer=lambda b: b)
        try:
            list(stream(iter([pb.ModelInferRequest(model_name="sim")]), timeout=10))
            seen["ModelStreamInfer"] = grpc.StatusCode.OK
        except grpc.RpcError as error:
            seen["ModelStreamInfer"] = error.code()
        channel.close()
        return seen

    seen = await asyncio.to_thread(walk)
    assert not [r for r in caplog.records if r.levelname == "ERROR"], [r.getMessage() for r in caplog.records][:3]
    for name, scope in GRPC_CALLS.items():
        expected = {"probe": grpc.StatusCode.OK, "key": grpc.StatusCode.UNAUTHENTICATED,
                    "unimplemented": grpc.StatusCode.UNIMPLEMENTED}[scope]
        assert seen[name] == expected, (name, seen[name])
