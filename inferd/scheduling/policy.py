"""The scheduling rule: which bucket's batch goes to a free worker, and when. One decision, in one place,
across length buckets, tiers and tenants (tiers and tenants order requests inside a bucket: see
`request_queue`). Pure: it reads a view of each bucket and a few figures, and decides.

A bucket is *due* when
- it is full: its size limit (its largest useful batch, up to `max_batch_size`:
  `batch_costs`) or `max_batch_tokens` tokens;
- its oldest request has lingered its `linger_s` (or the echo hold has ended, whichever is later);
- a worker was held for the echo of the batch it finished, and the echo is back (`echo_back`: `arrivals`);
- lingering on would make one of its requests miss a due (its deadline, or sooner its objective) it can
  still meet, its batch costed by the cost model, with a batch's time to spare for a batch in progress
  (`latest_start`); or
- waiting cannot add enough to matter: the model's arrival rate over the rest of the linger brings
  fewer than max(1, 10% of the room left in the batch) requests. A lone request then goes at once
  instead of paying the whole linger; a burst or closed-loop clients still fill the batch.

Among due buckets:
1. the highest tier waiting in any of them goes first (a bucket's rank is the highest tier it holds;
   a request waiting past its tier's `promote_after` ranks above every tier), except that while no
   bucket of that tier is full and none has waited `age_gap_s`, a lower tier's full bucket may go
   where every bucket of that tier still meets its due after it: the higher tier's batch fills meanwhile,
   for at most `age_gap_s`; and whatever goes, a higher tier's bucket not due yet that would miss its due
   behind it (a tier's own objective, tighter than what its bucket lingers for) goes instead;
2. among the buckets of one rank, the one whose earliest due comes first (then the oldest): with one
   objective for all, the oldest; a late one too (it is not left to starve); but a full bucket goes before it
   (full batches are the cheapest) when it can afford that (it still meets its due after the full
   batch) and its oldest request has not waited longer than the full one's by more than `age_gap_s`.
   So the order is the order of arrival, as a predicted wait assumes, except where a full batch jumps
   a partial one that can afford it: a request is never served later than its due because of it;
3. a bucket whose next batch would finish a short call (a single request, or a multi-input call small
   enough to go whole in its turn: `tier_queue`) goes before the oldest one when that one holds only
   parts of large calls and still meets its due after it: the shortest finish first across buckets, as
   inside one, so a 10-document call beside 100-document ones waits for the batch running and its own,
   not for a turn of every bucket the large calls fill. In at most 6 of the last 8 batches (`short_jumps`,
   kept by the batcher): short calls alone saturating the model still leave a quarter of the batches to
   the other buckets. Within that budget the batcher also begins a bucket's batch with its oldest short
   call, wherever the call's turn stands (`RequestQueue.take`), and the batches it begins so count.
The bounds: a higher tier's request is held behind lower tiers' work at most `age_gap_s` (plus the
batch in progress), and never past a due it could meet; under saturation the buckets of one tier are
all served, and their oldest requests' waits stay within `age_gap_s` (plus a batch time) of each other,
except that short calls may take up to 6 of every 8 batches from the oldest bucket (rule 3).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(slots=True)  # (not frozen: one is made per admitted request, and a frozen one costs 8x as much)
class BucketView:
    """One bucket's queue as the rule needs it."""

    key: int
    count: int  # waiting requests
    tokens: int  # their tokens
    oldest_at: float  # when its oldest waiting request was queued
    due: float  # the earliest due (deadline or objective) of its waiting requests
    rank: float  # the highest effective priority waiting in it (promoted: inf)
    rank_oldest_at: float  # when the oldest request of that rank was queued
    size_limit: int  # where its batch stops growing
    batch_s: float  # what its batch would cost, sent now
    linger_s: float  # the most its partial batch waits for more requests
    short_at: float = math.inf  # when its oldest short call (of its top tier) was queued; inf: it holds none


@dataclass(frozen=True, slots=True)
class Limits:
    max_batch_tokens: int | None  # None: no token budget
    age_gap_s: float  # past this, an older bucket's request goes before a full bucket


@dataclass(frozen=True, slots=True)
class Decision:
    bucket: int | None  # the bucket whose batch goes now; None: none is due yet
    trigger: str  # full | linger | deadline | sparse | idle_worker ("" when none is due)
    due_at: float  # when none is due: the earliest time one may be
    short_jump: bool = False  # its bucket went before the oldest for a short call (rule 3)


def is_full(view: BucketView, limits: Limits) -> bool:
    return view.count >= view.size_limit or (
        limits.max_batch_tokens is not None and view.tokens >= limits.max_batch_tokens)


