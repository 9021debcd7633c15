"""`inference.GRPCInferenceService`, the Open Inference Protocol's gRPC service, for batch models: the
server's and each model's liveness, readiness and metadata, Triton's model configuration, statistics and
repository index, and ModelInfer.

An infer call goes the way of its HTTP twin (`http.open_inference`): the caller identified from the
call's metadata (`authorization` or `x-api-key`, as HTTP's headers), each element of its input tensor
admitted and batched like a request of its own, the same tiers, tenants, deadlines, shared work,
metrics, access log and trace. The client's gRPC deadline bounds the request as a `timeout` would; a
client that cancels (or whose deadline passes) cancels the handler, and its inputs still waiting are
withdrawn, never computed, as an HTTP client's that disconnects. An error ends the call with the gRPC
status its HTTP status maps to, inferd's stable code in the trailing metadata (`inferd-code`).
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Any

import grpc
from google.protobuf import json_format
from multidict import CIMultiDict, CIMultiDictProxy
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

from ..calls.batch_calls import BatchCalls
from ..calls.catalog import model_metadata, model_statistics, repository_index, routed_model, server_metadata, triton_config
from ..calls.context import CallContext, CallHandlers
from ..errors import InferdError, InternalError, describe
from ..models.batch_model import BatchModel
from ..observability.outcomes import Call
from .wire import infer_response, parse_infer, status_of

INFER_ROUTE = "/inference.GRPCInferenceService/ModelInfer"  # (the span's route)
log = logging.getLogger("inferd.grpc")
Context = grpc.aio.ServicerContext


class OpenInferenceService(CallHandlers, pb_grpc.GRPCInferenceServiceServicer):
    """The service's calls, answered from the models and the gate HTTP shares (see the module docstring)."""

    def __init__(self, context: CallContext) -> None:
        super().__init__(context)
        self.calls = BatchCalls(context.admission, context.outcomes)

    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self.lifecycle.serving and self.models.ready)

    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**server_metadata())

    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        model = await self._model(request.name, request.version, context)
        return pb.ModelReadyResponse(ready=model.ready)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        model = await self._model(request.name, request.version, context)
        return json_format.ParseDict(model_metadata(self.models, model), pb.ModelMetadataResponse())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        model = await self._model(request.name, request.version, context)
        config = json_format.ParseDict(triton_config(model), model_config_pb2.ModelConfig())
        return pb.ModelConfigResponse(config=config)

    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> pb.RepositoryIndexResponse:
        try:
            self._operations(context)
        except InferdError as error:
            await _abort(context, error, "")
        rows = repository_index(self.models, request.ready)
        return pb.RepositoryIndexResponse(models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> pb.ModelStatisticsResponse:
        """Triton's statistics of one model version, or (no name) of every batch model's default one."""
        if request.name:
            models = [await self._model(request.name, request.version, context)]
        else:
            try:
                self._operations(context)
            except InferdError as error:
                await _abort(context, error, "")
            models = [routed_model(self.models, name, None) for name in self.models.batch]
        stats = [model_statistics(model, self.outcomes.metrics) for model in models]
        return json_format.ParseDict({"model_stats": stats}, pb.ModelStatisticsResponse())

    async def _model(self, name: str, version: str, context: Context) -> BatchModel:
        """The model a metadata call names, once the caller may ask (as HTTP's GET /v1/models); else the
        call ends with the error's status."""
        try:
            self._operations(context)
            return routed_model(self.models, name, version or None)
        except InferdError as error:
            await _abort(context, error, "")
            raise  # (abort raises; for the type checker)

    def _operations(self, context: Context) -> None:
        if self.admission.auth.config.operations != "open":
            self.admission.auth.require_operations(_headers(context))

    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        headers = _headers(context)
        call = Call(time.monotonic(), self.ids.pick(headers.get("x-request-id") or request.id or None))
        tracing = self.tracing
        if tracing is not None:
            call.trace = tracing.begin(headers, call.started, INFER_ROUTE)
        status = 499  # (what the span says when the client went first)
        self.lifecycle.enter()
        try:
            answer = await self._infer(request, headers, call, context)
            status = answer.status if isinstance(answer, InferdError) else 200
        finally:
            self.lifecycle.leave()
            if tracing is not None and call.trace is not None:
                tracing.end(call.trace, call.request_id, status)
        if isinstance(answer, InferdError):
            await _abort(context, answer, call.request_id)
        context.set_trailing_metadata((("x-request-id", call.request_id),))
        return answer  # (abort raised otherwise)

    # The protocol's calls inferd does not serve. The base servicer's stand-ins raise, which gRPC logs as
    # an error with its traceback on every call (a client could fill the log with them): these end the
    # call with UNIMPLEMENTED and log nothing.
    async def ModelStreamInfer(self, request: Any, context: Context) -> None:
        await _not_served(context, "ModelStreamInfer")

    async def RepositoryModelLoad(self, request: Any, context: Context) -> None:
        await _not_served(context, "RepositoryModelLoad")

    async def RepositoryModelUnload(self, request: Any, context: Context) -> None:
        await _not_served(context, "RepositoryModelUnload")

    async def SystemSharedMemoryStatus(self, request: Any, context: Context) -> None:
        await _not_served(context, "SystemSharedMemoryStatus")

    async def SystemSharedMemoryRegister(self, request: Any, context: Context) -> None:
        await _not_served(context, "SystemSharedMemoryRegister")

    async def SystemSharedMemoryUnregister(self, request: Any, context: Context) -> None:
        await _not_served(context, "SystemSharedMemoryUnregister")

    async def CudaSharedMemoryStatus(self, request: Any, context: Context) -> None:
        await _not_served(context, "CudaSharedMemoryStatus")

    async def CudaSharedMemoryRegister(self, request: Any, context: Context) -> None:
        await _not_served(context, "CudaSharedMemoryRegister")

    async def CudaSharedMemoryUnregister(self, request: Any, context: Context) -> None:
        await _not_served(context, "CudaSharedMemoryUnregister")

    async def TraceSetting(self, request: Any, context: Context) -> None:
        await _not_served(context, "TraceSetting")

    async def LogSettings(self, request: Any, context: Context) -> None:
        await _not_served(context, "LogSettings")

    async def _infer(self, request: pb.ModelInferRequest, headers: CIMultiDictProxy[str], call: Call,
                     context: Context) -> pb.ModelInferResponse | InferdError:
        """The call's answer, or the error it ends with (recorded either way). The call's model is named
        once it is routed: a name the client made up is no label (5,000 made-up names once left 120,000
        series in /metrics), as HTTP records "-" for an unknown model."""
        try:
            who = self.admission.identify(headers)  # (before the model: an unknown caller learns nothing of them)
            call.tier, call.tenant = who.tier, who.tenant
            model = routed_model(self.models, request.model_name, request.model_version or None)
            call.model, call.version = model.name, model.version
            parsed = parse_infer(request, model.input_kind == "image", model.config.max_inputs_per_call,
                                 context.time_remaining())
            self.calls.admit(model, call, parsed.inputs, who, parsed.timeout_ms, True)
            response = infer_response(model.name, model.version, parsed.id, await self.calls.answers(model, call))
        except InferdError as error:
            self.outcomes.record_error(call, error)
            return error
        except Exception as exc:  # noqa: BLE001 - a bug: this call's INTERNAL, logged, as HTTP answers a handler's 500
            log.error("request %s failed: %s", call.request_id, describe(exc), exc_info=exc)
            failure = InternalError("internal error (logged with this request id)")
            self.outcomes.record_error(call, failure)
            return failure
        self.outcomes.record(call)
        return response


async def _abort(context: Context, error: InferdError, request_id: str) -> None:
    """End the call with the error's status (raises, as gRPC's abort does)."""
    code, trailing = status_of(error)
    await context.abort(code, error.message, ((("x-request-id", request_id),) if request_id else ()) + trailing)


async def _not_served(context: Context, name: str) -> None:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not served by inferd")


def _headers(context: Context) -> CIMultiDictProxy[str]:
    """The call's metadata as the headers admission reads (gRPC's keys are lower case already; a binary
    `-bin` entry is no header anyone reads)."""
    return CIMultiDictProxy(CIMultiDict((key, value) for key, value in context.invocation_metadata() or ()
                                        if isinstance(value, str)))


async def start_grpc_server(service: OpenInferenceService, host: str, port: int, max_message_bytes: int) -> tuple[grpc.aio.Server, int]:
    """The service listening on `host:port` (0: a free port), on the running loop: the server and its
    port. A port taken is an OSError, as HTTP's is (gRPC's own SO_REUSEPORT would share it silently)."""
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", max_message_bytes)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(service, server)
    try:
        bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as exc:  # (gRPC says no more than that it failed to bind)
        raise OSError(errno.EADDRINUSE, f"gRPC could not bind it ({exc})", f"{host}:{port}") from None
    await server.start()
    return server, bound
