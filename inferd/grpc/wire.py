"""The protocol's messages as gRPC carries them, read into the same call the HTTP route reads
(`http.open_inference_wire.InferBody`) and written from the same output tensor, and inferd's errors as
gRPC status codes.

An infer request's one input tensor, `text` (`image` for an image model), holds its elements in
`raw_input_contents` (each a 4-byte little-endian length and the bytes, as tritonclient sends them) or
in `contents.bytes_contents`. The answer's one output tensor goes in `raw_output_contents`, as Triton
answers gRPC: FP32 as little-endian floats, BYTES length-prefixed.
"""

from __future__ import annotations

import math
from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as pb

from ..errors import InferdError, InvalidInput
from ..wire.open_inference import (
    IMAGE_INPUT,
    INPUT,
    OUTPUT,
    InferBody,
    element_count,
    input_values,
    output_tensor,
    timeout_parameter_ms,
    unpack_bytes,
)

# An error's HTTP status as a gRPC status code (gRPC's own mapping read the other way, for the statuses
# inferd answers with); the stable code travels beside it in the trailing metadata, `inferd-code`.
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND, 405: grpc.StatusCode.UNIMPLEMENTED, 408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.ABORTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED, 422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE, 504: grpc.StatusCode.DEADLINE_EXCEEDED, 507: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def status_of(error: InferdError) -> tuple[grpc.StatusCode, tuple[tuple[str, str], ...]]:
    """The gRPC status an error ends a call with, and its trailing metadata: inferd's stable code, and
    for a 503 how long to wait before retrying."""
    trailing: tuple[tuple[str, str], ...] = (("inferd-code", error.code),)
    if error.retry_after_ms is not None:
        trailing += (("retry-after-ms", str(error.retry_after_ms)),)
    return STATUS_CODES.get(error.status, grpc.StatusCode.UNKNOWN), trailing


def parse_infer(request: pb.ModelInferRequest, images: bool, max_elements: int | None,
                deadline_s: float | None) -> InferBody:
    """The infer request as a call of N inputs; `deadline_s`: what is left of the client's gRPC deadline,
    which bounds the request as its `timeout` parameter does (the shorter of the two wins)."""
    name = IMAGE_INPUT if images else INPUT
    if len(request.inputs) != 1:
        raise InvalidInput(f"`inputs` must hold exactly one tensor, `{name}`")
    tensor = request.inputs[0]
    shape = list(tensor.shape)
    count = element_count(tensor.name, tensor.datatype, shape, name, max_elements)
    if request.raw_input_contents:
        if len(request.raw_input_contents) != 1:
            raise InvalidInput("`raw_input_contents` must hold one entry, the input tensor's")
        elements: list[str | bytes] = unpack_bytes(request.raw_input_contents[0], count)
    else:
        elements = list(tensor.contents.bytes_contents)
        if len(elements) != count:
            raise InvalidInput(f"`{name}` has {len(elements)} elements; its shape {shape} says {count}")
    for asked in request.outputs:
        if asked.name != OUTPUT:
            raise InvalidInput(f"unknown output {asked.name!r}: this model has one, `{OUTPUT}`")
    timeout = request.parameters["timeout"] if "timeout" in request.parameters else None
    if timeout is not None and timeout.WhichOneof("parameter_choice") not in ("int64_param", "uint64_param"):
        raise InvalidInput("the `timeout` parameter must be a positive integer (microseconds)")
    call_timeout_ms = None if timeout is None else timeout_parameter_ms(getattr(timeout, str(timeout.WhichOneof("parameter_choice"))))
    if deadline_s is not None:
        left_ms = max(1, math.ceil(deadline_s * 1000))
        call_timeout_ms = left_ms if call_timeout_ms is None else min(call_timeout_ms, left_ms)
    return InferBody(request.id or None, input_values(elements, images), call_timeout_ms, True)


def infer_response(model: str, version: str, call_id: str | None, outputs: list[Any]) -> pb.ModelInferResponse:
    out = output_tensor(outputs)
    response = pb.ModelInferResponse(model_name=model, model_version=version, id=call_id or "")
    response.outputs.add(name=OUTPUT, datatype=out.datatype, shape=out.shape)
    response.raw_output_contents.append(out.raw())
    return response