def decide(
    views: Iterable[BucketView],
    now: float,
    limits: Limits,
    *,
    arrival_rate: float,
    hold_until: float = 0.0,
    on_linger: str = "linger",
    short_jumps: bool = True,
    echo_back: bool = False,
) -> Decision:
    """The bucket to serve now, if any is due (see the module docstring). `on_linger` names the
    trigger of a bucket whose linger ran out (a worker that frees and finds one says "idle_worker");
    `short_jumps`: whether rule 3 may apply now; `echo_back`: the echo a worker was held for came
    back (every bucket waiting is due: "echo")."""
    due: list[tuple[BucketView, str]] = []
    not_due: list[BucketView] = []
    due_at = math.inf
    for view in views:
        if view.count == 0:
            continue
        trigger, when = ("echo", now) if echo_back and not is_full(view, limits) else \
            _due(view, now, limits, arrival_rate, hold_until, on_linger)
        if trigger:
            due.append((view, trigger))
        else:
            not_due.append(view)
            due_at = min(due_at, when)
    if not due:
        return Decision(None, "", due_at)
    top = max(view.rank for view, _ in due)
    best = [(v, t) for v, t in due if v.rank == top]
    if not any(t == "full" or now - v.rank_oldest_at >= limits.age_gap_s for v, t in best):
        lower_full = [(v, t) for v, t in due if t == "full"]
        if lower_full:  # the higher tier's batch is still filling: a full one of a lower tier goes meanwhile...
            lower = max(lower_full, key=lambda vt: (vt[0].rank, -vt[0].rank_oldest_at))
            if all(_affordable(v, lower[0], now) for v, _ in best):  # ...where it costs no higher one its due
                best = [lower]
    first, trigger = min(best, key=lambda vt: (vt[0].due, vt[0].rank_oldest_at))
    if short_jumps and first.short_at == math.inf:
        short = [vt for vt in best if vt[0].short_at < math.inf]
        if short:
            view, why = min(short, key=lambda vt: vt[0].short_at)
            if _affordable(first, view, now):
                return _unless_it_makes_a_higher_tier_late(Decision(view.key, why, now, True), view, not_due, now)
    if trigger != "full":
        full = [v for v, t in best if t == "full"]
        if full:
            jumper = min(full, key=lambda v: v.rank_oldest_at)
            if _may_jump(first, jumper, now, limits):
                return _unless_it_makes_a_higher_tier_late(Decision(jumper.key, "full", now), jumper, not_due, now)
    return _unless_it_makes_a_higher_tier_late(Decision(first.key, trigger, now), first, not_due, now)


def _unless_it_makes_a_higher_tier_late(decision: Decision, chosen: BucketView, not_due: list[BucketView],
                                        now: float) -> Decision:
    """`decision`, unless a bucket of a higher tier, not due yet, would miss its due behind the chosen
    batch while it can still meet it now (a tier's objective tighter than the bucket's linger: its
    batch would be due in the middle of the chosen one): then that bucket goes first."""
    late = [v for v in not_due if v.rank > chosen.rank and now < v.due - v.batch_s < now + chosen.batch_s]
    if not late:
        return decision
    return Decision(min(late, key=lambda v: v.due).key, "deadline", now)


def _affordable(first: BucketView, jumper: BucketView, now: float) -> bool:
    """Whether `first` still meets its due with `jumper`'s batch run before it."""
    return first.due - now - first.batch_s >= jumper.batch_s


def _may_jump(first: BucketView, jumper: BucketView, now: float, limits: Limits) -> bool:
    """Whether `jumper`'s full batch may go before `first`'s: affordable, and `first` has not waited
    longer than `jumper`'s oldest by more than the age gap."""
    return _affordable(first, jumper, now) and jumper.rank_oldest_at - first.rank_oldest_at <= limits.age_gap_s


def due_in(view: BucketView, now: float, limits: Limits, *, arrival_rate: float, hold_until: float = 0.0) -> float:
    """How long until `view`'s batch is due (0.0: it is), were a worker free for it."""
    trigger, when = _due(view, now, limits, arrival_rate, hold_until, "linger")
    return 0.0 if trigger else max(0.0, when - now)


def latest_start(oldest_at: float, due: float, batch_s: float) -> float:
    """When a partial batch stops lingering for its earliest `due`: a batch's time before the moment its
    own batch would end just in time, so that a batch in progress on the worker cannot make it late (as
    an objective's linger leaves two batch times); where its requests came with less than that, the
    moment it would end just in time."""
    with_slack = due - 2.0 * batch_s
    return with_slack if with_slack > oldest_at else due - batch_s


def _due(
    view: BucketView, now: float, limits: Limits, arrival_rate: float, hold_until: float, on_linger: str,
) -> tuple[str, float]:
    """(trigger, "") when `view` is due now; ("", when it will be) otherwise."""
    if is_full(view, limits):
        return "full", now
    linger_end = max(view.oldest_at + view.linger_s, hold_until)
    if now >= linger_end:
        return on_linger, now
    deadline_end = latest_start(view.oldest_at, view.due, view.batch_s)
    meetable = deadline_end > view.oldest_at  # else lingering changes nothing for it
    if meetable and now >= deadline_end:
        return "deadline", now
    wait_until = min(linger_end, deadline_end) if meetable else linger_end
    if now >= hold_until:  # (a closed-loop echo is about to come back: no early flush meanwhile)
        room = view.size_limit - view.count
        enough = max(1.0, 0.1 * room)
        if arrival_rate * (linger_end - now) < enough:
            return "sparse", now
        if arrival_rate > 0:  # the moment the rest of the linger stops being worth it
            wait_until = min(wait_until, linger_end - enough / arrival_rate)
    return "", wait_until
