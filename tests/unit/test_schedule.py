"""The detailing queue, the scheduler's due times and online calibration (pure, fake clock)."""

import itertools
import math
import random

import pytest

from dyper.agent.budget import ProfletCosts, cost, plan
from dyper.agent.schedule import (
    FIRST_DETAIL_S,
    PATIENCE_S,
    BurstCost,
    DetailQueue,
    DetailScheduler,
    calibrate,
    combine,
    compatible,
    fit_interval,
    share_time,
)

ALLOWS = {
    "cpu": frozenset({"memory"}),
    "memory": frozenset({"cpu"}),
    "threads": frozenset(),  # times waits: nothing else may run beside it
}


def test_compatibility_needs_both_sides():
    assert compatible("cpu", "memory", ALLOWS)
    assert not compatible("cpu", "threads", ALLOWS)
    one_sided = {"a": frozenset({"b"}), "b": frozenset()}
    assert not compatible("a", "b", one_sided)


def test_compatible_requests_run_together():
    q = DetailQueue(ALLOWS)
    q.request("cpu")
    q.request("memory")
    assert q.ready() == ["cpu", "memory"]
    assert q.running == {"cpu", "memory"}


def test_conflicting_request_waits_and_is_never_dropped():
    q = DetailQueue(ALLOWS)
    q.request("cpu")
    assert q.ready() == ["cpu"]
    q.request("threads")
    q.request("memory")
    # threads conflicts with the running cpu burst and waits; memory would fit beside
    # cpu, but going ahead would make the earlier threads request wait longer.
    assert q.ready() == []
    assert q.waiting == ["threads", "memory"]
    q.finish("cpu")
    assert q.ready() == ["threads"]
    q.finish("threads")
    assert q.ready() == ["memory"]


def test_an_unrelated_request_overtakes_a_waiting_one():
    allows = {"cpu": frozenset({"io"}), "io": frozenset({"cpu", "threads"}), "threads": frozenset({"io"})}
    q = DetailQueue(allows)
    q.request("cpu")
    q.ready()
    q.request("threads")  # waits for cpu
    q.request("io")  # fits beside cpu and beside the waiting threads request
    assert q.ready() == ["io"]
    assert q.waiting == ["threads"]


def test_a_waiting_request_blocks_later_conflicting_ones_in_order():
    q = DetailQueue(ALLOWS)
    q.request("memory")
    q.ready()
    q.request("threads")  # waits for memory
    q.request("cpu")  # compatible with memory, but conflicts with the earlier threads request
    assert q.ready() == []
    assert q.waiting == ["threads", "cpu"]
    q.finish("memory")
    assert q.ready() == ["threads"]
    q.finish("threads")
    assert q.ready() == ["cpu"]


def test_a_request_the_guard_cannot_pay_for_holds_the_queue_behind_it_once_its_patience_is_out():
    q = DetailQueue(ALLOWS)
    q.request("threads", now=0.0)
    q.request("cpu", now=0.0)
    dear = lambda name: name != "threads"  # noqa: E731
    # While it waits less than its patience, the cheap one behind it goes first,
    # conflict or not (threads allows nothing beside it): a cheap burst ends
    # long before a dear one's price accrues.
    assert q.ready(affordable=dear, now=PATIENCE_S - 1) == ["cpu"]
    assert q.waiting == ["threads"]
    q.finish("cpu")
    q.request("cpu", now=PATIENCE_S)
    # Its patience out, it holds everything behind it until it can be paid for.
    assert q.ready(affordable=dear, now=PATIENCE_S) == []
    assert q.waiting == ["threads", "cpu"]
    assert q.ready(now=PATIENCE_S + 1) == ["threads"]


def test_a_request_an_analysis_asked_for_goes_to_the_head_of_the_queue():
    q = DetailQueue({"heap": frozenset(), "memory": frozenset()})
    q.request("memory", now=0.0)
    q.request("heap", now=1.0, first=True)
    assert q.waiting == ["heap", "memory"]
    q.request("memory", now=2.0, first=True)  # one waiting moves up; still one request
    assert q.waiting == ["memory", "heap"]
    assert q.ready(now=3.0) == ["memory"]
    q.request("memory", now=4.0, first=True)  # running: the same request
    assert q.waiting == ["heap"]
    # the agent lets an asked request borrow (see agent.bursts): the queue says which wait so
    assert q.asked == {"heap"}
    assert q.ready(affordable=lambda name: name not in q.asked, now=5.0) == []
    q.finish("memory")
    assert q.ready(now=6.0) == ["heap"] and q.asked == set()


def test_handing_over_to_the_monitor_keeps_what_waits_and_runs():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(2))
    s.set_delays({"cpu": 1.0, "memory": 1.0, "threads": 1.0}, now=0.0)
    s.tick(10.0, affordable=lambda name: name == "cpu")  # cpu runs, threads waits behind... a conflict
    running, waiting = set(s.queue.running), list(s.queue.waiting)
    assert running and waiting
    s.hand_over()
    assert s.due == {} and s.delays == {}
    assert s.queue.running == running and s.queue.waiting == waiting  # never dropped
    s.queue.finish("cpu")
    s.finished("cpu", now=11.0)
    assert "cpu" not in s.due  # the monitor says when the next one is


