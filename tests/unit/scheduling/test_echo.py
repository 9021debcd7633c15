"""The closed-loop echo on the fake clock (`load_on_the_clock`): closed-loop clients run one batch per
cycle at every count that fits a batch, two groups out of step merge, a connection that went away or
answers slowly is waited for once, and open-loop arrivals are served as greedily as the DES serves them."""

from __future__ import annotations

import random
import statistics

import pytest

from inferd.messages import Client, PendingRequest

from .load_on_the_clock import Simulation, closed_loop, greedy, open_loop


def turnarounds(seed: int = 1, low_s: float = 0.001, high_s: float = 0.003):  # type: ignore[no-untyped-def]
    """Each client's turnaround: drawn anew every time, within [low_s, high_s] (wrk's, on loopback)."""
    rng = random.Random(seed)
    return lambda client: rng.uniform(low_s, high_s)


@pytest.mark.parametrize("batch_s", [0.1, 0.01])
@pytest.mark.parametrize("clients", [1, 2, 5, 10, 20, 50, 100])
def test_closed_loop_clients_that_fit_in_a_batch_run_one_batch_per_cycle(batch_s: float, clients: int):
    sim = Simulation(batch_s=batch_s, max_batch_size=100, max_wait_ms=20)
    starts = random.Random(clients)
    closed_loop(sim, {c: starts.uniform(0, 3 * batch_s) for c in range(clients)}, turnarounds())
    run = sim.until(400 * batch_s)
    sim.close()
    since = 100 * batch_s  # (the echo score has long been settled)
    served = len(run.after(since)) / (400 * batch_s - since - batch_s)
    one_batch_per_cycle = clients / (batch_s + 0.003)  # a cycle: the batch and its slowest client's turnaround
    assert served >= 0.95 * one_batch_per_cycle, (served, one_batch_per_cycle)
    assert run.p50(since) <= batch_s + 0.010


@pytest.mark.parametrize("clients", [50, 100])
def test_a_client_whose_echo_spreads_past_the_linger_still_runs_one_batch_per_cycle(clients: int):
    """A loaded Python load generator: of every batch's answers, a few are sent again within 2-4 ms and
    the rest 18-26 ms later (its loop reads the other answers first), past the 20 ms linger counted
    from the first. Held only for the linger, the late ones wait a whole batch more, and the clients
    split in two groups; held for the spread seen, all of them are in every batch."""
    sim = Simulation(batch_s=0.1, max_batch_size=100, max_wait_ms=20)
    rng = random.Random(clients)
    first = set(range(0, clients, 10))
    closed_loop(sim, {c: rng.uniform(0, 0.3) for c in range(clients)},
                lambda c: rng.uniform(0.002, 0.004) if c in first else rng.uniform(0.018, 0.026))
    run = sim.until(40.0)
    sim.close()
    since = 10.0
    served = len(run.after(since)) / (40.0 - since - 0.1)
    one_batch_per_cycle = clients / (0.1 + 0.026)  # a cycle: the batch and its slowest client's turnaround
    assert served >= 0.95 * one_batch_per_cycle, (served, one_batch_per_cycle)
    assert [size for start, size, _ in run.batches if start >= since][1:-1] == [clients] * (
        len([start for start, _, _ in run.batches if start >= since]) - 2)
    assert sim.batcher.echo.spread_s <= 0.030


def test_a_client_whose_echo_spreads_over_half_a_batch_still_runs_one_batch_per_cycle():
    """The Python load generator beside a CPU hog per core, 100 clients on a 100 ms function: a batch's
    answers come back spread evenly over 2-55 ms. Held for a third of a batch at most, a third of them
    waited a whole batch more (batches of 65, 0.78 of the floor, measured); waiting for the whole echo
    costs each request less than that."""
    sim = Simulation(batch_s=0.1, max_batch_size=100, max_wait_ms=20)
    rng = random.Random(7)
    closed_loop(sim, {c: rng.uniform(0, 0.3) for c in range(100)}, lambda c: rng.uniform(0.002, 0.055))
    run = sim.until(40.0)
    sim.close()
    since = 10.0
    served = len(run.after(since)) / (40.0 - since - 0.1)
    one_batch_per_cycle = 100 / (0.1 + 0.055)
    assert served >= 0.95 * one_batch_per_cycle, (served, one_batch_per_cycle)
    sizes = [size for start, size, _ in run.batches if start >= since][1:-1]
    assert sum(sizes) / len(sizes) >= 98, sizes


