"""Whether a generation request must be refused now: its predicted figures (`EngineBook.predict`)
against its objectives and the admitted requests' own, and the places kept for higher tiers. A
refusal names the figures it compared, in its message and in Server-Timing."""

from __future__ import annotations

from ..errors import ServiceOverloaded, retry_after_ms
from .generation_promises import EngineBook, Prediction, Promise


def refusal(book: EngineBook, promise: Promise, prediction: Prediction, now: float) -> ServiceOverloaded | None:
    """Why `promise` must be refused now (its own TTFT or TPOT objective, or the TPOT of the requests
    already admitted), with the figures compared; None when it is predicted to meet them all."""
    ttft_s, tpot_s = promise.objectives.ttft_s, promise.objectives.tpot_s
    if ttft_s is not None:
        budget = ttft_s - (now - promise.arrived_at)
        predicted = prediction.ttft_s + prediction.ttft_margin_s
        if predicted > budget:
            return _refused("time to first token", prediction.ttft_s, prediction.ttft_margin_s, budget, ttft_s,
                            "ttft_objective", wait_s=predicted - budget)
    kept = book.kept_places(promise.priority, now)
    if kept and book.places and book.held_from(promise.priority, promise) + 1 > book.places - kept \
            and not book.turns_over_in_time(promise, now, prediction.tpot_s):
        # (the engine preempts for KV cache only, as vLLM's does: a place a lower tier holds is not
        # given back to a higher tier's request before that request's objective has passed)
        return ServiceOverloaded(
            f"{kept} of the engine's {book.places} places are kept for higher tiers' time-to-first-token objectives, "
            f"and this tier's requests hold the rest", retry_after_ms=retry_after_ms(book.costs.service_s / max(1, kept)),
            reason="kept_for_higher_tier")
    others = None if book.crowded() else book.tightest_tpot_s()
    tightest = min((t for t in (tpot_s, others) if t is not None), default=None)
    if tightest is not None and prediction.tpot_s + prediction.tpot_margin_s > tightest:
        whose = "this request's" if tightest == tpot_s else "the admitted requests'"
        return _refused("time per output token", prediction.tpot_s, prediction.tpot_margin_s, tightest, tightest,
                        "tpot_objective", whose=whose, wait_s=prediction.tpot_s * promise.expected_output)
    return None


def _refused(what: str, predicted: float, margin: float, budget: float, objective: float, reason: str, *,
             wait_s: float, whose: str = "this request's") -> ServiceOverloaded:
    refused = ServiceOverloaded(
        f"predicted {what} {predicted * 1000:.0f} ms plus a {margin * 1000:.0f} ms margin exceeds {whose} "
        f"{objective * 1000:.0f} ms objective ({budget * 1000:.0f} ms of it left)",
        retry_after_ms=retry_after_ms(max(wait_s, 0.001)), reason=reason)
    refused.server_timing = f"predicted;dur={predicted * 1000:.3f}, margin;dur={margin * 1000:.3f}, budget;dur={budget * 1000:.3f}"
    return refused