def test_every_first_burst_comes_within_the_first_detail_cap_however_long_its_period():
    firsts = []
    for seed in range(100):
        s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(seed))
        s.set_delays({"memory": 120.0}, now=0.0)
        firsts.append(s.due["memory"])
    assert max(firsts) <= FIRST_DETAIL_S and min(firsts) >= 0.1 * FIRST_DETAIL_S


def test_duplicate_requests_are_one_request():
    q = DetailQueue(ALLOWS)
    q.request("cpu")
    q.request("cpu")
    assert q.waiting == ["cpu"]
    q.ready()
    q.request("cpu")  # already running
    assert q.waiting == []


def test_scheduler_due_times_follow_the_plan_with_a_fake_clock():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(1))
    s.set_delays({"cpu": 10.0, "threads": math.inf}, now=0.0)
    assert "threads" not in s.due  # infinite delay: never details
    first = s.due["cpu"]
    assert 1.0 <= first <= 10.0  # somewhere in the first period
    assert s.tick(first - 0.001) == []
    assert s.tick(first) == ["cpu"]
    assert s.tick(first + 0.5) == []  # running: not requested again
    s.finished("cpu", now=first + 0.5)
    # The next is due a drawn delay after this one started, not after it ended.
    assert first + 1.0 <= s.due["cpu"] <= first + 20.0
    s.tick(s.due["cpu"])
    s.finished("cpu", now=500.0)  # a burst that overran: no catch-up burst at once
    assert s.due["cpu"] >= 500.0


def test_mean_delay_between_bursts_matches_the_plan():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(7))
    s.set_delays({"cpu": 4.0}, now=0.0)
    now, starts = 0.0, []
    while len(starts) < 400:
        if s.tick(now):
            starts.append(now)
            s.finished("cpu", now + 1.0)  # each burst lasts a second: the mean gap is still the delay
        now += 0.01
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert sum(gaps) / len(gaps) == pytest.approx(4.0, rel=0.1)


def test_replanning_never_pushes_a_burst_later():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(3))
    s.set_delays({"cpu": 5.0}, now=0.0)
    due = s.due["cpu"]
    s.set_delays({"cpu": 500.0}, now=1.0)
    assert s.due["cpu"] == due
    s.set_delays({"cpu": 0.5}, now=1.0)
    assert s.due["cpu"] <= 1.0 + 0.5 * 2


def test_a_proflet_left_out_of_the_plan_is_forgotten():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(3))
    s.set_delays({"cpu": 1.0, "memory": 1.0}, now=0.0)
    s.tick(100.0)
    s.set_delays({"cpu": 1.0}, now=100.0)
    assert "memory" not in s.queue.running and "memory" not in s.due


def test_calibration_moves_slow_towards_the_measured_loss():
    declared = ProfletCosts("cpu", ovhd_ms=1.0, slow=0.5, itvl_ms=500.0, prty=0.5)
    # A burst of 0.5 s in which the application lost 0.4 s: f = 0.8, SLOW = 4.
    burst = BurstCost(fixed_s=0.002, slowdown_s=0.4, length_s=0.5)
    c = declared
    for _ in range(30):
        c = calibrate(c, burst)
    assert c.slow == pytest.approx(4.0, rel=1e-3)
    assert c.ovhd_ms == pytest.approx(2.0, rel=1e-3)
    # ... so COST(p) is what the burst cost: fixed plus the loss.
    assert cost(c) == pytest.approx(2.0 + 400.0, rel=1e-3)


def test_one_calibration_step_is_a_moving_average_of_the_lost_share():
    declared = ProfletCosts("cpu", ovhd_ms=0.0, slow=1.0, itvl_ms=100.0, prty=0.5)  # loses 50%
    c = calibrate(declared, BurstCost(0.0, 0.0, 0.1), alpha=0.3)  # a burst that lost nothing
    f = 0.7 * 0.5
    assert c.slow == pytest.approx(f / (1 - f))


def test_alternating_bursts_calibrate_to_their_mean_cost():
    # Call bursts lose 10% of their length, line bursts 80%: COST follows the
    # mean burst (45% lost), not the mean of their SLOWs (a 67% loss).
    c = ProfletCosts("cpu", ovhd_ms=0.0, slow=3.0, itvl_ms=1000.0, prty=0.5)
    for i in range(200):
        c = calibrate(c, BurstCost(0.0, 0.1 if i % 2 == 0 else 0.8, 1.0), alpha=0.05)
    assert cost(c) == pytest.approx(450.0, rel=0.03)


