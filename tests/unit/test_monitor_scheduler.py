"""DYMON's per-agent schedule: timings sent, re-plans, the detailing queue (no sockets, fake clock)."""

import itertools
import random

import pytest

from dyper.agent import protocol
from dyper.agent.budget import plan
from dyper.agent.schedule import DetailQueue, DetailScheduler
from dyper.monitor.scheduler import BURST_TIMEOUT_S, AgentSchedule


def _report(proflets=None, details=(), budget=0.05, samples=100, sample_s=0.005, lag=0.0):
    return {
        "budget": budget,
        "samples": samples,
        "costs": {"sample": sample_s, "report": 0.001, "detail": 0.0},
        "delays": {"sample_lag": lag},
        "proflets": proflets if proflets is not None else {},
        "details": list(details),
    }


def _state(allows=(), itvl_ms=200.0, slow=1.0, prty=0.5):
    return {"ovhd_ms": 1.0, "slow": slow, "itvl_ms": itvl_ms, "prty": prty, "allows": list(allows)}


def _schedule():
    return AgentSchedule(budget=0.05, scheduler=DetailScheduler(DetailQueue(), rng=random.Random(0)))


def test_every_report_gets_the_plan_computed_from_the_agents_measured_costs():
    s = _schedule()
    out = s.on_report(_report(samples=100, sample_s=0.005), now=0.0, priorities=lambda n: None)
    assert out[0][0] == protocol.CONFIGURE
    timings = out[0][1]["plan"]
    expected = plan(0.05, 50e-6, 0.001)
    assert timings["sample_delay_s"] == pytest.approx(expected.sample_delay_s)
    assert timings["report_delay_s"] == pytest.approx(expected.report_delay_s)
    assert timings["fract"] == 1.0
    # The body is what the agent accepts.
    protocol.decode(protocol.encode(*out[0]), protocol.AGENT_ACCEPTS)


def test_the_agents_own_unit_costs_are_planned_with_when_it_sends_them():
    # With the ticker the agent's wake-ups are reports' costs, not samples':
    # the window's ledger cannot say so, the agent's estimates can.
    s = _schedule()
    report = {**_report(samples=100, sample_s=0.005), "unit_costs": {"sample": 120e-6, "report": 0.004}}
    report["costs"]["wake"] = 0.01
    s.on_report(report, now=0.0, priorities=lambda n: None)
    assert (s.sample_cost_s, s.report_cost_s) == (120e-6, 0.004)
    expected = plan(0.05, 120e-6, 0.004)
    assert s.plan is not None and s.plan.sample_delay_s == pytest.approx(expected.sample_delay_s)
    # An agent that sends none: the window's ledger, wake-ups per sample.
    s2 = _schedule()
    s2.on_report(
        {**_report(samples=100, sample_s=0.005), "costs": {"sample": 0.005, "wake": 0.01, "report": 0.002}},
        0.0,
        lambda n: None,
    )
    assert s2.sample_cost_s == pytest.approx(150e-6) and s2.report_cost_s == 0.002


def test_analyzer_priority_overrides_the_agents_and_changes_the_plan():
    s = _schedule()
    s.on_report(_report({"cpu": _state(prty=0.5)}), 0.0, lambda n: None)
    assert s.plan is not None and s.plan.fract == 0.5
    s.on_report(_report({"cpu": _state(prty=0.5)}), 1.0, lambda n: 1.0)
    assert s.plan.fract == 0.25
    assert s.replans == 2


def test_unchanged_costs_do_not_replan():
    s = _schedule()
    for t in range(5):
        s.on_report(_report({"cpu": _state()}), float(t), lambda n: None)
    assert s.replans == 1


def test_detail_requests_go_out_when_due_and_wait_for_the_burst_report():
    s = _schedule()
    rep = _report({"cpu": _state()})
    s.on_report(rep, 0.0, lambda n: None)
    due = s.scheduler.due["cpu"]
    out = s.on_report(rep, due, lambda n: None)
    assert (protocol.DETAIL, {"proflet": "cpu"}) in out
    # Until the agent reports the burst, no second request.
    out = s.on_report(rep, due + 1.0, lambda n: None)
    assert [m for m in out if m[0] == protocol.DETAIL] == []
    assert "cpu" in s.pending
    done = _report({"cpu": _state()}, details=[{"proflet": "cpu", "length_s": 0.2}])
    s.on_report(done, due + 2.0, lambda n: None)
    assert "cpu" not in s.pending
    assert s.scheduler.due["cpu"] > due + 2.0


