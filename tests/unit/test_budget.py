import math

import pytest

from agent.budget import (
    MAX_REPORT_DELAY_S,
    MIN_REPORT_DELAY_S,
    MIN_SAMPLE_DELAY_S,
    Guard,
    ProfletCosts,
    cost,
    fract,
    plan,
    tpri,
)


def test_fract_matches_the_paper():
    assert fract(0.0) == 1.0
    assert fract(0.5) == 0.5
    assert fract(1.0) == 0.25


def test_cost_and_tpri():
    p = ProfletCosts("cpu", ovhd_ms=10.0, slow=1.0, itvl_ms=1000.0, prty=0.5)
    assert cost(p) == pytest.approx(10.0 + 0.5 * 1000.0)
    assert tpri(p) == pytest.approx(0.5 * math.sqrt(510.0))


def test_sampling_and_reporting_get_90_and_10_percent_when_no_proflet_wants_detailing():
    pl = plan(0.01, sample_cost_s=50e-6, report_cost_s=2e-3)
    assert pl.fract == 1.0
    # 90% of 1% = 0.9% of wall time at 50 us per sample -> one every 5.56 ms
    assert pl.sample_delay_s == pytest.approx(50e-6 / 0.009)
    # 10% of 1% at 2 ms per report -> one every 2 s
    assert pl.report_delay_s == pytest.approx(2e-3 / 0.001)


def test_detailing_shares_follow_tpri():
    a = ProfletCosts("a", 0.0, 1.0, 1000.0, 1.0)  # COST 500 ms
    b = ProfletCosts("b", 0.0, 1.0, 250.0, 1.0)  # COST 125 ms
    pl = plan(0.1, 50e-6, 2e-3, [a, b])
    assert pl.fract == pytest.approx(0.25)
    total = 0.75
    assert pl.detail_share["a"] / pl.detail_share["b"] == pytest.approx(math.sqrt(500) / math.sqrt(125))
    assert pl.detail_share["a"] + pl.detail_share["b"] == pytest.approx(total)
    # one detailing of a costs 0.5 s; at share s of a 10% budget: every 0.5 / (s * 0.1) s
    assert pl.detail_delay_s["a"] == pytest.approx(0.5 / (pl.detail_share["a"] * 0.1))


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
    assert spent / now <= 0.01 * 1.01
    assert spent / now >= 0.009  # and it does use the budget
    assert g.overhead(now) == pytest.approx(spent / now)


def test_guard_cannot_save_up_more_than_its_capacity():
    g = Guard(0.01, 0.0, capacity_s=10.0)
    # An hour idle buys at most 10 s worth of budget (0.1 s of work).
    assert g.wait_needed(3600.0) == 0.0
    g.charge(0.1, 3600.0)
    assert g.wait_needed(3600.0) == 0.0
    g.charge(0.01, 3600.0)
    assert g.wait_needed(3600.0) == pytest.approx(0.01 / 0.01)


def test_guard_prepays_the_expected_cost():
    g = Guard(0.01, 0.0)
    assert g.wait_needed(0.0, expected_s=0.001) == pytest.approx(0.1)
    assert g.wait_needed(0.1, expected_s=0.001) == 0.0


def test_budget_change_applies_from_now():
    g = Guard(0.01, 0.0)
    g.charge(0.05, 0.0)
    assert g.wait_needed(0.0) == pytest.approx(5.0)
    g.set_budget(0.05, 0.0)
    assert g.wait_needed(0.0) == pytest.approx(1.0)
