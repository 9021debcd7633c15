"""The per-bucket queue: FIFO per tenant, tiers, round robin of tenants and of a tenant's calls, removal,
promotion."""

from inferd.messages import PendingRequest, RequestState
from inferd.scheduling.request_queue import RequestQueue


def request(i: int, deadline: float = 1e9, **kw) -> PendingRequest:  # type: ignore[no-untyped-def]
    return PendingRequest(f"r{i}", f"in{i}", enqueued_at=float(i), deadline=deadline, future=None, **kw)  # type: ignore[arg-type]


def test_take_is_fifo_and_bounded():
    q = RequestQueue()
    reqs = [request(i) for i in range(5)]
    for r in reqs:
        q.append(r)
    taken = q.take(3, now=0)
    assert [r.request_id for r in taken] == ["r0", "r1", "r2"]
    assert all(r.state is RequestState.TAKEN for r in taken)
    assert q.live == 2


def test_removed_requests_are_skipped_and_never_taken():
    q = RequestQueue()
    reqs = [request(i) for i in range(4)]
    for r in reqs:
        q.append(r)
    assert q.remove(reqs[0], RequestState.CANCELLED)
    assert not q.remove(reqs[0], RequestState.CANCELLED)  # only once
    assert q.live == 3
    assert q.oldest() is reqs[1]
    assert [r.request_id for r in q.take(10, now=0)] == ["r1", "r2", "r3"]
    assert not q.remove(reqs[1], RequestState.CANCELLED)  # already taken


def test_expired_requests_are_dropped_at_take_time():
    q = RequestQueue()
    q.append(request(0, deadline=5))
    q.append(request(1, deadline=50))
    taken = q.take(10, now=10)
    assert [r.request_id for r in taken] == ["r1"]
    assert q.live == 0


def test_tombstones_are_compacted():
    q = RequestQueue()
    reqs = [request(i) for i in range(200)]
    for r in reqs:
        q.append(r)
    for r in reqs[:190]:
        q.remove(r, RequestState.CANCELLED)
    assert q.live == 10
    assert len(q._by_name["default"].tenants["anonymous"]) < 100
    assert [r.request_id for r in q.take(100, now=0)] == [f"r{i}" for i in range(190, 200)]


def test_appendleft_puts_a_batch_back_first():
    q = RequestQueue()
    a, b, c = request(0), request(1), request(2)
    q.append(c)
    taken = [a, b]
    for r in taken:
        r.state = RequestState.TAKEN
    q.appendleft(taken)
    assert [r.request_id for r in q.take(10, now=0)] == ["r0", "r1", "r2"]


TIERS = (("enterprise", None), ("paid", None), ("free", 0.5))  # highest first; free is promoted after 0.5 s


def test_batches_fill_from_the_highest_tier_down():
    q = RequestQueue(TIERS)
    free = [request(i, tier="free") for i in range(3)]
    paid = [request(10 + i, tier="paid") for i in range(2)]
    for r in (*free, *paid):
        q.append(r)
    assert q.live_by_tier() == {"enterprise": 0, "paid": 2, "free": 3}
    assert q.live_ahead_of("paid") == 2 and q.live_ahead_of("free") == 5
    assert [r.request_id for r in q.take(3, now=0.1)] == ["r10", "r11", "r0"]


def test_tenants_of_one_tier_take_turns():
    q = RequestQueue(TIERS)
    for i in range(4):
        q.append(request(i, tier="paid", tenant="heavy"))
    q.append(request(10, tier="paid", tenant="light"))
    assert [r.request_id for r in q.take(3, now=0.1)] == ["r0", "r10", "r1"]


def test_a_request_waiting_past_its_tiers_promotion_goes_first():
    q = RequestQueue(TIERS)
    q.append(request(0, tier="free"))  # enqueued at t=0
    q.append(request(1, tier="enterprise"))
    assert [r.request_id for r in q.take(1, now=0.4)] == ["r1"]  # not yet promoted
    q.append(request(2, tier="enterprise"))
    assert [r.request_id for r in q.take(1, now=0.6)] == ["r0"]  # waited 0.6 s > 0.5 s: before any tier


