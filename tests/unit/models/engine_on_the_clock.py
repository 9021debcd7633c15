"""A generation model's admission and the simulated engine's core on a fake clock: arrivals are
admitted or refused by `EngineBook`'s prediction, admitted ones run in `EngineCore`'s steps, and a
request whose time-to-first-token objective passes while it waits is withdrawn, as the server does.
Deterministic, no threads, no event loop."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from inferd.backends.sim_engine import EngineCore, Profile, Sequence
from inferd.models.engine_costs import EngineCosts
from inferd.models.generation_promises import EngineBook, Objectives, Promise
from inferd.models.generation_refusals import refusal


@dataclass
class Arrival:
    at: float
    priority: int = 0
    prompt_tokens: int = 64
    max_tokens: int = 64
    objectives: Objectives = Objectives(0.5, 0.025)


@dataclass
class Ended:
    """How one request ended: `refused` (at once), `withdrawn` (its TTFT objective passed) or `answered`."""

    arrival: Arrival
    how: str
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    refused_at: float = 0.0
    reason: str = ""
    message: str = ""


@dataclass
class Run:
    ended: list[Ended] = field(default_factory=list)
    duration_s: float = 0.0
    demand: list[tuple[float, float]] = field(default_factory=list)  # (t, `EngineBook.demand`) once a second
    preemptions: int = 0  # the engine's

    def of(self, how: str, priority: int | None = None) -> list[Ended]:
        return [e for e in self.ended if e.how == how and (priority is None or e.arrival.priority == priority)]

    def on_time(self, e: Ended) -> bool:
        o = e.arrival.objectives
        return e.how == "answered" and (o.ttft_s is None or e.ttft_s <= o.ttft_s) and (o.tpot_s is None or e.tpot_s <= o.tpot_s)


def poisson(rate: float, seconds: float, seed: int = 0, **fields) -> list[Arrival]:
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(rate)
        if t >= seconds:
            return out
        out.append(Arrival(t, **fields))


def run(arrivals: list[Arrival], profile: Profile | None = None, costs: EngineCosts | None = None,
        step_scale=lambda t: 1.0) -> Run:
    """Every arrival to its end. `step_scale(t)`: the engine's steps slowed (or sped) by this factor at t."""
    profile = profile or Profile()
    book = EngineBook(costs or EngineCosts())
    book.places, book.kv_cache_tokens = profile.max_running, profile.kv_cache_tokens
    core = EngineCore(profile)
    out = Run()
    pending = sorted(arrivals, key=lambda a: a.at)
    live: dict[Sequence, tuple[Promise, Arrival]] = {}
    kept: dict[str, tuple[Promise, Arrival]] = {}  # kept back for KV (`EngineBook.hand_over`), by request id
    t, step_end, step_made = 0.0, None, []
    i = 0

    def hand(promise: Promise, arrival: Arrival) -> None:
        live[core.add(promise.request_id, arrival.prompt_tokens, arrival.max_tokens, arrival.priority)] = (promise, arrival)

    def leave(promise: Promise, now: float, finished: bool) -> None:
        book.leave(promise, now, finished)
        for released in book.released():
            hand(*kept.pop(released.request_id))

    def withdraw(now: float) -> None:
        """Those whose TTFT objective passed before `now` without a first token (the server's timer)."""
        late = lambda promise, arrival: (not promise.first_at and arrival.objectives.ttft_s is not None  # noqa: E731
                                         and now > arrival.at + arrival.objectives.ttft_s)
        for request_id, (promise, arrival) in list(kept.items()):
            if late(promise, arrival):
                del kept[request_id]
                leave(promise, now, finished=False)
                out.ended.append(Ended(arrival, "withdrawn"))
        for seq, (promise, arrival) in list(live.items()):
            if late(promise, arrival):
                core.abort(seq)
                del live[seq]
                leave(promise, now, finished=False)
                out.ended.append(Ended(arrival, "withdrawn"))

    while i < len(pending) or live or kept:
        next_arrival = pending[i].at if i < len(pending) else float("inf")
        if step_end is not None and step_end <= next_arrival:
            t = step_end
            withdraw(t)
            for seq in step_made:
                if seq not in live:
                    continue
                promise, arrival = live[seq]
                if not promise.first_at:
                    book.first_token(promise, 1, t)
                else:
                    book.tokens(promise, 1, t)
                if seq.made >= seq.max_tokens:
                    del live[seq]
                    leave(promise, t, finished=True)
                    tpot = (t - promise.first_at) / max(1, promise.made - 1)
                    out.ended.append(Ended(arrival, "answered", promise.first_at - arrival.at, tpot))
            step_end = None
        else:
            t = next_arrival
            withdraw(t)
            arrival = pending[i]
            i += 1
            promise = book.reserve(f"r{i}", arrival.priority, t, arrival.prompt_tokens, arrival.max_tokens, arrival.objectives)
            book.tokenised(promise, arrival.prompt_tokens, arrival.max_tokens)
            prediction = book.predict(arrival.priority, arrival.prompt_tokens, arrival.max_tokens, t, promise)
            refused = refusal(book, promise, prediction, t)
            if refused is not None:
                book.leave(promise, t, finished=False)
                book.refused(t)
                out.ended.append(Ended(arrival, "refused", refused_at=t, reason=refused.reason, message=refused.message))
            else:
                book.submitted(promise, prediction, t)
                if book.hand_over(promise):
                    hand(promise, arrival)
                else:
                    kept[promise.request_id] = (promise, arrival)
        if not out.demand or t - out.demand[-1][0] >= 1.0:
            out.demand.append((t, book.demand(t)))
        if step_end is None and core.busy:
            seconds, step_made = core.step()
            step_end = t + seconds * step_scale(t)
    out.duration_s = t
    out.preemptions = core.preemptions
    return out


def capacity(profile: Profile | None = None, clients: int = 64, seconds: float = 20.0) -> float:
    """Requests per second of a closed loop of `clients` (64 prompt tokens, 64 output tokens)."""
    profile = profile or Profile()
    core = EngineCore(profile)
    t, done, n = 0.0, 0, 0
    for _ in range(clients):
        core.add(f"c{n}", 64, 64)
        n += 1
    while t < seconds:
        seconds_, made = core.step()
        t += seconds_
        for seq in made:
            if seq.made >= seq.max_tokens:
                done += 1
                core.add(f"c{n}", 64, 64)
                n += 1
    return done / t
