"""Services: sessions grouped into a master and its workers, and their profiles merged."""

from __future__ import annotations

from typing import Any

from dyper.monitor.profile import build_profile
from dyper.monitor.services import group, service_of
from dyper.monitor.session import FrameTable, Session
from dyper.monitor.windows import WindowSpec
from tests.factories import hello, report


def session(frames: FrameTable, h: dict[str, Any]) -> Session:
    s = Session((h["host"], h["pid"], h["start_time"]), h, frames)
    s.add_agent(h)
    return s


def feed(s: Session, work: str, counts: list[int], t0: float = 1000.0) -> None:
    state = next(iter(s.agents.values()))
    for i, n in enumerate(counts):
        s.ingest(state, report(state.agent_id, work, n, t=t0 + i, seq=i + 1))


def test_a_master_and_the_workers_it_forked_are_one_service_rooted_at_the_master() -> None:
    frames = FrameTable()
    master = session(frames, hello(100, 1, 10.0))
    w1 = session(frames, hello(101, 100, 11.0))
    w2 = session(frames, hello(102, 100, 11.5))
    grandchild = session(frames, hello(103, 101, 12.0))
    other = session(frames, hello(200, 1, 10.0))
    services = group([w2, other, grandchild, master, w1])
    assert [sv.pids for sv in services] == [[100, 101, 102, 103], [200]]
    assert services[0].root is master
    assert services[0].name == "gunicorn app:app (pid 100)"
    assert service_of([master, w1, w2, grandchild, other], grandchild).root is master


def test_a_reused_pid_that_started_after_the_child_is_not_its_parent() -> None:
    frames = FrameTable()
    # pid 100 now belongs to a process that started after 101 did: 101's real parent is gone.
    late = session(frames, hello(100, 1, 50.0))
    child = session(frames, hello(101, 100, 20.0))
    assert sorted(sv.pids for sv in group([late, child])) == [[100], [101]]


def test_same_pid_on_another_host_is_not_a_parent() -> None:
    frames = FrameTable()
    master = session(frames, hello(100, 1, 10.0, host="a"))
    worker = session(frames, hello(101, 100, 11.0, host="b"))
    assert len(group([master, worker])) == 2


def test_an_explicit_service_name_groups_processes_across_hosts() -> None:
    frames = FrameTable()
    a = session(frames, hello(100, 1, 10.0, host="a", service="checkout"))
    b = session(frames, hello(100, 1, 12.0, host="b", service="checkout"))
    c = session(frames, hello(300, 1, 10.0, host="a"))
    services = group([a, b, c])
    assert services[0].name == "checkout"
    assert services[0].pids == [100, 100]
    assert services[1].pids == [300]


def test_a_parent_loop_of_reused_pids_ends() -> None:
    frames = FrameTable()
    # each claims the other as parent (pids reused); both started at the same time
    a = session(frames, hello(1, 2, 10.0))
    b = session(frames, hello(2, 1, 10.0))
    services = group([a, b])
    assert sum(len(sv.members) for sv in services) == 2


def test_the_service_profile_adds_up_every_members_samples() -> None:
    frames = FrameTable()
    master = session(frames, hello(100, 1, 10.0))
    w1 = session(frames, hello(101, 100, 11.0))
    w2 = session(frames, hello(102, 100, 11.5))
    feed(master, "idle", [1, 1, 1])
    feed(w1, "handle", [10, 10, 10])
    feed(w2, "handle", [20, 20, 20])
    (service,) = group([master, w1, w2])
    profile = build_profile(service)
    by_name = {r["name"]: r for r in profile.functions("cpu")}
    assert by_name["handle"]["self"] == 90
    assert by_name["idle"]["self"] == 3
    assert profile.process["samples"] == 93
    assert profile.process["pids"] == [100, 101, 102]
    assert [r["samples"] for r in profile.process["processes"]] == [3, 30, 60]
    # the members' own tables are untouched by the merge
    assert master.samples == 3 and sum(c[1] for c in w2.counts.values()) == 60


def test_the_service_profile_over_a_window_takes_each_members_last_reports() -> None:
    frames = FrameTable()
    master = session(frames, hello(100, 1, 10.0))
    worker = session(frames, hello(101, 100, 11.0))
    feed(master, "idle", [1, 1, 1, 1])
    feed(worker, "handle", [5, 5, 5, 7], t0=2000.0)
    (service,) = group([master, worker])
    profile = build_profile(service, WindowSpec.last(1.5))
    by_name = {r["name"]: r["self"] for r in profile.functions("cpu") if r["self"]}
    # the last 1.5 s of each: reports ending at t0+2 and t0+3
    assert by_name == {"idle": 2, "handle": 12}
    assert profile.process["window"]["description"]
