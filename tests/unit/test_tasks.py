"""The tasks proflet: await chains, running tasks, blocked loops (collector); handlers, the task view (analyzer)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from dyper.proflets.base import ReportView
from dyper.proflets.tasks import collector as tasks_proflet
from dyper.proflets.tasks.analyzer import TasksAnalyzer
from dyper.proflets.tasks.collector import TasksCollector, task_group


async def inner() -> None:
    await asyncio.sleep(60)


async def outer() -> None:
    await inner()


async def waiter(other: asyncio.Task[None]) -> None:
    await other


def blocking() -> None:
    time.sleep(0.3)


async def blocker(started: threading.Event) -> None:
    await asyncio.sleep(0)
    started.set()
    blocking()


class LoopThread:
    """An event loop running in its own thread, as in a service; the test's thread plays the agent's."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="loop-thread", daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(5)

    def close(self) -> None:
        async def cancel_all() -> None:
            for t in asyncio.all_tasks():
                if t is not asyncio.current_task():
                    t.cancel()

        self.run(cancel_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    try:
        yield lt
    finally:
        lt.close()


def _chains(report: dict[str, Any]) -> dict[str, list[list[str]]]:
    frames = report["frames"]
    out: dict[str, list[list[str]]] = {}
    for group, _, _, ids in report["stacks"]:
        out.setdefault(group, []).append([frames[i][1] for i in ids])
    return out


def test_task_group_drops_asyncios_running_number() -> None:
    assert task_group("Task-12") == "Task"
    assert task_group("worker-3") == "worker"
    assert task_group("cache-rebuilder") == "cache-rebuilder"


def test_suspended_tasks_are_charged_their_await_chains_and_the_task_they_await(loop_thread, monkeypatch) -> None:
    monkeypatch.setattr(tasks_proflet, "SUSPENDED_PER_PASS", 100)  # every task, every pass

    async def plant() -> None:
        worker = asyncio.get_running_loop().create_task(outer(), name="worker-1")
        asyncio.get_running_loop().create_task(waiter(worker), name="waiter-1")
        await asyncio.sleep(0.05)

    loop_thread.run(plant())
    c = TasksCollector()
    now = 1000.0
    for _ in range(5):
        c.poll(now, 1.0)
        now += 0.01
    report = c.report(None)  # type: ignore[arg-type]
    assert report is not None
    chains = _chains(report)
    assert ["outer", "inner", "sleep"] in chains["worker"], chains
    assert ["waiter", "awaiting task worker"] in chains["waiter"], chains
    # Four passes after the first, each 10 ms, all tasks seen in each: 40 ms of wall time per chain.
    wall = {group: w for group, w, _, ids in report["stacks"] if group == "worker"}
    assert wall["worker"] == pytest.approx(0.04, rel=0.01)
    (loop,) = report["loops"]
    assert loop["thread"] == loop_thread.thread.ident and loop["name"] == "loop-thread"
    assert loop["tasks"] and loop["tasks"][0] >= 2


def test_a_callback_holding_the_loop_is_a_block_with_its_stack(loop_thread) -> None:
    async def park() -> None:
        asyncio.get_running_loop().create_task(inner(), name="parked")

    loop_thread.run(park())
    c = TasksCollector()
    c.poll(time.monotonic(), 1.0)  # the census finds the loop by its tasks
    started = threading.Event()
    asyncio.run_coroutine_threadsafe(blocker(started), loop_thread.loop)
    c.poll(time.monotonic(), 1.0)
    assert started.wait(5)
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:  # passes while it blocks, and after
        c.poll(time.monotonic(), 1.0)
        time.sleep(0.02)
    report = c.report(None)  # type: ignore[arg-type]
    assert report is not None
    (block,) = report["blocks"]
    frames = report["frames"]
    assert [frames[i][1] for i in block["stack"]][-2:] == ["blocker", "blocking"], block
    assert 0.15 <= block["duration_s"] <= 0.45, block  # 0.3 s planted, passes 20 ms apart
    assert block["thread"] == loop_thread.thread.ident
    # While blocked, the running task's stack was charged as running (cpu) too.
    running = [(w, cpu) for g, w, cpu, ids in report["stacks"] if cpu > 0 and frames[ids[0]][1] == "blocker"]
    assert running and sum(cpu for _, cpu in running) >= 0.1, report["stacks"]


def test_no_asyncio_loop_means_no_report_and_a_slow_pace() -> None:
    c = TasksCollector()
    assert c.poll(0.0, 0.01) >= tasks_proflet.CENSUS_S
    assert c.report(None) is None  # type: ignore[arg-type]


def _report(t: float, data: dict[str, Any]) -> ReportView:
    return ReportView(t=t, window_s=1.0, samples=10, data=data)


FRAMES = [
    ["/srv/app.py", "handle", 10, 12],  # 0
    ["/srv/app.py", "fetch", 20, 21],  # 1
    ["/usr/lib/python3.12/asyncio/tasks.py", "sleep", 600, 660],  # 2
    ["/srv/app.py", "render", 30, 31],  # 3
    ["/srv/app.py", "compress", 40, 41],  # 4
]


def test_handlers_split_their_wall_time_by_what_they_await_and_the_task_view_is_a_profile() -> None:
    a = TasksAnalyzer()
    a._is_library = lambda: lambda f: f.startswith("/usr/lib")  # type: ignore[method-assign]
    first = {
        "frames": FRAMES,
        "stacks": [["Task", 0.8, 0.0, [0, 1, 2]], ["Task", 0.1, 0.0, [0, 3]], ["Task", 0.1, 0.1, [0, 3]]],
        "loops": [{"thread": 7, "name": "MainThread", "passes": 50, "seconds": 1.0, "busy_s": 0.4,
                   "tasks": [10, 12], "lag_s": [0.001, 0.002]}],
        "blocks": [{"t": 100.5, "thread": 7, "task": "cache", "duration_s": 0.3, "passes": 10, "stack": [4]}],
        "passes": 50,
    }  # fmt: skip
    second = {
        "frames": FRAMES[:3],
        "stacks": [["Task", 1.0, 0.0, [0, 1, 2]]],
        "loops": [{"thread": 7, "name": "MainThread", "passes": 50, "seconds": 1.0, "busy_s": 0.1,
                   "tasks": [8], "lag_s": [0.2]}],
        "blocks": [],
        "passes": 50,
    }  # fmt: skip
    a.merge(_report(101.0, first))
    a.merge(_report(102.0, second))
    r = a.results()
    (h,) = r["handlers"]
    assert h["handler"] == "handle" and h["wall_s"] == pytest.approx(2.0)
    assert h["running_pct"] == pytest.approx(5.0)
    assert [(w["function"], w["via"]) for w in h["awaiting"]] == [("fetch", "sleep"), ("render", "")]
    assert h["awaiting"][0]["pct"] == pytest.approx(90.0)
    (loop,) = r["loops"]
    assert loop["blocks"] == 1 and loop["blocked_s"] == pytest.approx(0.3)
    assert loop["busy_pct"] == pytest.approx(25.0) and loop["tasks_max"] == 12
    assert loop["lag_ms_max"] == pytest.approx(200.0)
    assert r["blocks"][0]["stack"] == [{"function": "compress", "file": "/srv/app.py", "line": 41}]
    assert any("blocked 1 time(s)" in f and "compress" in f for f in r["findings"]), r["findings"]
    assert any(f.startswith("handle spent 90% of its wall time awaiting fetch in sleep") for f in r["findings"])
    # Over time, report by report: tasks (mean of the censuses), seconds blocked, the worst lag.
    assert r["timeline"] == [[101.0, 11.0, 0.3, 0.002], [102.0, 8.0, 0.0, 0.2]]
    # A window holds only its reports.
    assert a.results(101.5, None)["handlers"][0]["wall_s"] == pytest.approx(1.0)
    assert a.results(101.5, None)["loops"][0]["blocks"] == 0
    # The task view: task names as threads, milliseconds as counts, wall and running.
    profile = a.profile()
    assert profile.threads == {0: "task Task"}
    assert profile.total("wall") == 2000 and profile.total("cpu") == 100
    assert {tuple(profile.frames[i].name for i in s.frames) for s in profile.stacks} == {
        ("handle", "fetch", "sleep"),
        ("handle", "render"),
    }
    # Kept through history.
    b = TasksAnalyzer()
    b.restore(a.state())
    assert b.profile().total("wall") == 2000
