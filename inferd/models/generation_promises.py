"""What a generation engine has been given and promised: every admitted request, from its admission
to its last token, and the prediction of a new request's time to first token (TTFT) and time per
output token (TPOT) that admission compares with its objectives.

The prediction replays the engine's queue forward with the learnt costs (`EngineCosts`), in the engine's
own order (priority, then arrival: vLLM's priority scheduling): the running sequences free their places
as their expected remaining tokens are made; each request ahead of the new one takes the next free
place, reads its prompt (one prefill at a time: prefill shares the engine's token budget), and runs for
its expected output; the new request's first token comes once the step in progress has ended and its own
prefill has been read, in the step that makes it. A request's places are the engine's running maximum,
or fewer when the KV cache holds fewer of the sequences admitted (prompt plus max_tokens each): a
request is handed to the engine only once that much of its cache is free (`hand_over`), kept back until
then, so the engine never preempts what was promised. Requests of lower priority are not ahead: a higher
tier passes them, and they are the ones that wait (or, once their objective has passed, are withdrawn).
And since the engine does not preempt for priority (vLLM preempts for KV cache only), a place a lower
tier holds is not given back in time to a higher tier's request: so places are kept for the tiers above
one that were promised a TTFT in the last minute, as many as they hold on average (their arrival rate
times the seconds a request holds its place), with room for their bursts, and a lower tier's requests
may hold only the rest, unless places turn over faster than that tier's objective (every running
request, and the newcomer, ends within it).

The error of every TTFT prediction is kept (`PredictionErrors`, as for batch models), and so is the cost
model's error over each request's steps (its time from first token to last against what the model said
those steps would take at the running counts they had): the margin a refusal adds is calibrated from
them, and one slow step widens it for seconds, not for good. Each error is a whole prediction's (actual
over predicted), so the margin is that ratio's 99th percentile times the prediction, not the square-root
rule of independent batches. A TPOT is not judged against the one predicted at its hand-off: the
requests that join later slow its steps, within the objective admission holds each of them to.

Why one module: the book's queues, its KV set aside and the prediction that replays them are read and
changed together on every admission; apart, each would have to know the other's insides.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from dataclasses import dataclass

from ..scheduling.prediction_errors import PredictionErrors
from .engine_costs import EngineCosts


@dataclass(frozen=True, slots=True)
class Objectives:
    """What a request was promised: the tighter of its model's and its tier's objectives (None: none)."""

    ttft_s: float | None = None
    tpot_s: float | None = None


NO_OBJECTIVES = Objectives()
KEPT_PLACE_MEMORY_S = 60.0  # a higher tier seen this recently still has the last place kept for it
DEMAND_TAU_S = 10.0  # the refusal rate's memory (a scrape every 5 s reads it twice)
RATE_MIN_AGE_S = 0.25  # a tier's rate is read over its age since its first arrival, at least this


@dataclass(frozen=True, slots=True)
class Prediction:
    """A new request's predicted figures (seconds from now), and the margins their errors add."""

    ttft_s: float
    tpot_s: float
    ttft_margin_s: float
    tpot_margin_s: float
    free_place: bool  # nothing ahead and a place free: its first token waits for its own prefill only


@dataclass(slots=True, eq=False)
class Promise:
    """One admitted request of a generation model, until its last token (or its withdrawal)."""

    request_id: str
    priority: int  # the engine's (lower first)
    order: int  # arrival, among the engine's requests
    arrived_at: float  # when the request reached the server (its objectives count from here)
    prompt_tokens: int  # judged from its characters until it is tokenised
    max_tokens: int
    expected_output: float
    objectives: Objectives
    tokenised: bool = False
    prediction: Prediction | None = None  # the last made for it, with its own tokens (reused at its hand-off)
    submitted_at: float = 0.0  # handed to the engine (0: not yet)
    predicted_ttft_s: float = 0.0  # from its hand-off, as predicted then
    free_place: bool = False
    first_at: float = 0.0
    last_at: float = 0.0
    made: int = 0  # output tokens so far
    kv_tokens: int = 0  # the KV cache set aside for it once handed to the engine (0: not handed)
    modelled_s: float = 0.0  # what the cost model said each of its steps since its first token would take, summed


def kv_need(promise: Promise, block_tokens: int = 0) -> int:
    """The most a request holds of the KV cache: its prompt and every token it may make, in whole blocks
    where the engine allocates its cache in blocks of `block_tokens` (vLLM's 16: a request of 110 tokens
    holds 7 blocks, 112; counted in tokens, 64 such requests overcommit the cache by 128)."""
    return in_blocks(promise.prompt_tokens + promise.max_tokens, block_tokens)