def test_conflicting_proflets_never_detail_together_and_none_is_dropped():
    s = _schedule()
    proflets = {"cpu": _state(allows=()), "threads": _state(allows=())}
    s.on_report(_report(proflets), 0.0, lambda n: None)
    now = max(s.scheduler.due.values())
    out = s.on_report(_report(proflets), now, lambda n: None)
    started = [m[1]["proflet"] for m in out if m[0] == protocol.DETAIL]
    assert len(started) == 1
    other = "threads" if started == ["cpu"] else "cpu"
    assert s.scheduler.queue.waiting == [other]
    done = [{"proflet": started[0], "length_s": 0.2}]
    out = s.on_report(_report(proflets, details=done), now + 1, lambda n: None)
    assert (protocol.DETAIL, {"proflet": other}) in out


def test_a_lost_burst_report_times_out_instead_of_blocking_the_queue():
    s = _schedule()
    rep = _report({"cpu": _state()})
    s.on_report(rep, 0.0, lambda n: None)
    due = s.scheduler.due["cpu"]
    s.on_report(rep, due, lambda n: None)
    late = due + 0.2 + BURST_TIMEOUT_S + 0.1
    s.on_report(rep, late, lambda n: None)
    assert s.lost == 1
    # The lost one started more than a delay ago: the next is asked for at once.
    assert s.requests == 2 and s.pending["cpu"] > late


def test_a_proflet_switched_off_in_the_agent_leaves_the_plan():
    s = _schedule()
    s.on_report(_report({"cpu": _state()}), 0.0, lambda n: None)
    s.on_report(_report({"cpu": {"off": "RuntimeError: boom"}}), 1.0, lambda n: None)
    assert s.costs == {} and s.plan.detail_delay_s == {}


def test_the_search_can_ask_for_a_burst_now():
    s = _schedule()
    s.on_report(_report({"cpu": _state()}), 0.0, lambda n: None)
    s.ask("cpu")
    out = s.on_report(_report({"cpu": _state()}), 0.5, lambda n: None)
    # said so, for the agent's queue to serve it first too
    assert (protocol.DETAIL, {"proflet": "cpu", "first": True}) in out


def test_between_reports_the_next_burst_is_requested_when_due():
    # A burst is taken as done at its planned length, so at a high budget the
    # next one goes out when it is due, not at the next report (1 s or more).
    s = _schedule()
    s.on_report(_report({"cpu": _state(itvl_ms=150.0)}, budget=0.25), 0.0, lambda n: None)
    delay = s.plan.detail_delay_s["cpu"]
    assert delay < 1.0  # several bursts a second are planned
    due = s.scheduler.due["cpu"]
    assert s.tick(due - 0.01) == []
    assert s.tick(due) == [(protocol.DETAIL, {"proflet": "cpu"})]
    assert s.tick(due + 0.1) == []  # still running by its planned length
    requests, now = [due], due
    while now < due + 5.0:
        now += 0.01
        if s.tick(now):
            requests.append(now)
    gaps = [b - a for a, b in itertools.pairwise(requests)]
    assert len(gaps) >= 4
    assert sum(gaps) / len(gaps) == pytest.approx(max(delay, 0.2), rel=0.35)


def test_a_budget_change_replans_at_once_and_the_plan_says_its_budget():
    s = _schedule()
    assert s.set_budget(0.01, now=0.0) is None  # nothing measured yet: the agent plans on its own
    s.on_report(_report(budget=0.0001, samples=1, sample_s=0.0002), now=0.0, priorities=lambda n: None)
    slow = s.timings()
    assert slow["budget"] == 0.0001
    timings = s.set_budget(0.05, now=1.0)
    assert timings is not None and timings["budget"] == 0.05
    expected = plan(0.05, 0.0002, 0.001)
    assert timings["sample_delay_s"] == pytest.approx(expected.sample_delay_s)
    assert timings["sample_delay_s"] < slow["sample_delay_s"] / 100
    # The body goes out with the budget, and the agent accepts it.
    protocol.decode(protocol.encode(protocol.CONFIGURE, {"budget": 0.05, "plan": timings}), protocol.AGENT_ACCEPTS)