def test_a_batch_stops_growing_before_a_size_that_would_make_a_member_miss_its_due():
    curve = [0.0] + [0.010 * n for n in range(1, 11)]  # 10 ms a request
    q = RequestQueue()
    for i in range(6):  # r2 must be answered by 100.045: a batch of 4 (40 ms) is the largest that does it
        q.append(request(i, due=100.045 if i == 2 else 200.0))
    assert [r.request_id for r in q.take(10, now=100.0, curve=curve)] == ["r0", "r1", "r2", "r3"]
    assert q.live == 2  # the rest wait for the next batch
    # two tenants taking turns, same rule
    q = RequestQueue()
    for i in range(6):
        q.append(request(i, tenant=f"t{i % 2}", due=100.025 if i == 0 else 200.0))
    assert len(q.take(10, now=100.0, curve=curve)) == 2


def test_a_member_that_would_be_late_anyway_does_not_hold_the_batch_back():
    curve = [0.0] + [0.010 * n for n in range(1, 11)]
    q = RequestQueue()
    q.append(request(0, due=100.005))  # even alone it ends at 100.01: lost, it goes but decides nothing
    for i in range(1, 8):
        q.append(request(i, due=200.0))
    assert len(q.take(10, now=100.0, curve=curve)) == 8
    q = RequestQueue()
    for i in range(8):  # no curve (nothing measured yet): only the size limit
        q.append(request(i, due=100.001))
    assert len(q.take(5, now=100.0)) == 5


def call_inputs(name: str, n: int, start: int, **kw) -> list[PendingRequest]:  # type: ignore[no-untyped-def]
    """The `n` inputs of one multi-input call `name` (request ids name.0, name.1...)."""
    return [PendingRequest(f"{name}.{i}", f"{name}{i}", enqueued_at=float(start + i), deadline=1e9, future=None,  # type: ignore[arg-type]
                           call_id=name, **kw) for i in range(n)]


def ids(requests: list[PendingRequest]) -> list[str]:
    return [r.request_id for r in requests]


def test_the_calls_of_one_tenant_take_turns_a_small_call_is_not_served_after_the_big_ones():
    q = RequestQueue()
    for r in (*call_inputs("big1", 100, 0), *call_inputs("big2", 100, 100), *call_inputs("small", 3, 200)):
        q.append(r)
    single = request(300)
    q.append(single)
    assert ids(q.take(8, now=0)) == ["big1.0", "big2.0", "small.0", "r300", "big1.1", "big2.1", "small.1", "big1.2"]
    assert ids(q.take(4, now=0)) == ["big2.2", "small.2", "big1.3", "big2.3"]  # then only the big calls, in turns
    assert q.live == 200 - 8
    assert ids(q.take(200, now=0)) == [f"big{k}.{i}" for i in range(4, 100) for k in (1, 2)]
    assert q.live == 0 and q.take(1, now=0) == []
    assert not q._by_name["default"].calls  # every call's entry left with its last input


def test_a_call_of_at_most_whole_call_inputs_goes_whole_in_its_turn_and_the_big_ones_still_move():
    q = RequestQueue(whole_call=4)
    for r in (*call_inputs("big1", 10, 0), *call_inputs("big2", 10, 100), *call_inputs("small", 3, 200)):
        q.append(r)
    # the small call's turn serves all three; each big call gives one a round until 4 are left, then goes whole
    assert ids(q.take(8, now=0)) == ["big1.0", "big2.0", "small.0", "small.1", "small.2", "big1.1", "big2.1", "big1.2"]
    assert ids(q.take(20, now=0)) == ["big2.2", "big1.3", "big2.3", "big1.4", "big2.4", "big1.5", "big2.5",
                                      "big1.6", "big1.7", "big1.8", "big1.9", "big2.6", "big2.7", "big2.8", "big2.9"]
    assert q.live == 0 and not q._by_name["default"].calls


