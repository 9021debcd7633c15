from __future__ import annotations

from inferd.client.errors import (
    Conflict,
    ConnectionFailed,
    ConnectionLost,
    IdempotencyKeyReused,
    InferenceFailed,
    Unavailable,
    error_from,
    retry_delay_s,
)


def test_a_lost_connection_is_retried_only_with_an_idempotency_key():
    lost = ConnectionLost("lost")
    assert retry_delay_s(lost, 1, 10.0) is None  # the request may have run: not safe to send again
    assert 0 < retry_delay_s(lost, 1, 10.0, idempotent=True) <= 2.0  # type: ignore[operator]
    assert retry_delay_s(ConnectionFailed("refused"), 1, 10.0) is not None
    assert retry_delay_s(Unavailable("busy", retry_after_ms=200), 1, 10.0) == 0.2
    assert retry_delay_s(InferenceFailed("poison"), 1, 10.0, idempotent=True) is None


def test_idempotency_refusals_have_types_of_their_own():
    reused = error_from(422, b'{"error": "IDEMPOTENCY_KEY_REUSED", "message": "different body", "request_id": "r1"}')
    in_use = error_from(409, b'{"error": "IDEMPOTENCY_KEY_IN_USE", "message": "still running"}')
    assert isinstance(reused, IdempotencyKeyReused) and reused.request_id == "r1" and reused.code == "IDEMPOTENCY_KEY_REUSED"
    assert isinstance(in_use, Conflict) and retry_delay_s(reused, 1, 10.0) is None