def test_fit_interval_shortens_a_burst_to_what_the_guard_can_save():
    c = ProfletCosts("cpu", ovhd_ms=2.0, slow=3.0, itvl_ms=1000.0, prty=0.5)  # COST 752 ms
    fitted = fit_interval(c, max_cost_s=0.05)
    assert cost(fitted) == pytest.approx(50.0)
    assert fit_interval(c, max_cost_s=10.0) == c


def test_sampling_share_it_cannot_use_goes_to_detailing():
    p = ProfletCosts("cpu", ovhd_ms=1.0, slow=3.0, itvl_ms=500.0, prty=0.5)
    free = plan(0.25, 10e-6, 1e-3, [p], min_sample_delay_s=0.002)
    # 25% is 20% of wall time. 10 us samples at a 2 ms floor spend 0.5% of the 9% sampling share.
    assert free.sample_delay_s == pytest.approx(0.002)
    assert free.detail_share["cpu"] == pytest.approx(0.5 + (0.09 - 0.005) / 0.2)
    # Behind a busy thread samples start 3 ms late on average: sampling spends even less.
    gil = plan(0.25, 10e-6, 1e-3, [p], sample_lag_s=0.003, min_sample_delay_s=0.002)
    assert gil.detail_share["cpu"] == pytest.approx(0.5 + (0.09 - 0.002) / 0.2)
    # With no proflet to pass it to, the share stays where it was.
    assert plan(0.25, 10e-6, 1e-3).detail_share == {}


def test_a_waiting_or_running_proflet_gets_no_second_due_time():
    s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(3))
    s.set_delays({"cpu": 1.0}, now=0.0)
    s.tick(100.0, affordable=lambda name: False)
    assert s.queue.waiting == ["cpu"]
    s.set_delays({"cpu": 2.0}, now=100.0)
    assert "cpu" not in s.due


def test_combine_gives_the_mean_cost_of_the_kinds_of_burst():
    calls = ProfletCosts("cpu", ovhd_ms=0.2, slow=0.01, itvl_ms=500.0, prty=0.5)  # COST ~5.2 ms
    lines = ProfletCosts("cpu", ovhd_ms=0.4, slow=3.0, itvl_ms=100.0, prty=0.5)  # COST 75.4 ms
    both = combine([calls, lines])
    assert cost(both) == pytest.approx((cost(calls) + cost(lines)) / 2)
    assert both.ovhd_ms == pytest.approx(0.3) and both.itvl_ms == pytest.approx(300.0)
    assert both.name == "cpu" and both.prty == 0.5
    assert combine([lines]) == lines


def test_the_first_burst_comes_within_its_first_period():
    firsts = []
    for seed in range(200):
        s = DetailScheduler(DetailQueue(ALLOWS), rng=random.Random(seed))
        s.set_delays({"cpu": 10.0}, now=100.0)
        firsts.append(s.due["cpu"] - 100.0)
    assert min(firsts) >= 1.0 and max(firsts) <= 10.0
    assert sum(firsts) / len(firsts) == pytest.approx(5.5, rel=0.1)


def test_share_time_shortens_the_cheap_kind_so_the_dear_one_can_spend_the_share():
    calls = ProfletCosts("cpu", 0.5, 0.02, 2000.0, 0.5)  # loses 2% of its length
    lines = ProfletCosts("cpu", 0.5, 3.0, 267.0, 0.5)  # loses 75%
    rate = 0.12  # the proflet's share: 120 ms of the process's time per wall second
    short_calls, same_lines = share_time([calls, lines], rate, fill=0.5)
    assert same_lines == lines
    assert 250.0 < short_calls.itvl_ms < 2000.0
    # one burst of each kind, in turn, now spends rate / fill per second
    spent = (cost(short_calls) + cost(lines)) / (short_calls.itvl_ms + lines.itvl_ms)
    assert spent == pytest.approx(rate / 0.5)
    # before, the 2-s call burst kept the pair well short of it
    assert (cost(calls) + cost(lines)) / (calls.itvl_ms + lines.itvl_ms) < 0.6 * rate / 0.5


def test_share_time_leaves_kinds_alone_at_a_low_share_and_keeps_a_floor():
    calls = ProfletCosts("cpu", 0.5, 0.02, 2000.0, 0.5)
    lines = ProfletCosts("cpu", 0.5, 3.0, 63.0, 0.5)
    assert share_time([calls, lines], 0.01) == [calls, lines]  # at 5%: L would be past 2 s
    # a share the dear kind cannot fill even back to back: the cheap one goes to the floor
    floored, _ = share_time([calls, lines], 0.3, fill=0.5, min_itvl_ms=250.0)
    assert floored.itvl_ms == 250.0
    # one kind, or all kinds cheap: nothing to gain by shortening
    assert share_time([calls], 0.5) == [calls]
    assert share_time([calls, calls], 0.5) == [calls, calls]
    assert share_time([calls, lines], 0.5, fill=0.5) == [calls, lines]  # lines lose 75% < 100%: cheap too
    assert share_time([calls, lines], 0.0) == [calls, lines]
