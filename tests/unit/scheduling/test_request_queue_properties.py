"""The request queue under random interleavings, on a fake clock: single requests and short and large
calls (some arriving in two parts) of two tiers and three tenants, cancellations, sheds, expiries,
promotions, batches put back, and every kind of take (short calls first, token budgets, size limits).
After every step the structure is consistent (`queue_checks`); a request leaves the queue once per time
it joined, and the queue always drains."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from inferd.messages import PendingRequest, RequestState
from inferd.scheduling.request_queue import RequestQueue

from .queue_checks import assert_consistent

QUEUED = RequestState.QUEUED
TIERS = (("paid", None), ("free", 0.2))  # the free tier's requests are promoted past the paid ones after 0.2 s
WHOLE_CALL = 4  # a call of at most this many inputs goes whole (a batcher's max_batch_size // 4)
tiers = st.sampled_from([name for name, _ in TIERS])
tenants = st.sampled_from(["acme", "anonymous", "bolt"])
offsets = st.floats(0.05, 2.0)  # a deadline's distance from now


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = RequestQueue(TIERS, WHOLE_CALL)
        self.now = 0.0
        self.n = 0
        self.requests: list[PendingRequest] = []
        self.joined: dict[int, int] = {}  # times each request joined the queue, by id()
        self.left: dict[int, int] = {}  # ... and left it (taken, expired, cancelled, shed)
        self.taken: list[PendingRequest] = []  # taken, not yet put back (a batch that may run again)
        self.calls: list[tuple[str, str, str, int]] = []  # (call, tier, tenant, size) with inputs still to come

    def _new(self, tier: str, tenant: str, offset: float, tokens: int, call: str | None = None,
             size: int = 1) -> PendingRequest:
        self.n += 1
        request = PendingRequest(f"r{self.n}", self.n, enqueued_at=self.now, deadline=self.now + offset, future=None,  # type: ignore[arg-type]
                                 due=self.now + offset, tier=tier, tenant=tenant, tokens=tokens)
        if call is not None:
            request.call_id, request.call_size = call, size
        self.requests.append(request)
        self.joined[id(request)] = 1
        self.queue.append(request)
        return request

    def _leaves(self, request: PendingRequest) -> None:
        self.left[id(request)] = self.left.get(id(request), 0) + 1

    def _settle_expired(self, before: dict[int, RequestState]) -> None:
        """Requests a take found expired left the queue too (their deadline timer answers them)."""
        for request in self.requests:
            if before.get(id(request)) is QUEUED and request.state is RequestState.EXPIRED:
                self._leaves(request)

    @rule(tier=tiers, tenant=tenants, offset=offsets, tokens=st.integers(0, 40))
    def single(self, tier: str, tenant: str, offset: float, tokens: int) -> None:
        self._new(tier, tenant, offset, tokens)

    @rule(tier=tiers, tenant=tenants, offset=offsets, size=st.integers(2, 24), first=st.integers(1, 24))
    def call(self, tier: str, tenant: str, offset: float, size: int, first: int) -> None:
        """A call's inputs; where `first` is below its size, the rest come later (prepared in two parts)."""
        call = f"c{self.n}"
        for _ in range(min(first, size)):
            self._new(tier, tenant, offset, 1, call, size)
        if first < size:
            self.calls.append((call, tier, tenant, size - first))

    @precondition(lambda self: self.calls)
    @rule(i=st.integers(0, 1000), offset=offsets)
    def rest_of_a_call(self, i: int, offset: float) -> None:
        call, tier, tenant, rest = self.calls.pop(i % len(self.calls))
        for _ in range(rest):
            self._new(tier, tenant, offset, 1, call, rest)

    @rule(seconds=st.floats(0.0, 0.5))
    def advance(self, seconds: float) -> None:
        self.now += seconds

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 10_000), state=st.sampled_from([RequestState.CANCELLED, RequestState.EXPIRED]))
    def withdraw(self, i: int, state: RequestState) -> None:
        request = self.requests[i % len(self.requests)]
        was_queued = request.state is QUEUED
        assert self.queue.remove(request, state) is was_queued
        if was_queued:
            self._leaves(request)

    @rule(tier=tiers, tenant=tenants)
    def shed(self, tier: str, tenant: str) -> None:
        victim = self.queue.newest_of(tier, tenant) if tenant in self.queue.tenant_live(tier) else None
        if victim is not None:
            assert victim.state is QUEUED and (victim.tier, victim.tenant) == (tier, tenant)
            assert self.queue.remove(victim, RequestState.REJECTED)
            self._leaves(victim)

    @precondition(lambda self: self.requests)
    @rule(i=st.integers(0, 10_000))
    def promote(self, i: int) -> None:
        request = self.requests[i % len(self.requests)]
        if request.state is QUEUED and request.tier == "free":
            self.queue.promote(request, "paid")

    @rule(limit=st.integers(1, 16), short_first=st.booleans(), budget=st.none() | st.integers(1, 200),
          max_size=st.none() | st.integers(16, 32))
    def take(self, limit: int, short_first: bool, budget: int | None, max_size: int | None) -> None:
        before = {id(r): r.state for r in self.requests}
        live = self.queue.live
        taken = self.queue.take(limit, self.now, budget, max_size=max_size, short_first=short_first)
        assert len(taken) <= max(limit, max_size or 0)
        assert live == 0 or taken or any(r.state is RequestState.EXPIRED and before[id(r)] is QUEUED for r in self.requests), \
            "a queue with requests waiting gave none"
        for request in taken:
            assert before[id(request)] is QUEUED and request.state is RequestState.TAKEN and request.deadline > self.now
            self._leaves(request)
        self._settle_expired(before)
        self.taken.extend(taken)

    @precondition(lambda self: self.taken)
    @rule(n=st.integers(1, 8))
    def put_back(self, n: int) -> None:
        """A batch whose worker died runs again: its requests wait at the head of their queues."""
        batch, self.taken = self.taken[:n], self.taken[n:]
        self.queue.appendleft(batch)
        for request in batch:
            self.joined[id(request)] += 1

    @invariant()
    def consistent(self) -> None:
        assert_consistent(self.queue)
        self.queue.view(0, self.now, 8, lambda n: 0.01 * n, 0.005)  # (reads heads, dropping spent entries)
        assert_consistent(self.queue)

    @invariant()
    def leaves_once_per_join(self) -> None:
        for request in self.requests:
            stays = 1 if request.state is QUEUED else 0
            assert self.joined[id(request)] == self.left.get(id(request), 0) + stays, request

    def teardown(self) -> None:
        for _ in range(len(self.requests) + 1):  # each take gives at least one, or finds the rest expired
            if not self.queue.live:
                break
            before = {id(r): r.state for r in self.requests}
            for request in self.queue.take(8, self.now, short_first=True):
                self._leaves(request)
            self._settle_expired(before)
            assert_consistent(self.queue)
        assert self.queue.live == 0
        assert not any(r.state is QUEUED for r in self.requests)
        self.leaves_once_per_join()


QueueMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=60, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_the_request_queue_under_random_interleavings = QueueMachine.TestCase
