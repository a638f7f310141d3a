"""Triggers: conditions as text and files, their checks with an injected clock, the ring that splits a report."""

from __future__ import annotations

import threading
import time

import pytest

from dyper.agent.triggers import Ring, Triggers, TriggerSpec, load_file, parse_trigger


def test_conditions_and_options_read_as_written():
    cpu = parse_trigger("cpu > 80% for 10s, after 60s, budget 10%")
    assert (cpu.kind, cpu.threshold, cpu.for_s, cpu.after_s, cpu.budget) == ("cpu", 0.8, 10.0, 60.0, 0.1)
    assert parse_trigger("CPU>50%").for_s == 5.0  # the default hold
    assert parse_trigger("rss > 1.5GB").threshold == 1.5e9
    assert parse_trigger("rss > 512MiB").threshold == 512 * 1024**2
    growth = parse_trigger("rss + 50MB/s for 3s")
    assert (growth.kind, growth.threshold, growth.for_s) == ("rss_growth", 50e6, 3.0)
    assert parse_trigger("blocked > 2m").threshold == 120.0
    mark = parse_trigger("mark:Checkout*, before 5s")
    assert (mark.kind, mark.pattern, mark.before_s) == ("mark", "Checkout*", 5.0)
    assert TriggerSpec.from_json(cpu.to_json()) == cpu


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("cpu > lots", "write it like"),
        ("rss > 5ZB", "unknown size unit"),
        ("mark:x for 3s", "'for' applies to cpu and rss"),
        ("cpu > 5%, soon", "unknown option"),
        ("blocked > 5s, budget 90%", "out of range"),
        ("cpu > 5%, after 0s", "after must be"),
        ("rss + 1MB/s for 0s", "growth is measured over some time"),
    ],
)
def test_a_condition_it_cannot_read_is_one_line_saying_how_to_write_it(text, says):
    with pytest.raises(ValueError, match=says) as info:
        parse_trigger(text)
    assert "\n" not in str(info.value) and text.strip() in str(info.value)


def test_a_file_gives_defaults_and_its_own_values(tmp_path):
    path = tmp_path / "triggers.toml"
    path.write_text('after = "60s"\nbudget = "5%"\n[[trigger]]\nwhen = "cpu > 80%"\n'
                    '[[trigger]]\nwhen = "rss + 20MB/s"\nafter = "2m"\n')  # fmt: skip
    cpu, rss = load_file(str(path))
    assert (cpu.after_s, cpu.budget, rss.after_s, rss.budget) == (60.0, 0.05, 120.0, 0.05)
    path.write_text('[[trigger]]\nwhen = "cpu > 80%"\nafterwards = 3\n')
    with pytest.raises(ValueError, match="unknown key"):
        load_file(str(path))
    path.write_text("[[trigger]\n")
    with pytest.raises(ValueError, match="is not TOML"):
        load_file(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        load_file(str(tmp_path / "nothere.toml"))


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_predicate_fires_once_per_episode_after_its_event_ends():
    clock, state = Clock(), {"on": False}
    triggers = Triggers((), clock)
    triggers.add(TriggerSpec(kind="predicate", name="backlog", after_s=3.0), lambda: state["on"])

    def step(seconds: int = 1) -> list[str]:
        fired = []
        for _ in range(seconds):
            clock.t += 1.0
            fired += [f.spec.name for f in triggers.check(clock.t)]
        return fired

    assert step(3) == []
    state["on"] = True
    assert step() == ["backlog"]
    assert step(5) == []  # still holding: not again, however long
    state["on"] = False
    assert step() == []
    state["on"] = True
    assert step() == ["backlog"]  # it stopped holding and the event ended: a new episode
    state["on"] = False
    step()
    state["on"] = True
    assert step() == []  # stopped holding, but the event (3 s) had not ended: re-armed only after it
    state["on"] = False
    step(3)
    state["on"] = True
    assert step() == ["backlog"]


def test_a_predicate_that_raises_or_dawdles_is_switched_off_with_an_error():
    clock = Clock()
    triggers = Triggers((), clock)
    triggers.add(TriggerSpec(kind="predicate", name="broken"), lambda: 1 / 0)
    triggers.add(TriggerSpec(kind="predicate", name="slow"), lambda: time.sleep(0.02))
    clock.t += 1
    assert triggers.check(clock.t) == []
    assert any("broken" in e and "ZeroDivisionError" in e for e in triggers.errors)
    assert any("slow" in e and "took" in e for e in triggers.errors)
    assert all(s.off for s in triggers.states)


def test_a_mark_fires_its_trigger_by_pattern():
    clock = Clock()
    triggers = Triggers([parse_trigger("mark:deploy*")], clock)
    triggers.marked("cache warm")
    clock.t += 1
    assert triggers.check(clock.t) == []
    triggers.marked("deploy 42")
    clock.t += 1
    (fired,) = triggers.check(clock.t)
    assert fired.why == "mark 'deploy 42'"


def test_cpu_needs_its_hold_and_a_thread_blocked_on_a_lock_is_seen_by_name():
    clock = Clock()
    triggers = Triggers([parse_trigger("cpu > 1000% for 2s"), parse_trigger("blocked > 1s")], clock)
    lock = threading.Lock()
    lock.acquire()
    waiter = threading.Thread(target=lambda: (lock.acquire(), lock.release()), name="waiter")
    waiter.start()
    try:
        time.sleep(0.1)
        fired = []
        for _ in range(3):
            clock.t += 1.0
            fired += triggers.check(clock.t)
        # No process here uses ten cores; the waiter has waited 2 s at the same place.
        assert [f.spec.kind for f in fired] == ["blocked"]
        assert "waiter" in fired[0].why and "lock" in fired[0].why
    finally:
        lock.release()
        waiter.join()


def test_the_ring_splits_a_window_at_the_last_cut_at_or_before_the_instant():
    ring = Ring()
    counts: dict[tuple[int, tuple[int, ...]], int] = {}
    ring.clear(100.0)
    a, b = (1, (1, 2)), (1, (3, 4))
    counts[a] = 5
    ring.cut(101.0, counts, 5)  # by 101: 5 of a
    counts[a] = 7
    counts[b] = 1
    ring.cut(102.0, counts, 8)  # by 102: 7 of a, 1 of b
    counts[b] = 4
    ring.cut(103.0, counts, 11)  # by 103: 7 of a, 4 of b
    counts[b] = 6
    assert ring.since(100.0, counts, 13) is None  # the window begins at the instant: nothing to split off
    assert ring.since(100.5, counts, 13) is None  # no cut by then
    assert ring.since(101.5, counts, 13) == (101.0, 8, {a: 2, b: 6})
    assert ring.since(102.0, counts, 13) == (102.0, 5, {b: 5})
    assert ring.since(250.0, counts, 13) == (103.0, 2, {b: 2})
