"""Generation's admission by predicted TTFT and TPOT, on the fake clock (`engine_on_the_clock`): the
simulated engine at a GPU's figures, Poisson arrivals past its capacity."""

from __future__ import annotations

import math

import pytest

from inferd.backends.sim_engine import Profile
from inferd.models.engine_costs import EngineCosts
from inferd.models.generation_promises import EngineBook, Objectives
from inferd.models.generation_refusals import refusal
from tests.unit.models.engine_on_the_clock import Arrival, capacity, poisson, run


@pytest.mark.parametrize("load", [1.2, 2.0, 4.0])
def test_past_capacity_every_answer_meets_its_objectives_and_the_rest_are_refused_at_once(load):
    c = capacity()
    result = run(poisson(load * c, 20.0, seed=int(load * 10)))
    answered, refused, withdrawn = result.of("answered"), result.of("refused"), result.of("withdrawn")
    assert len(answered) + len(refused) + len(withdrawn) == len(poisson(load * c, 20.0, seed=int(load * 10)))  # nothing lost
    assert all(result.on_time(e) for e in answered), [(e.ttft_s, e.tpot_s) for e in answered if not result.on_time(e)][:5]
    assert all(e.refused_at == e.arrival.at for e in refused)  # at once, when it came
    assert len(withdrawn) <= 0.03 * len(answered)  # (mispredicted: withdrawn at their objective, never late)
    assert len(answered) / result.duration_s >= 0.9 * c  # goodput: the engine's capacity, on time


def test_below_capacity_almost_nothing_is_refused():
    c = capacity()
    result = run(poisson(0.5 * c, 20.0, seed=5))
    assert len(result.of("refused")) + len(result.of("withdrawn")) <= 0.01 * len(result.ended)


def test_a_higher_tier_passes_the_lower_ones_and_they_are_the_ones_refused():
    c = capacity()
    free = poisson(2.5 * c, 15.0, seed=1, priority=0)
    enterprise = poisson(0.2 * c, 15.0, seed=2, priority=-2)
    result = run(free + enterprise)
    top = result.of("answered", -2)
    assert all(result.on_time(e) for e in top) and all(result.on_time(e) for e in result.of("answered", 0))
    assert len(top) >= 0.99 * len(enterprise)  # (the last free place kept for it when the running end too late)
    assert len(result.of("refused", 0)) > 0.4 * len(free)
    reasons = {e.reason for e in result.of("refused", 0)}
    assert reasons <= {"ttft_objective", "tpot_objective", "kept_for_higher_tier"} and "kept_for_higher_tier" in reasons


def test_no_place_is_kept_where_no_higher_tier_has_come():
    c = capacity()
    result = run(poisson(2.5 * c, 10.0, seed=1, priority=0))
    assert "kept_for_higher_tier" not in {e.reason for e in result.of("refused")}
    assert len(result.of("answered")) / result.duration_s >= 0.9 * c


def test_a_refusal_names_the_figures_it_compared():
    book = EngineBook(EngineCosts())
    book.places = 2
    for i in range(2):  # two long requests hold both places
        p = book.reserve(f"r{i}", 0, 0.0, 10, 1000, Objectives())
        book.first_token(p, 1, 0.0)
    newcomer = book.reserve("new", 0, 0.0, 10, 10, Objectives(ttft_s=0.1))
    prediction = book.predict(0, 10, 10, 0.0, newcomer)
    refused = refusal(book, newcomer, prediction, 0.0)
    assert refused is not None and refused.reason == "ttft_objective"
    assert f"predicted time to first token {prediction.ttft_s * 1000:.0f} ms" in refused.message
    assert "100 ms objective" in refused.message
    assert refused.server_timing == (f"predicted;dur={prediction.ttft_s * 1000:.3f}, "
                                     f"margin;dur={prediction.ttft_margin_s * 1000:.3f}, budget;dur=100.000")
    assert prediction.ttft_s > 0.1  # (999 tokens of 20 ms steps before a place frees)


def test_the_prediction_follows_the_steps_up_and_back_down():
    costs = EngineCosts()
    t = 0.0
    for step_s in (0.010, 0.030, 0.010):  # 20 s of each: the engine slows threefold, then recovers
        for _ in range(2000):
            t += 0.01
            costs.observe_step(8, step_s, t)
        assert costs.step_s(8) == pytest.approx(step_s, rel=0.15)  # (within 15% once 20 s have passed)


