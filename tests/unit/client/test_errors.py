from __future__ import annotations

from inferd.client.errors import ConnectionFailed, ConnectionLost, InferenceFailed, Unavailable, retry_delay_s


def test_a_lost_connection_is_retried_only_with_an_idempotency_key():
    lost = ConnectionLost("lost")
    assert retry_delay_s(lost, 1, 10.0) is None  # the request may have run: not safe to send again
    assert 0 < retry_delay_s(lost, 1, 10.0, idempotent=True) <= 2.0  # type: ignore[operator]
    assert retry_delay_s(ConnectionFailed("refused"), 1, 10.0) is not None
    assert retry_delay_s(Unavailable("busy", retry_after_ms=200), 1, 10.0) == 0.2
    assert retry_delay_s(InferenceFailed("poison"), 1, 10.0, idempotent=True) is None
