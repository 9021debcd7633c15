"""Where a batch stops growing while it is filled from a queue: its size limit, its token budget, and
what its size costs against its members' dues (see `BatchFilling`). Used by `request_queue.take`,
under the batcher's lock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..messages import PendingRequest

SHORT_CALL_GROWTH = 0.25  # a batch carrying a short call grows past it by at most this share of its time


def tokens_of(request: PendingRequest) -> int:
    """A request's share of a token budget: its tokens, or one when nothing counted them."""
    return request.tokens or 1


class BatchFilling:
    """A batch being filled, and what stops it growing: its size limit, its token budget (the first
    request always goes), and, when the time of each size is known (`curve[n] x level` seconds for n
    requests), its members' dues: a request joins only if the larger batch still ends by the due of
    every member that the smaller one serves in time with the estimate's margin to spare. (A member
    that would be late even so, or only just in time, does not hold the batch back: a curve flat but for
    noise must not cut batches short; one whose due is past the largest batch's end never can.)

    A batch carrying a short call (`carries_short_call`: one going whole in its turn) takes the whole call,
    past its size limit if need be, up to `max_size` (the backend's own): the limit is the cost model's
    useful size, on a CPU perhaps below a short call's inputs, and a call split over two batches ends
    with the second. It grows past the call only while its time stays within `SHORT_CALL_GROWTH` of
    that: free where a batch's time hardly grows with its size (a GPU's), two or three more inputs where
    it grows with each (a CPU's). Why: on a CPU a 10-document call beside 100-document ones of its
    tenant went in a batch filled to the limit with their pairs (p50 1.5-1.7 s against ~0.2 s alone;
    1.0 s since, S15). Only among one tenant's calls (`request_queue.take`): where several tenants
    wait, their turns share the batch as before, or one tenant's stream of short calls would take the
    others' slots on a CPU."""

    __slots__ = ("taken", "limit", "max_size", "tokens_left", "now", "curve", "level", "margin", "horizon", "tightest",
                 "short_end", "short_call", "stopped")

    def __init__(self, limit: int, token_budget: int | None, now: float, curve: Sequence[float] | None,
                 level: float, margin: float = 1.0, max_size: int | None = None) -> None:
        self.taken: list[PendingRequest] = []
        self.limit = limit
        self.max_size = max(limit, max_size or limit)
        self.tokens_left = math.inf if token_budget is None else token_budget
        self.curve: Sequence[float] = () if curve is None else curve  # (read only where a bound was set: with a curve)
        self.now, self.level, self.margin = now, level, margin
        self.horizon = -math.inf if curve is None else now + curve[limit] * level  # when the largest batch ends
        self.tightest = math.inf  # the earliest due among members that will meet it
        self.short_end = math.inf  # with a short call aboard, the most its shape may grow to (level 1.0)
        self.short_call: tuple[str, str | None] | None = None  # (tenant, call) of a short call aboard: may pass `limit`
        self.stopped = False

    @property
    def open(self) -> bool:
        return not self.stopped and len(self.taken) < (self.limit if self.short_call is None else self.max_size)

    def fits(self, request: PendingRequest, short_call: bool = False) -> bool:
        """Whether `request` may join; when it may not, the batch is closed. `short_call`: it is an input
        of a short call (which goes whole: the bound of a short call aboard does not stop it)."""
        n = len(self.taken)  # (without a curve neither bound is ever set: both stay inf)
        if n and ((n >= self.limit and not (short_call and (request.tenant, request.call_id) == self.short_call))
                  or tokens_of(request) > self.tokens_left
                  or (self.tightest < math.inf and self.now + self.curve[n + 1] * self.level > self.tightest)
                  or (self.short_end < math.inf and not short_call and self.curve[n + 1] > self.short_end)):
            self.stopped = True
            return False
        return True

    def carries_short_call(self, bound_growth: bool = True) -> None:
        """The input just added is one of a short call's (which goes whole, past the limit if need be): the
        batch may now grow only by `SHORT_CALL_GROWTH` of its time (see the class docstring; without a
        measured curve, as it likes). `bound_growth` False: other tenants wait too, whose turns fill the
        batch up to the limit as before."""
        last = self.taken[-1]
        self.short_call = (last.tenant, last.call_id)
        if self.curve and bound_growth:
            self.short_end = self.curve[len(self.taken)] * (1.0 + SHORT_CALL_GROWTH)

    def add(self, request: PendingRequest) -> None:
        self.taken.append(request)
        self.tokens_left -= tokens_of(request)
        due = request.due
        if due < self.horizon and due >= self.now + self.curve[len(self.taken)] * self.level * self.margin:
            self.tightest = min(self.tightest, due)