def test_the_step_line_is_learnt_from_steps_at_different_counts():
    costs = EngineCosts()
    for i in range(400):
        n = 1 + i % 64
        costs.observe_step(n, 0.008 + 0.0001 * n, i * 0.005)
    assert costs.step_s(64) == pytest.approx(0.0144, rel=0.05)
    assert costs.step_s(1) == pytest.approx(0.0081, rel=0.1)


def test_the_prefill_rate_is_learnt_from_requests_that_found_a_free_place():
    costs = EngineCosts()
    for i in range(100):
        costs.observe_step(1, 0.01, i * 0.01)
    for i in range(100):  # 1,000-token prompts read in 50 ms (20,000 tokens/s), first token two steps later
        costs.observe_first_token(1000, 0.05 + 2 * 0.01, 1, 1.0 + i * 0.1)
    assert costs.prefill_s(1000) == pytest.approx(0.05, rel=0.05)


def test_one_slow_step_does_not_refuse_requests_with_ten_times_the_time_they_need():
    c = capacity()
    slow = lambda t: 20.0 if 5.0 <= t < 5.02 else 1.0  # noqa: E731 - one step 20 times as long, 5 s in
    arrivals = poisson(0.3 * c, 10.0, seed=3, objectives=Objectives(ttft_s=2.0, tpot_s=0.25))
    result = run(arrivals, step_scale=slow)
    assert not result.of("refused") and not result.of("withdrawn")


def test_a_kv_cache_too_small_for_all_admitted_makes_them_wait_not_preempt():
    profile = Profile(kv_cache_tokens=40 * 128)  # room for 40 sequences of 128 tokens, 64 places
    c = capacity(profile)
    result = run(poisson(2 * c, 10.0, seed=4), profile)
    assert all(result.on_time(e) for e in result.of("answered"))
    assert result.of("refused")
    # (handed to the engine only once their prompt and max_tokens fit: before, the engine started up to 64
    # and preempted 2,519 times as their outputs grew, and the TPOT error read over their real steps let
    # 115 of 401 answered miss)
    assert result.preemptions == 0
    assert len(result.of("answered")) / result.duration_s >= 0.9 * c


def test_nothing_ends_twice_and_no_promise_is_left_behind():
    c = capacity()
    arrivals = poisson(3 * c, 5.0, seed=9) + [Arrival(2.0, priority=-1, objectives=Objectives())]
    result = run(arrivals)
    assert len(result.ended) == len(arrivals)


