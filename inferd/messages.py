"""The records that travel down the data path: one per request, one per batch.

Words (the glossary in docs/architecture.md): a *request* is one input waiting for one output; a *call*
is one HTTP request of one input or several; a *batch* is what one backend call runs; a *worker* is one
executor thread and the model copy it built; a *timeout* is a duration, a *deadline* the moment it ends.

A queued request's `state` is only changed under its model queue's lock, which is what lets the event loop
(cancel, deadline) and a worker thread (taking a batch) race for it safely: whoever moves it out of
QUEUED first wins, and a request that left the queue as expired or cancelled is never computed.
Before it is queued (PREPARING), only the event loop touches it. Its future is only ever touched on
the event loop.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class RequestState(Enum):
    """Where a request stands; changed only under its queue's lock once it is queued."""

    PREPARING = "preparing"  # with the model's preprocessing thread (e.g. being tokenised), not queued yet
    QUEUED = "queued"
    TAKEN = "taken"  # in a batch handed to a worker
    EXPIRED = "expired"  # deadline passed while queued
    CANCELLED = "cancelled"  # client went away while queued
    REJECTED = "rejected"  # its preparation refused it (e.g. over the token limit): answered 400
    ATTACHED = "attached"  # never queued: it waits on an identical request's computation (`lead`)
    CACHED = "cached"  # never queued: answered from the result cache


@dataclass(slots=True, eq=False)
class Client:
    """The connection requests come on, as the batcher's closed-loop echo sees it (`scheduling.arrivals`):
    one per connection, made by the network side, each of its requests pointing at it (its identity is
    what the echo waits for). Written only under the batcher's lock."""

    missed: int = 0  # holds in a row that waited for it in vain

    @property
    def slow(self) -> bool:
        """It missed two holds in a row: not waited for again until it comes back while a worker is held.
        (One miss is a busy moment: a loaded client's last few come back late now and then.)"""
        return self.missed >= 2


@dataclass(frozen=True, slots=True, eq=False)
class EveryToken:
    """An input whose every token's vector is asked (TEI's `/embed_all`), not its pooled one: a text or
    token ids, as `/embed` takes them. It is an identity of its own for collapsing and the result cache
    (`models.shared_work`), so it never shares an `/embed` of the same text, and a text model marks its
    ids through the batch (`backends.text_inputs.EveryTokenIds`)."""

    item: str | list[int]

    def __len__(self) -> int:
        return len(self.item)


@dataclass(slots=True, eq=False)
class PendingRequest:
    """One admitted request waiting for its output."""

    request_id: str
    input: Any
    enqueued_at: float  # time.monotonic()
    deadline: float  # time.monotonic()
    future: asyncio.Future
    due: float = math.inf  # when its answer is wanted: its deadline, or sooner its latency objective (set by its model)
    slo_at: float | None = None  # when its latency objective ends (None: it has none)
    predicted_wait: float | None = None  # the wait predicted when it was queued (seconds), for the error
    predicted_start: float | None = None  # when its batch was predicted to start, and...
    predicted_done: float = 0.0  # ...its answer (without the margin): for the margin's bound (`Lateness`)
    state: RequestState = RequestState.QUEUED
    attempts: int = 0  # backend runs it was part of (a hung or dead worker's batch runs again)
    batch: Batch | None = None  # set when taken, for the response's timing and logs
    tier: str = "default"
    tenant: str = "anonymous"
    call_id: str | None = None  # the request id of the multi-input call it is one input of (None: a call of its own)
    call_size: int = 1  # how many inputs that call has
    bucket: int = 0  # batches never mix buckets (e.g. token-length buckets)
    raw: Any = None  # the client's input, when `input` is what the backend's `prepare` made of it
    tokens: int = 0  # its size in tokens, when its preparation counted them
    key: Any = None  # its input's identity, when identical requests share work (collapsing, the cache)
    riders: list[PendingRequest] | None = None  # identical requests waiting on this one's computation
    lead: PendingRequest | None = None  # ATTACHED: the request whose computation answers this one
    wheel_slot: int = 0  # the deadline wheel's slot it sits in (its deadline may be extended for riders)
    trace: Any = None  # its request's trace, when sampled (`observability.tracing`)
    client: Client | None = None  # the connection it came on, where the network side knows it


@dataclass(slots=True, eq=False)
class Batch:
    """Requests a worker runs in one backend call, and how that call went. Once its answers are
    delivered it lets go of its requests and outputs (each answered request still points at it, for
    its timings: the two must not hold each other, or only the cyclic collector would free them)."""

    batch_id: int
    requests: list[PendingRequest]
    trigger: str  # full | linger | deadline | sparse | idle_worker
    formed_at: float
    size: int = 0  # its requests (set from them)
    bucket: int = 0  # their length bucket (set from them)
    backlog: int = 0  # requests still waiting when it was taken (> 0: its size is what the load allowed)
    worker: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0
    linger_s: float = 0.0  # how long a free worker waited for this batch to fill
    gap_s: float | None = None  # back to back with its worker's previous call: the time between them
    outputs: list[Any] | None = None
    error: BaseException | None = None  # the batch's call raised (see `failures` for what isolation found)
    failures: dict[int, BaseException] | None = None  # after bisection: the requests that failed on their own
    abandoned: bool = False  # the watchdog gave up on it: its results, if they ever come, are discarded
    span: Any = None  # its trace span's context, when it carried a sampled request
    compute_timing: str = ""  # Server-Timing's `compute` entry, written once for all its answers (`timing`)

    def __post_init__(self) -> None:
        self.size = len(self.requests)
        self.bucket = self.requests[0].bucket if self.requests else 0

    def clients(self) -> list[Client | None]:
        """The connections its requests came on (what the batcher's echo waits for), read by its worker
        before the batch goes to the loop, so that its requests are let go of once answered rather than
        a batch later (kept, a batch's worth of them outlived a collection and climbed the collector's
        generations: 8% more CPU a request at 400 clients, S2)."""
        return [request.client for request in self.requests]

    def delivered(self) -> None:
        """Its answers went out: let go of its requests and outputs."""
        self.requests, self.outputs = [], None

    def queue_s(self, request: PendingRequest) -> float:
        """How long `request` waited: from entering the queue to the start of this batch (0 for one that
        attached to an input of this batch while it ran)."""
        return max(0.0, self.started_at - request.enqueued_at)

    @property
    def compute_s(self) -> float:
        return self.finished_at - self.started_at

    def timing(self, request: PendingRequest) -> str:
        """`request`'s Server-Timing from this batch: its `queue`, and the batch's `compute`, formatted
        once per batch (0.28 us an answer, against 0.71 for both floats formatted per answer)."""
        compute = self.compute_timing
        if not compute:
            compute = self.compute_timing = "compute;dur=%.3f" % (self.compute_s * 1000)
        return "queue;dur=%.3f, %s" % (self.queue_s(request) * 1000, compute)  # noqa: UP031 - the request path's, as measured


# How a parked worker is handed its batch (None: stop), called from any thread: the batcher holds it
# while the worker waits, the worker (`execution.worker`) gives it.
Taker = Callable[[Batch | None], None]
