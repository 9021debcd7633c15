"""The errors a request can end with. Each class carries its HTTP status and stable error code.

Codes are part of the public contract: clients and load balancers branch on them, so they never change.
A 503 always means "safe to retry elsewhere" and carries `retry_after_ms`.
"""

from __future__ import annotations

import math

MAX_RETRY_AFTER_MS = 60_000


class InferdError(Exception):
    """The base of every error a request can end with: its status, its stable code, its message."""

    status: int = 500
    code: str = "INTERNAL_ERROR"
    drops_connection = False  # the request's body cannot be read to its end: close without trying
    server_timing: str | None = None  # Server-Timing entries of its own (a refusal's predicted figures)

    def __init__(self, message: str, *, retry_after_ms: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_ms = retry_after_ms
        self.reason = reason or self.code.lower()  # finer than the code, for metrics (never sent)


class InvalidInput(InferdError):
    status, code = 400, "INVALID_INPUT"


class Unauthorized(InferdError):
    status, code = 401, "UNAUTHORIZED"


class Forbidden(InferdError):
    status, code = 403, "FORBIDDEN"


class NotFound(InferdError):
    status, code = 404, "NOT_FOUND"


class ModelNotFound(InferdError):
    status, code = 404, "MODEL_NOT_FOUND"


class MethodNotAllowed(InferdError):
    status, code = 405, "METHOD_NOT_ALLOWED"


class UnreadableBody(InvalidInput):
    drops_connection = True  # e.g. a body that says gzip and is not


class MalformedRequest(InferdError):
    status, code = 400, "MALFORMED_REQUEST"  # not HTTP as aiohttp's parser reads it


class InternalError(InferdError):
    status, code = 500, "INTERNAL_ERROR"  # a bug of ours, logged with its traceback


class RequestTimeout(InferdError):
    status, code = 408, "REQUEST_TIMEOUT"
    drops_connection = True


class IdempotencyKeyInUse(InferdError):
    status, code = 409, "IDEMPOTENCY_KEY_IN_USE"  # its first request is still running (and cannot be joined)


class IdempotencyKeyReused(InferdError):
    status, code = 422, "IDEMPOTENCY_KEY_REUSED"  # the key came before with a different request


class PayloadTooLarge(InferdError):
    status, code = 413, "PAYLOAD_TOO_LARGE"


class InsufficientMemory(InferdError):
    status, code = 507, "INSUFFICIENT_MEMORY"  # a model version that would not fit is not loaded


class VersionConflict(InferdError):
    status, code = 409, "VERSION_CONFLICT"  # the admin asked for a change the versions' states do not allow


class RateLimited(InferdError):
    status, code = 429, "RATE_LIMITED"


class ServiceOverloaded(InferdError):
    status, code = 503, "SERVICE_OVERLOADED"


class ModelUnavailable(InferdError):
    status, code = 503, "MODEL_UNAVAILABLE"


class Draining(InferdError):
    status, code = 503, "DRAINING"


class NotReady(InferdError):
    status, code = 503, "NOT_READY"


class DeadlineExceeded(InferdError):
    status, code = 504, "DEADLINE_EXCEEDED"


class InferenceFailed(InferdError):
    status, code = 500, "INFERENCE_FAILED"


def retry_after_ms(wait_s: float) -> int:
    """A wait in seconds as the `retry_after_ms` a 503 carries: at least 1 ms, at most a minute, and a
    second when the wait cannot be predicted (no healthy worker yet)."""
    if math.isinf(wait_s) or math.isnan(wait_s):
        return 1000
    return max(1, min(MAX_RETRY_AFTER_MS, math.ceil(wait_s * 1000)))


def describe(exc: BaseException, limit: int = 300) -> str:
    """An exception as one short line for an answer, a log or a readiness report."""
    return f"{type(exc).__name__}: {exc}"[:limit]