def test_a_batch_carrying_a_short_call_grows_past_it_only_where_growing_is_nearly_free():
    """A 3-input call goes whole in its turn, beside two 40-input calls. Where each input adds 10 ms to a
    batch (a CPU's), the batch it completes in grows by at most a quarter of its time (the call's answer
    is not held back for the big calls' inputs); where the batch's time hardly grows (a GPU's), it
    fills to the limit. Without short calls the steep curve does not cut batches."""
    steep = [0.0] + [0.004 + 0.010 * n for n in range(1, 33)]  # 4 ms + 10 ms an input
    flat = [0.0] + [0.050 + 0.0002 * n for n in range(1, 33)]

    def queue(with_short: bool) -> RequestQueue:
        q = RequestQueue(whole_call=8)
        inputs = [*call_inputs("big1", 40, 0, call_size=40), *call_inputs("big2", 40, 100, call_size=40)]
        for r in inputs + (call_inputs("small", 3, 200, call_size=3) if with_short else []):
            q.append(r)
        return q

    taken = ids(queue(True).take(32, now=0, curve=steep))
    # big1.0, big2.0, the small call's three (its own inputs are never held back): 54 ms; then up to
    # 67.5 ms: one input more
    assert taken == ["big1.0", "big2.0", "small.0", "small.1", "small.2", "big1.1"], taken
    alone = RequestQueue(whole_call=8)
    for r in call_inputs("small", 6, 0, call_size=6):
        alone.append(r)
    assert len(alone.take(32, now=0, curve=steep)) == 6  # (each input adds 10 ms to 14: more than a quarter)
    assert len(queue(True).take(32, now=0, curve=flat)) == 32
    assert len(queue(False).take(32, now=0, curve=steep)) == 32
    # another tenant's short call does not hold back this tenant's big calls: their turns share the batch
    shared = queue(False)
    for r in call_inputs("other", 3, 200, call_size=3, tenant="t2"):
        shared.append(r)
    assert len(shared.take(32, now=0, curve=steep)) == 32


def test_what_a_whole_calls_input_waits_behind_is_what_its_turn_comes_after():
    def queue() -> RequestQueue:
        q = RequestQueue(whole_call=4)
        for r in (*call_inputs("big1", 10, 0), *call_inputs("big2", 10, 100), request(300)):
            q.append(r)
        return q
    # a small call's third input: one of each big call, the single, its own two (it goes whole in its turn)
    q = queue()
    inputs = call_inputs("small", 3, 400)
    for r in inputs[:2]:
        q.append(r)
    assert q.live_ahead_of("default", "anonymous", "small") == 1 + 1 + 1 + 2
    assert served_before(q, inputs[2]) == 5


def served_before(q: RequestQueue, new: PendingRequest) -> int:
    """How many waiting requests the turns serve before `new`, queued now with nothing arriving after it."""
    q.append(new)
    return ids(q.take(10_000, now=0)).index(new.request_id)


def big_calls_and_a_single(**kw) -> RequestQueue:  # type: ignore[no-untyped-def]
    q = RequestQueue()
    for r in (*call_inputs("big1", 100, 0), *call_inputs("big2", 100, 100), request(300), *call_inputs("small", 2, 400)):
        q.append(r)
    return q


def test_the_wait_predicted_behind_a_tenants_calls_counts_what_their_turns_serve_first():
    # a single request: one input of each entry ahead (2 big calls, a single, the small call), not 203
    assert big_calls_and_a_single().live_ahead_of("default", "anonymous") == 4
    assert served_before(big_calls_and_a_single(), request(500)) == 4
    # the small call's third input: 3 of each big call, the single, its own 2 (FIFO counting said 203)
    assert big_calls_and_a_single().live_ahead_of("default", "anonymous", "small") == 9
    assert served_before(big_calls_and_a_single(), call_inputs("small", 3, 400)[2]) == 9
    # a new call's first input waits like a single; its 150th behind up to 100 of each big call
    assert big_calls_and_a_single().live_ahead_of("default", "anonymous", "new") == 4
    q = big_calls_and_a_single()
    inputs = call_inputs("new", 150, 600)
    for r in inputs[:149]:
        q.append(r)
    assert q.live_ahead_of("default", "anonymous", "new") == 100 + 100 + 1 + 2 + 149
    assert served_before(q, inputs[149]) == 352