def test_a_few_clients_that_think_long_are_not_waited_for_by_the_others():
    """90 clients send again within 1-3 ms, 10 think 50-60 ms first: waiting for the ten would cost the
    ninety 50 ms each a cycle, more than the ten lose waiting for the next batch. The ninety run one
    batch per cycle; the ten ride the next one."""
    sim = Simulation(batch_s=0.1, max_batch_size=100, max_wait_ms=20)
    rng = random.Random(11)
    closed_loop(sim, {c: rng.uniform(0, 0.3) for c in range(100)},
                lambda c: rng.uniform(0.05, 0.06) if c < 10 else rng.uniform(0.001, 0.003))
    since, fast = 10.0, []
    turnaround = sim.on_answer

    def answered(request: PendingRequest, now: float) -> float | None:
        if request.input >= 10 and request.enqueued_at >= since:
            fast.append(now - request.enqueued_at)
        return turnaround(request, now)

    sim.on_answer = answered
    run = sim.until(40.0)
    sim.close()
    assert sim.batcher.echo.spread_s <= 0.010, sim.batcher.echo.spread_s
    assert statistics.median(fast) <= 0.1 + 0.010
    served = len(run.after(since)) / (40.0 - since - 0.1)
    assert served >= 0.95 * 90 / (0.1 + 0.003), served


@pytest.mark.parametrize("clients", [30, 50, 70])
def test_a_closed_loop_too_slow_to_hold_for_still_leaves_when_it_is_back_whole(clients: int):
    """wrk's 50 clients against 10 ms batches: the answers go out and come back over 3-6 ms, more than
    a third of a batch, so no worker is held for them (`Echo.hold`); their batch still leaves once as
    many came back as it answered, not at the 20 ms linger's end (a 30 ms cycle: 0.41 of one batch
    per cycle, measured)."""
    sim = Simulation(batch_s=0.01, max_batch_size=100, max_wait_ms=20)
    starts = random.Random(clients)
    closed_loop(sim, {c: starts.uniform(0, 0.03) for c in range(clients)}, turnarounds(low_s=0.003, high_s=0.006))
    run = sim.until(4.0)
    sim.close()
    since = 1.0
    served = len(run.after(since)) / (4.0 - since - 0.01)
    one_batch_per_cycle = clients / (0.01 + 0.006)
    assert served >= 0.95 * one_batch_per_cycle, (served, one_batch_per_cycle)
    assert run.p50(since) <= 0.01 + 0.010
    assert sim.batcher.echo.holds == 0 or sim.batcher.echo.echo_s > 0.01 / 3  # (not held for: back whole alone)


def test_two_groups_of_closed_loop_clients_out_of_step_merge_within_two_cycles():
    """The e2e test's case: 10 clients, then 10 more that start while the first ten's batch computes.
    Each group would run half a batch in turn for ever; held for the echo, the worker merges them."""
    sim = Simulation(batch_s=0.15, max_batch_size=20, max_wait_ms=40)
    closed_loop(sim, {c: 0.0 for c in range(10)}, turnarounds())
    sim.until(2.0)  # the first group alone: the echo score settles
    first_b = sim.clock() + 0.01
    assert sim.run.batches[-1][0] < first_b < sim.run.batches[-1][0] + 0.15  # (in the middle of a batch)
    for c in range(10, 20):
        sim.connections[c] = Client()
        sim.at(first_b, "arrive", c)
    run = sim.until(5.0)
    sim.close()
    running = [size for start, size, _ in run.batches if start < first_b][-1]
    after = [size for start, size, _ in run.batches if start >= first_b]
    assert running == 10  # the second group came while the first group's batch computed
    assert after[2:] == [20] * len(after[2:]) and 20 in after[:2], after  # merged within two cycles, for good
    assert run.p50(3.0) <= 0.15 + 0.010