def test_the_generation_autoscaler_asks_for_the_replicas_the_offered_load_needs():
    """deploy/k8s-generation's demand trigger, on the fake clock: a replica's demand signal (an
    AverageValue target of 0.8 of its places) read at 0.5x, 2x and 4x one replica's capacity asks
    for one replica, then enough that each would run under 80% of its capacity; and its threshold is
    0.8 of the places its inferd.toml gives the engine."""
    import math
    import tomllib
    from pathlib import Path

    import yaml

    folder = Path(__file__).parents[3] / "deploy" / "k8s-generation"
    patches = yaml.safe_load((folder / "kustomization.yaml").read_text())["patches"]
    scaled = next(p for p in patches if p["target"]["kind"] == "ScaledObject")
    (replace,) = yaml.safe_load(scaled["patch"])
    demand_trigger = next(t for t in replace["value"] if "demand" in t["metadata"]["query"])
    assert demand_trigger["metricType"] == "AverageValue"
    threshold = float(demand_trigger["metadata"]["threshold"])
    places = tomllib.loads((folder / "inferd.toml").read_text())["models"][0]["options"]["max_num_seqs"]
    assert threshold == pytest.approx(0.8 * places)
    profile = Profile(max_running=places)
    c = capacity(profile)
    for load in (0.5, 2.0, 4.0):
        result = run(poisson(load * c, 30.0, seed=7), profile)
        settled = sorted(d for t, d in result.demand if t > 10.0)
        demand = settled[len(settled) // 2]
        asked = math.ceil(demand / threshold)  # (KEDA's AverageValue: the sum over replicas, one replica here)
        if load < 1:
            assert asked == 1
        else:
            assert load / asked <= 0.85 and asked <= math.ceil(load / 0.8) + 1, (load, demand, asked)


def test_no_place_is_kept_where_places_turn_over_faster_than_the_higher_tiers_objective():
    """A small engine (8 places) of short requests (8 tokens of 2 ms steps: ~440 a second at most) at
    about half of that, a higher tier with a 5 s objective beside a lower one: every running request
    ends long before a higher request would miss, so the lower tier is not refused for its sake."""
    profile = Profile(max_running=8, step_ms=2.0, step_ms_per_sequence=0.0)
    slow = Objectives(ttft_s=5.0, tpot_s=0.1)
    arrivals = (poisson(180.0, 10.0, seed=11, priority=0, max_tokens=8, objectives=slow)
                + poisson(40.0, 10.0, seed=12, priority=-1, max_tokens=8, objectives=slow))
    result = run(arrivals, profile)
    assert not result.of("refused") and not result.of("withdrawn")


@pytest.mark.parametrize("seconds", [0.5, 2.0, 10.0, 20.0, 60.0])
def test_a_higher_tier_s_places_are_kept_for_its_whole_rate_however_long_it_has_come(seconds):
    """A tier arriving steadily at 45/s: the places kept for it follow its whole rate from its first
    half second on (a decayed count read over its age, not over its decay's reach, read it 37% low at
    10 s; read over at least a whole second, half its rate at 0.5 s). At 0.5 s the count holds one
    arrival more than its intervals (22 over 21): a place or two over, never under."""
    book = EngineBook(EngineCosts())
    rate, n = 45.0, int(45.0 * seconds)
    for i in range(n):
        at = i / rate
        p = book.reserve(f"r{i}", 0, at, 10, 64, Objectives(ttft_s=0.5))
        book.leave(p, at, finished=False)
    now = (n - 1) / rate
    held = rate * book.costs.service_s
    expected = math.ceil(held + 2 * math.sqrt(held)) + 1
    assert expected - 1 <= book.kept_places(1, now) <= expected + (2 if seconds < 1 else 1)


def test_requests_kept_back_for_kv_go_to_the_engine_in_its_order_as_the_cache_frees():
    book = EngineBook(EngineCosts())
    book.kv_cache_tokens = 300  # room for two requests of 10 + 100 tokens
    first, second = (book.reserve(f"r{i}", 0, 0.0, 10, 100, Objectives()) for i in range(2))
    assert book.hand_over(first) and book.hand_over(second)
    late_free = book.reserve("free", 0, 0.1, 10, 100, Objectives())
    paid = book.reserve("paid", -1, 0.2, 10, 100, Objectives())
    assert not book.hand_over(late_free) and not book.hand_over(paid) and book.kept_back == 2
    book.first_token(first, 1, 0.5)
    book.leave(first, 1.0, finished=True)
    assert book.released() == [paid]  # (the higher tier first, though it came later)
    book.leave(second, 1.1, finished=False)  # (a withdrawal frees its cache too)
    assert book.released() == [late_free] and book.kept_back == 0 and book.kv_handed == 220


def test_a_cache_allocated_in_blocks_is_counted_in_whole_blocks():
    """vLLM gives a sequence whole blocks (16 tokens): three requests of 100 tokens hold 7 blocks each,
    21 of the 20 a 320-token cache has; counted by the token they fitted (300), and the engine preempted."""
    counts = []
    for block in (0, 16):
        book = EngineBook(EngineCosts())
        book.kv_cache_tokens, book.kv_block_tokens = 320, block
        handed = [book.hand_over(book.reserve(f"r{i}", 0, 0.0, 10, 90, Objectives())) for i in range(3)]
        counts.append((sum(handed), book.kv_handed))
    assert counts == [(3, 300), (2, 224)]


def test_a_tpot_error_is_the_cost_models_over_the_steps_run_not_the_hand_offs_prediction():
    book = EngineBook(EngineCosts())
    for i in range(2000):  # a line learnt: 5 ms + 0.5 ms a running sequence
        n = 1 + i % 50
        book.costs.observe_step(n, 0.005 + 0.0005 * n, i * 0.001)
    t = 2.0
    p = book.reserve("r", 0, t, 10, 21, Objectives(tpot_s=0.05))
    book.submitted(p, book.predict(0, 10, 21, t, p), t)
    book.first_token(p, 1, t)
    others = [book.reserve(f"o{i}", 0, t, 10, 1000, Objectives()) for i in range(39)]
    for o in others:  # 39 join after it: its steps go from 5.5 ms to 25 ms, as the line says
        book.first_token(o, 1, t)
    for _ in range(20):
        t += book.costs.step_s(40)
        book.tokens(p, 1, t)
    book.leave(p, t, finished=True)
    book.tpot_errors.refresh(t)
    assert book.tpot_errors.batch_excess < 0.15  # (its 99th percentile; against its hand-off's 5.5 ms a step, a 4.5x error)