def test_the_wait_predicted_beside_another_tenant_counts_its_turns_until_this_ones():
    q = big_calls_and_a_single()
    for i in range(5):
        q.append(request(700 + i, tenant="other"))
    # its tenant takes 5 turns until it (4 ahead, then its own): the other tenant's 5 come in them
    assert q.live_ahead_of("default", "anonymous") == 4 + 5
    assert served_before(q, request(800)) == 4 + 4  # (the other tenant's 5th comes after: one too many counted)
    assert big_calls_and_a_single().live_ahead_of("default", None) == 203  # no tenant: behind everything


def test_a_calls_count_follows_its_inputs_out_of_the_queue():
    q = big_calls_and_a_single()
    for r in call_inputs("small", 2, 400):  # withdrawn: the tombstones count for nothing
        q.remove(next(x for x in q._by_name["default"].calls[("anonymous", "small")].items if x.request_id == r.request_id),
                 RequestState.CANCELLED)
    assert q.live_ahead_of("default", "anonymous", "small") == 3
    taken = q.take(4, now=0)  # big1.0, big2.0, r300, big1.1 (the small call's entry dropped on its turn)
    assert ids(taken) == ["big1.0", "big2.0", "r300", "big1.1"]
    assert q.live_ahead_of("default", "anonymous", "big2") == 99 + 98  # its 100th: all of both
    q.appendleft(taken)  # put back: they wait alone at the head, out of their calls' turns
    assert q.live_ahead_of("default", "anonymous") == 4 + 2
    assert q.live_ahead_of("default", "anonymous", "big1") == 4 + 98 + 99  # its 99th: all of big2 too


def test_calls_take_turns_inside_their_tenant_and_tenants_still_take_turns():
    q = RequestQueue()
    for r in call_inputs("a", 4, 0, tenant="heavy"):
        q.append(r)
    for r in call_inputs("b", 4, 10, tenant="heavy"):
        q.append(r)
    q.append(request(20, tenant="light"))
    q.append(request(21, tenant="light"))
    assert ids(q.take(6, now=0)) == ["a.0", "r20", "b.0", "r21", "a.1", "b.1"]


def test_a_calls_withdrawn_inputs_are_never_taken_and_its_entry_goes():
    q = RequestQueue()
    withdrawn = call_inputs("gone", 5, 0)
    for r in (*withdrawn, *call_inputs("kept", 2, 10)):
        q.append(r)
    for r in withdrawn:
        assert q.remove(r, RequestState.CANCELLED)
    assert q.live == 2 and q.oldest() is not None and q.oldest().request_id == "kept.0"
    assert ids(q.take(10, now=0)) == ["kept.0", "kept.1"]
    assert not q._by_name["default"].calls and q.live == 0


def test_shedding_takes_what_the_turn_order_reaches_last_and_drain_finds_every_input():
    q = RequestQueue()
    inputs = call_inputs("c", 3, 0)
    for r in inputs:
        q.append(r)
    q.append(request(10))
    assert q.newest_of("default", "anonymous").request_id == "r10"
    q.take(2, now=0)  # c.0, then r10: the call is the only entry left
    assert q.newest_of("default", "anonymous") is inputs[2]
    assert q.remove(inputs[2], RequestState.REJECTED)
    assert q.newest_of("default", "anonymous") is inputs[1]
    assert list(q.drain()) == [inputs[1]] and q.live == 0 and inputs[1].state is RequestState.CANCELLED


def test_a_calls_input_promoted_to_a_higher_tier_moves_alone():
    q = RequestQueue(TIERS)
    inputs = call_inputs("c", 3, 0, tier="free")
    for r in inputs:
        q.append(r)
    q.promote(inputs[1], "paid")
    assert q.live_by_tier() == {"enterprise": 0, "paid": 1, "free": 2}
    assert ids(q.take(3, now=0.1)) == ["c.1", "c.0", "c.2"]


def test_a_batch_put_back_goes_first_even_when_its_inputs_belong_to_a_call():
    q = RequestQueue()
    inputs = call_inputs("c", 4, 0)
    for r in inputs:
        q.append(r)
    taken = q.take(2, now=0)
    q.appendleft(taken)  # its worker died: the batch runs again, first
    assert ids(q.take(4, now=0)) == ["c.0", "c.1", "c.2", "c.3"]
    assert not q._by_name["default"].calls  # the call's entry left with its last input


