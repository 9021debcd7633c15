import asyncio
import time

from inferd.deadlines import DeadlineWheel
from inferd.messages import PendingRequest


def request(name: str, timeout_s: float, loop) -> PendingRequest:
    now = time.monotonic()
    return PendingRequest(name, name, now, now + timeout_s, loop.create_future())


async def test_requests_expire_at_their_deadline_in_order_and_answered_ones_do_not():
    loop = asyncio.get_running_loop()
    expired: list[tuple[str, float]] = []
    wheel = DeadlineWheel(loop, lambda r: expired.append((r.request_id, time.monotonic() - r.deadline)))
    late, early, answered = request("late", 0.12, loop), request("early", 0.04, loop), request("answered", 0.06, loop)
    for r in (late, early, answered):  # the earlier deadline arrives second: the timer must re-arm
        wheel.add(r)
    wheel.discard(answered)
    await asyncio.sleep(0.2)
    assert [name for name, _ in expired] == ["early", "late"]
    assert all(0 <= lateness < 0.05 for _, lateness in expired)
    assert len(wheel) == 0
    wheel.close()
