"""The access log: what is written, what is sampled, and lines dropped rather than waited for."""

from __future__ import annotations

import logging
import queue
import re
import time

import orjson

from inferd.observability import access_log
from inferd.observability.access_log import AccessLog, _DroppingQueueHandler
from inferd.observability.outcomes import Call


def test_server_side_failures_are_always_logged_and_the_rest_sampled():
    log = AccessLog("info", 0.0)
    assert log.wants(500) and log.wants(504) and not log.wants(200) and not log.wants(503)
    assert all(AccessLog("info", 1.0).wants(s) for s in (200, 400, 503))
    assert not AccessLog("off", 1.0).wants(200)


def test_a_line_is_one_json_object_without_the_input(caplog):
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        AccessLog("info", 1.0).record(Call(0.0, "r1", tier="free", tenant="acme", model="m"), 200, "", 0.0123, None)
    line = orjson.loads(caplog.records[-1].getMessage())
    stamp = line.pop("ts")
    assert line == {"request_id": "r1", "model": "m", "tier": "free", "tenant": "acme", "status": 200, "latency_ms": 12.3}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp), stamp  # UTC, to the millisecond


def test_a_full_queue_drops_lines_and_counts_them_per_handler():
    handler = _DroppingQueueHandler(queue.Queue(1))
    record = logging.LogRecord("inferd.access", logging.INFO, "", 0, "x", None, None)
    handler.enqueue(record)
    handler.enqueue(record)
    assert handler.dropped == 1
    access_log.log.addHandler(handler)
    try:
        assert access_log.dropped_lines() >= 1
    finally:
        access_log.log.removeHandler(handler)


class _Stream:
    """A stream that keeps each write apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> None:
        self.writes.append(text)

    def flush(self) -> None:
        pass


def _writer(gather_s: float) -> tuple[access_log.PendingLines, access_log.BurstWriter, _Stream, _DroppingQueueHandler]:
    stream = _Stream()
    handler = logging.StreamHandler(stream)  # type: ignore[arg-type]
    handler.setFormatter(logging.Formatter("%(message)s"))
    lines = access_log.PendingLines(100)
    return lines, access_log.BurstWriter(lines, handler, gather_s), stream, _DroppingQueueHandler(lines)


def _line(text: str) -> logging.LogRecord:
    return logging.LogRecord("inferd.access", logging.INFO, "", 0, text, None, None)


def test_lines_of_a_burst_are_written_together_in_order_and_none_is_lost_at_stop():
    lines, writer, stream, handler = _writer(gather_s=0.2)
    writer.start()
    for i in range(5):
        handler.handle(_line(f"line {i}"))
    deadline = time.monotonic() + 5
    while not stream.writes and time.monotonic() < deadline:
        time.sleep(0.01)
    assert stream.writes == ["line 0\nline 1\nline 2\nline 3\nline 4\n"]  # one write, after the gathering
    handler.handle(_line("last"))  # (gathered, not yet written: stop writes it)
    writer.stop()
    assert stream.writes[1:] == ["last\n"] and not lines.records


def test_a_full_burst_drops_lines_and_counts_them():
    lines, writer, stream, handler = _writer(gather_s=0.2)
    for i in range(105):  # (the writer not started: nothing leaves)
        handler.handle(_line(f"line {i}"))
    assert len(lines.records) == 100 and handler.dropped == 5
    writer.stop()
    assert stream.writes == ["".join(f"line {i}\n" for i in range(100))]