def test_without_calls_one_tenants_fast_path_and_the_turns_give_the_same_order():
    fast, turns = RequestQueue(), RequestQueue()
    for i in range(20):
        fast.append(request(i, deadline=5 if i % 7 == 3 else 1e9))
        turns.append(request(i, deadline=5 if i % 7 == 3 else 1e9))
    turns.append(request(99, tenant="other"))  # a second tenant: the general path
    assert turns.remove(turns.newest_of("default", "other"), RequestState.CANCELLED)  # ...with nothing of its own
    for q in (fast, turns):
        q.remove(q.newest_of("default", "anonymous"), RequestState.CANCELLED)
    assert ids(fast.take(8, now=10)) == ids(turns.take(8, now=10))
    assert ids(fast.take(100, now=10)) == ids(turns.take(100, now=10))


def test_the_view_names_its_oldest_short_call_never_a_large_calls_remnant():
    """What the rule's short-call preference reads (`BucketView.short_at`): a call short in all (at most
    `whole_call` inputs), or a single request; not the last few inputs here of a call of 40."""
    def short_at(q: RequestQueue) -> float:
        return q.view(0, 1000.0, 8, lambda n: 0.01, 0.02).short_at

    q = RequestQueue(whole_call=2)
    for r in call_inputs("large", 2, 0, call_size=40):
        q.append(r)
    assert short_at(q) == float("inf")
    for r in call_inputs("short", 2, 10, call_size=2):
        q.append(r)
    assert short_at(q) == 10.0
    q.take(3, now=1000.0)  # the large call's last two (few enough to go whole) and the short call's first
    assert short_at(q) == 11.0
    q.take(1, now=1000.0)
    q.append(request(20))  # a single request is a short call too
    assert short_at(q) == 20.0
    singles = RequestQueue()
    singles.append(request(30))
    assert short_at(singles) == 30.0


def due_of(q: RequestQueue) -> float:
    """The earliest due the rule reads (`BucketView.due`), and linger_left's (`oldest_and_due`): the same."""
    due = q.view(0, 0.0, 8, lambda n: 0.01, 0.02).due
    assert q.oldest_and_due()[1] == due
    return due


def test_the_view_reads_the_earliest_due_of_every_waiting_request_not_only_the_heads():
    """A tenant's request due before the ones ahead of it in its own queue (a tighter deadline than the
    objective's) sets the bucket's due: the deadline trigger must see it, or it waits out their linger."""
    q = RequestQueue()
    lax, tight, later = request(0, due=10.0), request(1, due=3.0), request(2, due=12.0)
    for r in (lax, tight, later):
        q.append(r)
    assert due_of(q) == 3.0
    q.remove(tight, RequestState.CANCELLED)
    assert due_of(q) == 10.0
    assert ids(q.take(1, now=0)) == ["r0"]
    assert due_of(q) == 12.0
    q.take(1, now=0)
    assert due_of(q) == float("inf")
    assert q._due_heap is None  # emptied: the requests it held are not kept until the next arrival
    q.append(request(3, due=20.0))  # in order again
    q.append(request(4, due=25.0))
    assert due_of(q) == 20.0


def test_the_earliest_due_counts_a_batch_put_back_and_a_calls_inputs_behind_another_call():
    q = RequestQueue()
    q.append(request(0, due=5.0))
    q.append(request(1, due=6.0))
    first = q.take(1, now=0)
    q.append(request(2, due=1.0))  # earlier than the one taken: out of order from here on
    q.appendleft(first)
    assert due_of(q) == 1.0
    q.take(10, now=0)
    q.append(request(3, due=9.0))
    first = q.take(1, now=0)
    q.append(request(4, due=30.0))
    q.appendleft(first)  # (put back in front of a request due later: the heads are still enough)
    assert due_of(q) == 9.0
    q.take(10, now=0)
    calls = RequestQueue()
    for r in (*call_inputs("early", 3, 0, due=4.0), *call_inputs("late", 3, 10, due=8.0)):
        calls.append(r)
    calls.take(1, now=0)  # "early" gave one input and went behind "late" in its tenant's turns
    assert due_of(calls) == 4.0


