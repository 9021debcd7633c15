"""What a call to inferd can end with, other than its result: typed errors carrying the server's
stable code, and the rule for which of them are safe to retry."""

from __future__ import annotations

import json
import random


class InferdClientError(Exception):
    """An answer that is not a result: the HTTP status, inferd's stable code, its message."""

    status = 0
    code = "ERROR"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None,
                 request_id: str | None = None, retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = self.status if status is None else status
        self.code = code or self.code
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms


class BadRequest(InferdClientError):
    status, code = 400, "INVALID_INPUT"


class Unauthorized(InferdClientError):
    status, code = 401, "UNAUTHORIZED"


class Forbidden(InferdClientError):
    status, code = 403, "FORBIDDEN"


class NotFound(InferdClientError):
    status, code = 404, "NOT_FOUND"


class RequestTimeout(InferdClientError):
    status, code = 408, "REQUEST_TIMEOUT"


class Conflict(InferdClientError):
    """409: the Idempotency-Key's first request is still running (try the same again shortly)."""

    status, code = 409, "IDEMPOTENCY_KEY_IN_USE"


class PayloadTooLarge(InferdClientError):
    status, code = 413, "PAYLOAD_TOO_LARGE"


class IdempotencyKeyReused(InferdClientError):
    """422: the Idempotency-Key came before with a different request: a new request needs a new key."""

    status, code = 422, "IDEMPOTENCY_KEY_REUSED"


class RateLimited(InferdClientError):
    status, code = 429, "RATE_LIMITED"


class InferenceFailed(InferdClientError):
    status, code = 500, "INFERENCE_FAILED"


class Unavailable(InferdClientError):
    """503: overloaded, draining, not ready or failing. Nothing was computed: safe to retry."""

    status, code = 503, "SERVICE_OVERLOADED"


class DeadlineExceeded(InferdClientError):
    status, code = 504, "DEADLINE_EXCEEDED"


class ConnectionFailed(InferdClientError):
    """The connection could not be opened: nothing was sent, safe to retry."""

    status, code = 0, "CONNECTION_FAILED"


class ConnectionLost(ConnectionFailed):
    """The connection broke mid-call: the input may have run, so it is not retried."""

    code = "CONNECTION_LOST"


class NotFromInferd(InferdClientError):
    """An answer that is not inferd's (e.g. a load balancer's own error page)."""

    code = "NOT_FROM_INFERD"


_BY_STATUS: dict[int, type[InferdClientError]] = {
    c.status: c for c in (BadRequest, Unauthorized, Forbidden, NotFound, RequestTimeout, Conflict, PayloadTooLarge,
                          IdempotencyKeyReused, RateLimited, InferenceFailed, Unavailable, DeadlineExceeded)
}


def error_from(status: int, body: bytes) -> InferdClientError:
    """The typed error for an answer that is not a 200 (inferd's shape or OpenAI's, or neither)."""
    try:
        data = json.loads(body)
        error = data["error"]
    except (ValueError, KeyError, TypeError):
        return NotFromInferd(body[:200].decode("utf-8", "replace"), status=status)
    request_id = data.get("request_id")
    if isinstance(error, dict):  # OpenAI's shape
        data, error = {**data, **error}, error.get("code")
    cls = _BY_STATUS.get(status, InferdClientError)
    return cls(str(data.get("message", "")), status=status, code=str(error), request_id=request_id,
               retry_after_ms=data.get("retry_after_ms"))


def retry_delay_s(error: InferdClientError, attempt: int, time_left_s: float, idempotent: bool = False) -> float | None:
    """How long to wait before trying again, or None: not safe to retry, or no time left for it.
    `idempotent`: the request carries an Idempotency-Key, so a lost connection is safe to retry too
    (the server answers a repeat once)."""
    if error.status == 503:
        delay = (error.retry_after_ms or 100) / 1000.0
    elif type(error) is ConnectionFailed or (idempotent and type(error) is ConnectionLost):
        delay = min(2.0, 0.05 * 2 ** attempt) * random.uniform(0.5, 1.0)  # (refused: nothing was sent)
    else:
        return None
    return delay if delay < time_left_s else None