@pytest.mark.parametrize(("clients", "step_s"), [(3, 0.00025), (5, 0.00025), (10, 0.00025), (10, 0.0005)])
def test_a_client_that_reads_its_answers_one_by_one_merges_a_straggler_back_into_the_batch(clients: int, step_s: float):
    """The Python load generator's 5 and 10 clients against 10 ms batches (measured: batches of 9 and 1
    in turn, 0.61 of one batch per cycle): its loop reads a batch's answers one after another, so they
    come back 2 ms after the batch, then one every `step_s`: past a cycle's first quarter, yet an echo.
    A straggler that started while the others' batch computed is merged for good."""
    sim = Simulation(batch_s=0.01, max_batch_size=100, max_wait_ms=20)
    rank = {"at": -1.0, "n": 0}

    def one_by_one(client: int) -> float:
        now = sim.clock()
        rank["n"] = rank["n"] + 1 if now == rank["at"] else 0
        rank["at"] = now
        return 0.002 + step_s * rank["n"]

    closed_loop(sim, {c: 0.0 if c < clients - 1 else 0.004 for c in range(clients)}, one_by_one)
    run = sim.until(4.0)
    sim.close()
    since = 1.0
    served = len(run.after(since)) / (4.0 - since - 0.01)
    one_batch_per_cycle = clients / (0.01 + 0.002 + step_s * clients)
    assert served >= 0.95 * one_batch_per_cycle, (served, one_batch_per_cycle)
    assert {size for start, size, _ in run.batches if start >= since} == {clients}
    assert run.p50(since) <= 0.01 + 0.010


def test_a_client_that_went_away_is_waited_for_once_and_a_slow_one_not_again():
    sim = Simulation(batch_s=0.1, max_batch_size=100, max_wait_ms=20)
    fast = turnarounds()
    gone_at = 3.0

    def turnaround(client: int) -> float | None:
        if client == 0:
            return None if sim.clock() >= gone_at else fast(client)  # it leaves after 3 s
        return 0.06 if client == 1 else fast(client)  # client 1 takes 60 ms: past the 20 ms window, every time

    closed_loop(sim, {c: 0.0 for c in range(10)}, turnaround)
    sim.until(gone_at - 0.05)
    echo = sim.batcher.echo
    slow_before, held_before = echo.slow, echo.holds - echo.returned
    run = sim.until(8.0)
    sim.close()
    assert echo.slow - slow_before <= 1  # the one that left, once (the slow one had been found before)
    assert (echo.holds - echo.returned) - held_before <= 2  # holds that ran out waiting for someone
    assert sim.connections[1].slow and sim.connections[0].missed == 1  # (gone: in no batch again, so never again waited for)
    late = [s for start, s, _ in run.batches if start >= 4.0][1:]
    assert set(late) <= {8, 9}, late  # the eight fast clients together every cycle, the slow one riding every other


@pytest.mark.parametrize("rate", [5, 10, 20, 30, 50, 200, 500, 980])
def test_open_loop_arrivals_are_never_kept_waiting_for_an_echo(rate: int):
    """Poisson arrivals over 60 s (400 s below 50 req/s) against the DES's greedy rule on the same
    arrivals: p50 and p99 within 5 ms, so holding for echoes costs an open loop nothing. (10-30 req/s:
    cycles of one or two requests, which come in a cycle's first quarter by chance.)"""
    duration = 60.0 if rate >= 50 else 400.0
    sim = Simulation(batch_s=0.1, max_batch_size=100, max_wait_ms=20)
    open_loop(sim, rate, duration)
    run = sim.until(duration + 1.0)
    sim.close()
    reference = greedy(rate, duration, 0.1, 100)
    assert abs(run.p50(5.0) - reference.p50(5.0)) <= 0.005
    assert abs(run.p(0.99, 5.0) - reference.p(0.99, 5.0)) <= 0.005
