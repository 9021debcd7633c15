"""The HTTP layer with real parts behind it, in this test's loop: `HttpApi` built from a config as the
server builds it (admission, outcomes, a batch model on the simulated GPU), served by aiohttp's
low-level server on loopback. No process, no drain: the handlers and what they ask, nothing else."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp.test_utils import RawTestServer, TestClient

from inferd.admission.admission import Admission
from inferd.admission.auth import Authenticator
from inferd.admission.rate_limits import RateLimiter
from inferd.calls.context import CallContext
from inferd.calls.request_ids import RequestIds
from inferd.config import ModelConfig, ServerConfig
from inferd.errors import Draining
from inferd.http.api import HttpApi
from inferd.http.body_reader import BodyReader
from inferd.http.idempotency import IdempotentReplies
from inferd.http.operations import ServerFigures
from inferd.lifecycle import Lifecycle, Phase
from inferd.models.batch_model import BatchModel
from inferd.models.registry import Models
from inferd.models.versions import ServedModel, VersionState
from inferd.observability.access_log import AccessLog
from inferd.observability.dead_letters import DeadLetters
from inferd.observability.metrics import RequestMetrics
from inferd.observability.outcomes import Outcomes

from ...helpers import until


@dataclass
class Wired:
    api: HttpApi
    client: TestClient
    lifecycle: Lifecycle
    models: dict[str, BatchModel]


def sim(name: str = "m", **kw) -> ModelConfig:  # type: ignore[no-untyped-def]
    return ModelConfig(name=name, backend="inferd.backends.sim:create", max_wait_ms=1,
                       options={"latency_ms": 2, **kw.pop("options", {})}, **kw)


@asynccontextmanager
async def wired(*configs: ModelConfig, start: bool = True, **server) -> AsyncIterator[Wired]:  # type: ignore[no-untyped-def]
    """`HttpApi` over batch models built from `configs` (started and warmed unless `start` is False)."""
    config = ServerConfig(host="127.0.0.1", port=0, models=configs or (sim(),), **server)
    loop = asyncio.get_running_loop()
    lifecycle, metrics, limiter = Lifecycle(), RequestMetrics(), RateLimiter(config)
    built: dict[str, BatchModel] = {}
    served: dict[str, ServedModel] = {}
    for model_config in config.models:
        model = built[model_config.name] = BatchModel(model_config, loop, metrics, tiers=config.tiers)
        served[model_config.name] = ServedModel(model_config.name)
        served[model_config.name].add(model, VersionState.READY)
        served[model_config.name].set_traffic({model_config.version: 1.0})
    models = Models(served, {}, config.models[0].name)
    admission = Admission(lifecycle, Authenticator(config, limiter), limiter, config.tiers)
    context = CallContext(models, admission, Outcomes(metrics, AccessLog("off", 0.0)), lifecycle, RequestIds())
    body = BodyReader(config.max_body_bytes, config.body_timeout_s, lifecycle)
    api = HttpApi(context, body, ServerFigures(limiter, DeadLetters()),
                  IdempotentReplies(admission.auth, body, context.ids, window_s=0.0, max_keys=1))
    for model in built.values():
        if start:
            model.start()
    client = TestClient(RawTestServer(api.handle, host="127.0.0.1"))
    await client.start_server()
    try:
        if start:
            await until(lambda: all(m.ready for m in built.values()))
        lifecycle.phase = Phase.SERVING
        yield Wired(api, client, lifecycle, built)
    finally:
        await client.close()
        for model in built.values():
            await model.stop(Draining("test over"))
            model.pool.release()
