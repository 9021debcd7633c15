"""The deadline wheel on a fake clock and a fake timer: expiry order, re-arming, discarded requests."""

from __future__ import annotations

from inferd.messages import PendingRequest
from inferd.scheduling.deadlines import DeadlineWheel

from ...helpers import FakeClock


class _Timer:
    def __init__(self, delay: float, fn) -> None:  # type: ignore[no-untyped-def]
        self.delay, self.fn, self.cancelled = delay, fn, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Records the timers a wheel arms instead of running them."""

    def __init__(self) -> None:
        self.timers: list[_Timer] = []

    def call_later(self, delay: float, fn):  # type: ignore[no-untyped-def]
        self.timers.append(_Timer(delay, fn))
        return self.timers[-1]

    def live(self) -> list[_Timer]:
        return [t for t in self.timers if not t.cancelled]

    def fire(self) -> None:
        """Run the one armed timer, as the loop would when its time comes."""
        (timer,) = self.live()
        timer.cancelled = True  # a fired timer is done
        timer.fn()


def request(name: str, deadline: float) -> PendingRequest:
    return PendingRequest(name, name, 0.0, deadline, None)  # type: ignore[arg-type]


def test_requests_expire_in_deadline_order_and_the_timer_follows_the_earliest_slot():
    clock, loop, expired = FakeClock(100.0), FakeLoop(), []
    wheel = DeadlineWheel(loop, lambda r: expired.append(r.request_id), resolution_s=0.005, clock=clock)  # type: ignore[arg-type]
    late, early, answered = request("late", 100.12), request("early", 100.04), request("answered", 100.06)
    wheel.add(late)
    assert [round(t.delay, 3) for t in loop.live()] == [0.125]  # the slot's end: never before the deadline
    wheel.add(early)  # an earlier deadline: the timer moves to it
    assert [round(t.delay, 3) for t in loop.live()] == [0.045]
    wheel.add(answered)
    wheel.discard(answered)
    assert len(wheel) == 2

    clock.advance(0.045)
    loop.fire()  # the early slot expires, the timer re-arms for the next slot
    assert expired == ["early"]
    assert [round(t.delay, 3) for t in loop.live()] == [0.02]  # "answered"'s slot, empty now
    clock.advance(0.02)
    loop.fire()
    assert expired == ["early"]  # "answered" was discarded: never expired
    assert [round(t.delay, 3) for t in loop.live()] == [0.06]
    clock.advance(0.06)
    loop.fire()
    assert expired == ["early", "late"]
    assert len(wheel) == 0 and not loop.live()


def test_a_timer_that_fires_early_expires_nothing_and_re_arms():
    clock, loop, expired = FakeClock(100.0), FakeLoop(), []
    wheel = DeadlineWheel(loop, lambda r: expired.append(r.request_id), clock=clock)  # type: ignore[arg-type]
    wheel.add(request("r", 100.5))
    loop.fire()  # fired before its time (clock not advanced)
    assert expired == [] and len(loop.live()) == 1
    wheel.close()
    assert not loop.live()