def in_blocks(tokens: int, block_tokens: int) -> int:
    """`tokens` rounded up to whole blocks of `block_tokens` (as they are where it is 0 or 1)."""
    return -(-tokens // block_tokens) * block_tokens if block_tokens > 1 else tokens


def _engine_order(promise: Promise) -> tuple[int, int]:
    return promise.priority, promise.order


class EngineBook:
    """The promises of one generation engine (see the module's docstring)."""

    def __init__(self, costs: EngineCosts) -> None:
        self.costs = costs
        self.ttft_errors = PredictionErrors()
        self.tpot_errors = PredictionErrors()
        self._waiting: dict[int, dict[str, Promise]] = {}  # by priority, in arrival order: no first token yet
        self.running: dict[str, Promise] = {}
        self._orders = itertools.count()
        self.places = 0  # the engine's running maximum (0: not known)
        self.promised_ttft: dict[int, tuple[float, float]] = {}  # by priority: (TTFT objective, last seen)
        self._arrivals: dict[int, tuple[float, float, float]] = {}  # by priority: a decayed count, its time, the first
        self.kv_cache_tokens = 0  # what its KV cache holds (0: not known)
        self.kv_block_tokens = 0  # the tokens of the blocks it allocates its cache in (0: not known, by the token)
        self.kv_handed = 0  # what the requests handed to the engine may hold at most (`kv_need` each)
        self._held: list[Promise] = []  # admitted, kept back until their KV need fits, in the engine's order
        self._refusals = 0.0  # refusals, each weighing exp((t - origin) / tau) (a rate: `refusal_rate`)
        self._refusals_at = 0.0

    # ---- the book --------------------------------------------------------------------------------

    def reserve(self, request_id: str, priority: int, arrived_at: float, prompt_tokens: int, max_tokens: int,
                objectives: Objectives) -> Promise:
        """A request admitted before tokenising: it counts among the waiting from here."""
        promise = Promise(request_id, priority, next(self._orders), arrived_at, prompt_tokens, max_tokens,
                          self.costs.expected_output(max_tokens), objectives)
        self._waiting.setdefault(priority, {})[request_id] = promise
        if objectives.ttft_s is not None:
            self.promised_ttft[priority] = (objectives.ttft_s, arrived_at)
        weight, at, first = self._arrivals.get(priority, (0.0, arrived_at, arrived_at))
        self._arrivals[priority] = (weight * math.exp(-max(0.0, arrived_at - at) / DEMAND_TAU_S) + 1.0, max(at, arrived_at), first)
        return promise

    def tokenised(self, promise: Promise, prompt_tokens: int, max_tokens: int) -> None:
        promise.prompt_tokens, promise.max_tokens, promise.tokenised = prompt_tokens, max_tokens, True
        promise.prediction = None  # (made from its judged length: not its own)
        promise.expected_output = self.costs.expected_output(max_tokens)

    def submitted(self, promise: Promise, prediction: Prediction, now: float) -> None:
        promise.submitted_at = now
        promise.predicted_ttft_s = prediction.ttft_s
        promise.free_place = prediction.free_place

    def first_token(self, promise: Promise, tokens: int, now: float) -> None:
        waiting = self._waiting.get(promise.priority)
        if waiting is None or waiting.pop(promise.request_id, None) is None:
            return
        running = len(self.running)
        self.running[promise.request_id] = promise
        promise.first_at = promise.last_at = now
        promise.made = tokens
        ttft = now - promise.submitted_at
        if promise.predicted_ttft_s > 0:
            self.ttft_errors.observe(ttft / promise.predicted_ttft_s, now)
        if promise.free_place:
            self.costs.observe_first_token(promise.prompt_tokens, ttft, running + 1, now)

    def tokens(self, promise: Promise, tokens: int, now: float) -> None:
        if tokens > 0:
            running = len(self.running)
            promise.modelled_s += tokens * self.costs.step_s(running)  # (before this step teaches the model)
            self.costs.observe_step(running, (now - promise.last_at) / tokens, now)
            promise.made += tokens
            promise.last_at = now

    def leave(self, promise: Promise, now: float, finished: bool) -> None:
        """Its last token, or its withdrawal (`finished` False: a deadline, a client gone, an error).
        Its KV set aside is free again: `released` then says who goes to the engine next."""
        if promise.kv_tokens:
            self.kv_handed -= promise.kv_tokens
            promise.kv_tokens = 0
        elif promise in self._held:
            self._held.remove(promise)
        waiting = self._waiting.get(promise.priority)
        if waiting is not None:
            waiting.pop(promise.request_id, None)
        if self.running.pop(promise.request_id, None) is None or not finished:
            return
        self.costs.observe_output(promise.made, promise.max_tokens, now)
        self.costs.observe_service(now - promise.first_at + self.costs.step_s(len(self.running) + 1), now)  # (its place, held)
        if promise.modelled_s > 0:
            # (the cost model's error over the steps it really ran, at the running counts they had: not
            # the TPOT predicted at its hand-off, which those who joined later raise within the objective
            # that admission holds them to; read so, a request handed over beside 7 others and finished
            # beside 50 was a 2.5x error, and the margin refused every newcomer at 4x capacity)
            self.tpot_errors.observe((promise.last_at - promise.first_at) / promise.modelled_s, now)

    # ---- handing requests to the engine ----------------------------------------------------------

    def hand_over(self, promise: Promise) -> bool:
        """Whether `promise` goes to the engine now: its KV need fits beside what the requests already
        handed over may hold, and nothing before it in the engine's order (priority, then arrival) is
        kept back. Otherwise it is kept back, in that order, until `released` names it: an engine given
        more than its KV cache holds starts them all and then preempts what it runs as their outputs
        grow (vLLM's scheduler, and the simulated one), breaking the TPOT promised to them."""
        bisect.insort(self._held, promise, key=_engine_order)
        return promise in self.released()

    def released(self) -> list[Promise]:
        """Those kept back that go to the engine now (their KV set aside), in order; the first that
        does not fit stops the rest, as the engine's own queue would."""
        out = []
        while self._held and self._fits(self._held[0]):
            promise = self._held.pop(0)
            promise.kv_tokens = kv_need(promise, self.kv_block_tokens)
            self.kv_handed += promise.kv_tokens
            out.append(promise)
        return out

    def _fits(self, promise: Promise) -> bool:
        need = kv_need(promise, self.kv_block_tokens)
        return self.kv_cache_tokens <= 0 or not self.kv_handed or self.kv_handed + need <= self.kv_cache_tokens

    @property
    def kept_back(self) -> int:
        return len(self._held)

    def refused(self, now: float) -> None:
        """A request refused at admission (counted for `demand`)."""
        self._refusals = self._refusals * math.exp(-(now - self._refusals_at) / DEMAND_TAU_S) + 1.0
        self._refusals_at = now

    def refusal_rate(self, now: float) -> float:
        """Refusals per second, over about the last `DEMAND_TAU_S`."""
        return self._refusals * math.exp(-(now - self._refusals_at) / DEMAND_TAU_S) / DEMAND_TAU_S

    def demand(self, now: float) -> float:
        """The sequences this engine is asked to run at once: those it holds, plus the refused ones
        at the rate they come times the seconds each would have held a place (Little's law). It reads
        in proportion to the offered load however far past capacity (what an autoscaler divides by
        a replica's places), where the running and waiting alone stop at what admission lets in."""
        return len(self.running) + self.waiting + self.refusal_rate(now) * self.costs.service_s

    def priorities(self) -> list[int]:
        return [q for q, w in self._waiting.items() if w] + [p.priority for p in self.running.values()]

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    # ---- prediction ------------------------------------------------------------------------------

    def predict(self, priority: int, prompt_tokens: int, max_tokens: int, now: float,
                leave_out: Promise | None = None) -> Prediction:
        """A new request's TTFT and TPOT if it were handed to the engine now (see the module's
        docstring); `leave_out`: its own promise, already in the book."""
        costs = self.costs
        ahead = [p for q in sorted(self._waiting) if q <= priority for p in self._waiting[q].values() if p is not leave_out]
        places = self._places(ahead, prompt_tokens + max_tokens)
        joined = min(places, len(self.running) + len(ahead) + 1)
        step = costs.step_s(joined)
        finish = [max(step, (p.expected_output - p.made) * step) for p in self.running.values()]
        heapq.heapify(finish)
        prefill_free = 0.0
        for p in ahead:
            start = heapq.heappop(finish) if len(finish) >= places else 0.0
            prefill_free = max(start, prefill_free) + costs.prefill_s(p.prompt_tokens)
            heapq.heappush(finish, prefill_free + step * (1 + p.expected_output))
        start = heapq.heappop(finish) if len(finish) >= places else 0.0
        # (its first token: the step in progress ends, its prefill is read, and the step that reads its
        # last chunk makes it)
        ttft = max(start, prefill_free) + costs.prefill_s(prompt_tokens) + 2 * step
        self.ttft_errors.refresh(now)
        self.tpot_errors.refresh(now)
        # (a free place only when nothing else waits, whatever its priority: a lower tier's request the
        # engine has already started holds a place the queue's order does not show)
        alone = self.waiting - (leave_out is not None and leave_out.request_id in self._waiting.get(leave_out.priority, {}))
        return Prediction(ttft, step, self.ttft_errors.batch_excess * ttft, self.tpot_errors.batch_excess * step,
                          free_place=alone == 0 and start == 0.0)

    def kept_places(self, priority: int, now: float) -> int:
        """Places kept for the tiers above `priority` that were promised a time to first token: what
        they hold on average (their arrival rate times the seconds a request holds its place: Little's
        law) plus two standard deviations of a Poisson stream's count (its bursts), and one more. None kept
        where no such tier came in the last `KEPT_PLACE_MEMORY_S`."""
        rates = [self._arrival_rate(q, now) for q, (_, at) in self.promised_ttft.items()
                 if q < priority and now - at <= KEPT_PLACE_MEMORY_S]
        if not rates:
            return 0
        held = sum(rates) * self.costs.service_s
        return math.ceil(held + 2 * math.sqrt(held)) + 1  # (arrivals come as a Poisson stream's: its bursts too)

    def higher_ttft_s(self, priority: int, now: float) -> float:
        """The tightest TTFT objective of the tiers above `priority` seen in the last `KEPT_PLACE_MEMORY_S`."""
        return min((ttft for q, (ttft, at) in self.promised_ttft.items() if q < priority and now - at <= KEPT_PLACE_MEMORY_S),
                   default=0.0)

    def ending_within(self, seconds: float) -> int:
        """Running requests expected to make their last token within `seconds`."""
        if seconds <= 0:
            return 0
        step = self.costs.step_s(len(self.running))
        return sum(max(1.0, p.expected_output - p.made) * step <= seconds for p in self.running.values())

    def turns_over_in_time(self, promise: Promise, now: float, step_s: float) -> bool:
        """Whether every running request, and `promise` too, ends within the higher tiers' objective:
        places then come in time for their requests anyway, and none needs keeping."""
        window = self.higher_ttft_s(promise.priority, now) - 2 * step_s
        return promise.expected_output * step_s <= window and self.ending_within(window) >= len(self.running)

    def held_from(self, priority: int, leave_out: Promise | None = None) -> int:
        """Requests of `priority` and below (lower tiers) in the book: running or waiting for a place."""
        running = sum(p.priority >= priority for p in self.running.values())
        waiting = sum(len(w) for q, w in self._waiting.items() if q >= priority)
        return running + waiting - (leave_out is not None and leave_out.request_id in self._waiting.get(leave_out.priority, {}))

    def _arrival_rate(self, priority: int, now: float) -> float:
        weight, at, first = self._arrivals.get(priority, (0.0, now, now))
        # a steady rate r since `first` holds r x tau x (1 - e^(-age / tau)) by now: read over that reach
        # (over min(age, tau) it read 37% low at 10 s); at least a quarter second's: a first arrival or two
        # are no rate, but over a whole second a tier's first half second read half its rate, and lower
        # tiers took the places its start needed
        reach_s = DEMAND_TAU_S * -math.expm1(-max(RATE_MIN_AGE_S, now - first) / DEMAND_TAU_S)
        return weight * math.exp(-(now - at) / DEMAND_TAU_S) / reach_s

    def _places(self, ahead: list[Promise], need: int) -> int:
        """How many sequences run at once: the engine's maximum, or what its KV cache holds of the
        sequences in the book (each its `kv_need`, as `hand_over` sets aside), whichever is fewer."""
        places = self.places or max(1, len(self.running) + len(ahead) + 1)
        if self.kv_cache_tokens > 0:
            block = self.kv_block_tokens
            held = [kv_need(p, block) for p in self.running.values()] + [kv_need(p, block) for p in ahead] + \
                [in_blocks(need, block)]
            places = min(places, max(1, int(self.kv_cache_tokens * len(held) / sum(held))))
        return places

    def tightest_tpot_s(self) -> float | None:
        """The tightest TPOT objective of the requests in the book (a newcomer must not break it)."""
        objectives = [p.objectives.tpot_s for w in (*self._waiting.values(), self.running) for p in w.values()]
        return min((t for t in objectives if t is not None), default=None)

    def crowded(self) -> bool:
        """Whether the engine already runs (or will, with those waiting) all it runs at once: a
        newcomer then waits for a place and slows no one's steps."""
        return 0 < self.places <= len(self.running) + self.waiting - 1