def test_a_short_call_whose_turn_comes_at_the_size_limit_goes_whole_past_it_and_nothing_else_does():
    """The size limit is the cost model's useful batch, which on a CPU may be fewer than a short call's
    inputs: split over two batches, the call would end with the second. It goes whole, up to the
    backend's own `max_size`; the next call's inputs (short or not) wait for the next batch."""
    def queue() -> RequestQueue:
        q = RequestQueue(whole_call=8)
        for r in (*call_inputs("big1", 40, 0, call_size=40), *call_inputs("big2", 40, 100, call_size=40),
                  *call_inputs("small", 6, 200, call_size=6), *call_inputs("next", 3, 300, call_size=3)):
            q.append(r)
        return q

    whole = ["big1.0", "big2.0"] + [f"small.{i}" for i in range(6)]
    assert ids(queue().take(4, now=0, max_size=32)) == whole
    assert ids(queue().take(4, now=0, max_size=7)) == whole[:7]  # never past the backend's own limit
    assert ids(queue().take(4, now=0)) == whole[:4]  # no room named: the limit holds
    q = queue()
    q.take(4, now=0, max_size=32)
    assert ids(q.take(4, now=0, max_size=32)) == ["next.0", "next.1", "next.2", "big1.1"]


def test_a_batch_sent_for_a_short_call_begins_with_it_wherever_its_turn_stands():
    """The rule sends a bucket before the oldest one when its next batch would finish a short call. In
    turn order a large call's last inputs (few enough to go whole) may come first and fill the batch; a
    batch sent for the short call begins with it instead, and the turns fill the rest."""
    def queue() -> RequestQueue:
        q = RequestQueue(whole_call=4)
        for r in (*call_inputs("big1", 3, 0, call_size=40), *call_inputs("big2", 3, 100, call_size=40),
                  *call_inputs("small", 2, 200, call_size=2)):
            q.append(r)
        return q

    assert "small.0" not in ids(queue().take(4, now=0))  # in turn order, big1's three and then big2's first
    q = queue()
    assert ids(q.take(4, now=0, short_first=True)) == ["small.0", "small.1", "big1.0", "big1.1"]
    assert ids(q.take(8, now=0)) == ["big1.2", "big2.0", "big2.1", "big2.2"]  # nothing lost or taken twice
    assert q.live == 0 and not q._by_name["default"].calls


def test_a_short_call_first_goes_whole_past_the_limit_and_grows_past_it_as_in_its_turn():
    """Begun with a short call, a batch takes the call whole past its size limit, whoever else waits;
    among one tenant's calls it then grows past the call by at most a quarter of its time (a CPU's steep
    curve: one input here; a GPU's flat one: to the limit), with other tenants waiting their turns fill
    it up to the limit as before."""
    steep = [0.0] + [0.004 + 0.010 * n for n in range(1, 33)]
    flat = [0.0] + [0.050 + 0.0002 * n for n in range(1, 33)]

    def queue(other_tenant: bool) -> RequestQueue:
        q = RequestQueue(whole_call=4)
        for r in (*call_inputs("big", 20, 0, call_size=40),
                  *call_inputs("small", 4, 100, call_size=4, tenant="t2" if other_tenant else "anonymous")):
            q.append(r)
        return q

    small = [f"small.{i}" for i in range(4)]
    assert ids(queue(True).take(3, now=0, max_size=32, short_first=True)) == small  # whole, past the limit of 3
    assert ids(queue(False).take(3, now=0, max_size=32, short_first=True, curve=steep)) == small
    assert ids(queue(False).take(8, now=0, max_size=32, short_first=True, curve=steep)) == small + ["big.0"]  # (54 ms: 1.25 x 44 at most)
    assert ids(queue(False).take(8, now=0, max_size=32, short_first=True, curve=flat)) == small + [f"big.{i}" for i in range(4)]
    assert ids(queue(True).take(8, now=0, max_size=32, short_first=True, curve=steep)) == small + [f"big.{i}" for i in range(4)]
