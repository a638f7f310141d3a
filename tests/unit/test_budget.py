import math

import pytest

from dyper.agent.budget import (
    MAX_REPORT_DELAY_S,
    MIN_REPORT_DELAY_S,
    MIN_SAMPLE_DELAY_S,
    Guard,
    ProfletCosts,
    cost,
    fract,
    plan,
    slowdown,
    slowdown_by,
    tpri,
    wall_share,
)


def test_fract_matches_the_paper():
    assert fract(0.0) == 1.0
    assert fract(0.5) == 0.5
    assert fract(1.0) == 0.25


def test_a_budget_is_a_slowdown_so_its_share_of_wall_time_is_b_over_1_plus_b():
    # s seconds of analysis in a span T leave T - s to the application: a slowdown of s / (T - s).
    assert wall_share(0.25) == pytest.approx(0.2)
    assert wall_share(0.01) == pytest.approx(1 / 101)
    assert slowdown(20.0, 100.0) == pytest.approx(0.25)
    assert slowdown(0.0, 100.0) == 0.0 and slowdown(1.0, 0.0) == 0.0
    assert slowdown(100.0, 100.0) == 100.0  # everything spent: capped, still a number
    assert slowdown(1e-300, 5e-324) == 100.0 and slowdown(5e-324, 1e-300) < 1e-20  # a fuzzed report's figures
    assert slowdown(float("nan"), 1.0) == 0.0 and slowdown(1.0, float("inf")) == 0.0
    by = slowdown_by({"sample": 5.0, "detail": 15.0}, 100.0)
    assert by == pytest.approx({"sample": 0.0625, "detail": 0.1875}) and sum(by.values()) == pytest.approx(0.25)


def test_cost_and_tpri():
    p = ProfletCosts("cpu", ovhd_ms=10.0, slow=1.0, itvl_ms=1000.0, prty=0.5)
    assert cost(p) == pytest.approx(10.0 + 0.5 * 1000.0)
    assert tpri(p) == pytest.approx(0.5 * math.sqrt(510.0))


def test_sampling_and_reporting_get_90_and_10_percent_when_no_proflet_wants_detailing():
    pl = plan(0.01, sample_cost_s=50e-6, report_cost_s=2e-3)
    assert pl.fract == 1.0
    # 1% is 1/101 of wall time; 90% of it at 50 us per sample -> one every 5.61 ms
    assert pl.sample_delay_s == pytest.approx(50e-6 / (0.9 / 101))
    # 10% of it at 2 ms per report -> one every 2.02 s
    assert pl.report_delay_s == pytest.approx(2e-3 / (0.1 / 101))


def test_detailing_shares_follow_tpri():
    a = ProfletCosts("a", 0.0, 1.0, 1000.0, 1.0)  # COST 500 ms
    b = ProfletCosts("b", 0.0, 1.0, 250.0, 1.0)  # COST 125 ms
    pl = plan(0.1, 50e-6, 2e-3, [a, b])
    assert pl.fract == pytest.approx(0.25)
    total = 0.75
    assert pl.detail_share["a"] / pl.detail_share["b"] == pytest.approx(math.sqrt(500) / math.sqrt(125))
    assert pl.detail_share["a"] + pl.detail_share["b"] == pytest.approx(total)
    # one detailing of a costs 0.5 s; at share s of a 10% budget (1/11 of wall time): every 0.5 / (s / 11) s
    assert pl.detail_delay_s["a"] == pytest.approx(0.5 / (pl.detail_share["a"] / 11))


def test_zero_priority_proflet_never_details():
    pl = plan(0.01, 50e-6, 2e-3, [ProfletCosts("idle", 1.0, 1.0, 100.0, 0.0)])
    assert pl.fract == 1.0
    assert pl.detail_delay_s["idle"] == math.inf


def test_clamps_only_lengthen_or_bound_delays():
    fast = plan(0.25, 1e-7, 1e-6)
    assert fast.sample_delay_s == MIN_SAMPLE_DELAY_S
    assert plan(0.25, 1e-7, 1e-6, min_sample_delay_s=0.002).sample_delay_s == 0.002  # a thread sampler's floor
    assert fast.report_delay_s == MIN_REPORT_DELAY_S
    slow = plan(0.0001, 1e-3, 0.1)
    assert slow.report_delay_s == MAX_REPORT_DELAY_S


def test_guard_holds_spend_under_budget_with_fake_clock():
    now = 0.0
    g = Guard(0.01, now)
    spent = 0.0
    # An operation that costs 1 ms, attempted every 10 ms: 10% if unguarded.
    while now < 100.0:
        wait = g.wait_needed(now)
        if wait > 0:
            now += wait
            continue
        g.charge(0.001, now)
        spent += 0.001
        now += 0.010
    # the application slowed by at most 1%: 1/101 of wall time
    assert spent / (now - spent) <= 0.01 * 1.01
    assert spent / (now - spent) >= 0.009  # and it does use the budget
    assert g.overhead(now) == pytest.approx(spent / (now - spent))


def test_guard_cannot_save_up_more_than_its_capacity():
    g = Guard(0.01, 0.0, capacity_s=10.0)
    # An hour idle buys at most 10 s worth of budget (10/101 s of work).
    assert g.wait_needed(3600.0) == 0.0
    g.charge(10 / 101, 3600.0)
    assert g.wait_needed(3600.0) == 0.0
    g.charge(0.01, 3600.0)
    assert g.wait_needed(3600.0) == pytest.approx(0.01 * 101)


def test_a_debt_takes_no_longer_to_repay_after_the_budget_is_lowered():
    g = Guard(0.25, 0.0)
    g.charge(0.2, 0.0)  # an overrun settled after the fact: 0.2 s in debt
    before = g.wait_needed(0.0)
    assert before == pytest.approx(0.2 / wall_share(0.25))
    g.set_budget(0.0001, 0.0)  # 0.2 s at 0.01% would take half an hour
    assert g.wait_needed(0.0) == pytest.approx(before)
    assert g.tokens(0.0) == pytest.approx(-0.2 * wall_share(0.0001) / wall_share(0.25))
    # savings above the new, smaller capacity are dropped
    g = Guard(0.25, 0.0)
    g.tokens(100.0)
    g.set_budget(0.01, 100.0)
    assert g.tokens(100.0) == pytest.approx(wall_share(0.01) * g.capacity_s)


def test_guard_prepays_the_expected_cost():
    g = Guard(0.01, 0.0)
    assert g.wait_needed(0.0, expected_s=0.001) == pytest.approx(0.101)
    assert g.wait_needed(0.101, expected_s=0.001) == 0.0


def test_budget_change_applies_from_now():
    g = Guard(0.01, 0.0)
    g.charge(0.05, 0.0)
    assert g.wait_needed(0.0) == pytest.approx(5.0 * 1.01)
    g.set_budget(0.05, 0.0)
    assert g.wait_needed(0.0) == pytest.approx(1.0 * 1.05)


def test_the_guard_counts_what_the_budgets_in_force_allowed():
    guard = Guard(0.01, now=0.0)
    guard.charge(0.0, 100.0)
    guard.set_budget(0.10, 100.0)  # a boost, or a trigger event
    guard.charge(0.0, 110.0)
    guard.set_budget(0.01, 110.0)
    guard.charge(0.0, 200.0)
    expected = 190.0 * wall_share(0.01) + 10.0 * wall_share(0.10)
    assert guard.allowed_s == pytest.approx(expected)
    assert expected > 200.0 * wall_share(0.01)
