"""A Python client for inferd: one call per input, the way the server wants to be called.

- Each call carries a deadline (`timeout_ms`, which the server keeps to) and a request id
  (`X-Request-ID`, made here when not given), so a retry is the same request in the server's logs.
- Only what is safe to replay is retried: a 503 (overloaded, draining, not ready, a breaker open: the
  server promises nothing was computed) after the server's `retry_after_ms`, and a connection that could
  not be opened, after a short backoff; within `retries` and the call's own deadline. Never a 500 (the
  input may be poison), a 504 (it may have been computed) or a connection lost mid-answer.
- Errors are typed and carry the server's stable code, message, request id and `retry_after_ms`.
- Generation: `generate()` for the whole text, `stream()` for its pieces as they come.

`Client` is synchronous (the standard library's http.client, one kept-alive connection: one client per
thread); `AsyncClient` is the same on aiohttp. Neither needs anything else of inferd's.
"""

from .calls import Answer, AsyncClient, Client
from .errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    ConnectionLost,
    DeadlineExceeded,
    Forbidden,
    IdempotencyKeyReused,
    InferdClientError,
    InferenceFailed,
    NotFound,
    NotFromInferd,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "Answer", "AsyncClient", "BadRequest", "Client", "Conflict", "ConnectionFailed", "ConnectionLost",
    "DeadlineExceeded", "Forbidden", "IdempotencyKeyReused", "InferdClientError", "InferenceFailed", "NotFound", "NotFromInferd",
    "PayloadTooLarge", "RateLimited", "RequestTimeout", "Unauthorized", "Unavailable",
]
