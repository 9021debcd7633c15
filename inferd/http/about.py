"""The probes and the short answers about the server.

Ours for load balancers and Kubernetes: `/healthz` (the process is up) and `/readyz` (send traffic
here?). The ones other servers' clients probe first, so that a client written for TEI or vLLM finds
them: `/health` (200 when it can serve), `/version` (vLLM's), and `/info` (TEI's: what is served, with
which limits). The probes stay open; what names the models (`/info`, `/readyz`'s details) is under
the operations endpoints' rule (`[auth] operations`, as `GET /v1/models`): a caller without the key
learns only the probe's status.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from .. import __version__
from ..calls.context import CallContext, CallHandlers
from ..config import ModelConfig
from ..errors import InferdError, describe
from ..models.batch_model import BatchModel
from .responses import error_response, json_response


class AboutApi(CallHandlers):
    """The probes, `/version` and `/info`; `ready` is the server's answer to "send traffic here?"."""

    def __init__(self, context: CallContext, ready: Callable[[], bool]) -> None:
        super().__init__(context)
        self._ready = ready
        self.auth = context.admission.auth

    def _may_see_models(self, request: web.BaseRequest) -> InferdError | None:
        """None where the caller may learn which models are served, else why not (`[auth] operations`)."""
        if self.auth.config.operations == "open":
            return None
        try:
            self.auth.require_operations(request.headers)
        except InferdError as error:
            return error
        return None

    async def healthz(self, request: web.BaseRequest) -> web.StreamResponse:
        return json_response({"status": "ok"}, self._id(request))

    async def readyz(self, request: web.BaseRequest) -> web.StreamResponse:
        models: dict[str, dict[str, Any]] = {name: _readiness(m) for name, m in self.models.batch.items()}
        for name, served in self.models.served.items():  # (the default version decides; the others are listed)
            if name in models and len(served.versions) > 1:
                models[name]["versions"] = {v: f.state.value for v, f in served.versions.items()}
        for name, g in self.models.generation.items():
            models[name] = {"ready": g.ready, "kind": "generation"}
            if g.start_error is not None:
                models[name]["error"] = describe(g.start_error)
        ready = self._ready()
        payload: dict[str, Any] = {"ready": ready, "phase": self.lifecycle.phase.value}
        if self._may_see_models(request) is None:  # (a probe without the key gets its status, not the models)
            payload["models"] = models
        return json_response(payload, self._id(request), status=200 if ready else 503)

    async def health(self, request: web.BaseRequest) -> web.StreamResponse:
        """TEI's and vLLM's probe: 200 when every model taking traffic can serve (as `/readyz`), else 503."""
        ready = self._ready()
        return json_response({"status": "ok" if ready else "unavailable"}, self._id(request), status=200 if ready else 503)

    async def version(self, request: web.BaseRequest) -> web.StreamResponse:
        return json_response({"version": __version__}, self._id(request))

    async def info(self, request: web.BaseRequest) -> web.StreamResponse:
        """TEI's `model_id` (the default model) and the batch limits its clients read, then every model's."""
        refused = self._may_see_models(request)
        if refused is not None:
            return error_response(refused, self._id(request))
        models = [_batch_info(name, model) for name, model in self.models.batch.items()]
        models += [{"id": name, "kind": "generation", "ready": model.ready,
                    "max_model_len": model.engine.max_model_len if model.engine is not None else None}
                   for name, model in self.models.generation.items()]
        default = next((m for m in models if m["id"] == self.models.default), models[0] if models else {})
        payload = {"version": __version__, "model_id": default.get("id"),
                   "model_type": _TEI_MODEL_TYPES.get(default.get("output_kind") or "", {}),
                   **{key: default.get(key) for key in ("model_dtype", "max_input_length", "auto_truncate",
                                                        "max_batch_tokens", "max_concurrent_requests")},
                   "max_client_batch_size": default.get("max_inputs_per_call"),
                   "max_batch_requests": default.get("max_batch_size"), "models": models}
        return json_response(payload, self._id(request))

    def _id(self, request: web.BaseRequest) -> str:
        return self.ids.pick(request.headers.get("X-Request-ID"))


# TEI's `model_type`, by a model's output kind (its pooling: the text backend's mean pooling)
_TEI_MODEL_TYPES: dict[str, dict[str, Any]] = {"embedding": {"embedding": {"pooling": "mean"}}, "classification": {"classifier": {}},
                                               "rerank": {"reranker": {}}}


def _readiness(model: BatchModel) -> dict[str, Any]:
    state: dict[str, Any] = {"ready": model.ready, "ready_workers": model.pool.healthy, "workers": len(model.pool.workers),
                             "breaker": model.breaker.state.value}
    if model.start_error is not None:
        state["error"] = describe(model.start_error)
    return state


def _batch_info(name: str, model: BatchModel) -> dict[str, Any]:
    c = model.config
    return {"id": name, "kind": "batch", "ready": model.ready, "version": c.version, "output_kind": model.output_kind,
            "inputs": model.input_kind, "max_batch_size": c.max_batch_size, "max_wait_ms": c.max_wait_ms,
            "max_batch_tokens": c.max_batch_tokens, "max_input_chars": c.max_input_chars,
            "max_inputs_per_call": c.max_inputs_per_call, "timeout_ms": c.timeout_ms,
            "model_dtype": _text_option(c, "dtype", "float32"), "max_input_length": _text_option(c, "max_tokens", 256),
            "auto_truncate": _text_option(c, "truncate", True), "max_concurrent_requests": c.max_queue}


def _text_option(config: ModelConfig, key: str, default: Any) -> Any:
    """TEI's figures as the text backend's options set them (its defaults where unset); None for another backend."""
    return config.options.get(key, default) if config.backend == "inferd.backends.transformer:create" else None
