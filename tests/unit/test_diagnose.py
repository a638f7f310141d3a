"""Automated diagnosis (seed 002's Performance Consultant) on hand-built dyper profiles with planted bottlenecks."""

from __future__ import annotations

import pytest

from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount
from dyper.monitor.search.calltree import CallTreeProfile
from dyper.monitor.search.diagnose import Diagnosis, Step, classify_wait, diagnose, diagnose_tree

APP = "/srv/app.py"
THREADING = "/usr/lib/python3.11/threading.py"
SOCKET = "/usr/lib/python3.11/socket.py"


class Builder:
    """Frames by (name, file), stacks by names: a dyper Profile written by hand."""

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.index: dict[tuple[str, str, int], int] = {}
        self.stacks: list[StackCount] = []

    def frame(self, name: str, file: str = APP, line: int = 1) -> int:
        key = (name, file, line)
        if key not in self.index:
            self.index[key] = len(self.frames)
            self.frames.append(Frame(file, name, 1, line))
        return self.index[key]

    def add(self, thread: int, stack: list[str | tuple[str, str] | tuple[str, str, int]], wall: int, cpu: int) -> None:
        ids = []
        for f in stack:
            if isinstance(f, str):
                ids.append(self.frame(f))
            else:
                ids.append(self.frame(*f))
        self.stacks.append(StackCount(thread, tuple(ids), wall, cpu))

    def profile(self) -> Profile:
        return Profile(self.frames, self.stacks)


def label(name: str, file: str = APP) -> str:
    return f"{name} ({file})"


def step_at(d: Diagnosis, hypothesis: str, path: tuple[str, ...]) -> Step:
    found = [s for s in d.history if s.hypothesis == hypothesis and s.path == path]
    assert len(found) == 1, (hypothesis, path, found)
    return found[0]


def test_planted_cpu_hot_spot_under_one_entry_point_ranks_first() -> None:
    b = Builder()
    # main: 4 samples itself, 30 functions at 3 each, and hot() at 6: 100 cpu samples.
    b.add(1, ["main"], 4, 4)
    for i in range(30):
        b.add(1, ["main", f"f{i:02d}"], 3, 3)
    b.add(1, ["main", "hot"], 6, 6)
    # A thread asleep all along (not a bottleneck) and a short lock wait (under the threshold).
    b.add(2, ["Thread.run", ("sleeper", APP, 9)], 500, 0)
    b.add(3, ["Thread.run", ("Condition.wait", THREADING)], 3, 0)
    d = diagnose(b.profile(), line_text=lambda f, n: "time.sleep(1)" if n == 9 else "")

    assert d.total == 103  # busy: 100 cpu + 3 waiting; the 500 asleep are left out
    first = d.bottlenecks[0]
    assert first.hypothesis == "cpu" and first.kind == "self"
    assert first.path == (label("main"), label("hot"))
    assert first.share == pytest.approx(6 / 103)
    assert first.to_json()["share_pct"] == pytest.approx(100 * 6 / 103, abs=1e-3)
    # Nothing else is a place to fix: the f's are each under 5%, main's own 4% too.
    assert [b.kind for b in d.bottlenecks[1:]] == ["diffuse"]
    assert d.bottlenecks[1].path == (label("main"),)
    assert d.bottlenecks[1].share == pytest.approx(90 / 103)

    # The history: cpu passed on the whole program, at main, at hot; an f failed; sync failed; sleep ignored.
    assert step_at(d, "cpu", ()).verdict == "passed"
    main = step_at(d, "cpu", (label("main"),))
    assert main.verdict == "passed" and main.share == pytest.approx(100 / 103)
    hot = step_at(d, "cpu", (label("main"), label("hot")))
    assert hot.verdict == "passed" and hot.parent == main.step
    f00 = step_at(d, "cpu", (label("main"), label("f00")))
    assert f00.verdict == "failed" and f00.share == pytest.approx(3 / 103)
    assert step_at(d, "sync", ()).verdict == "failed"
    assert step_at(d, "sync", ()).share == pytest.approx(3 / 103)
    assert step_at(d, "sleep", ()).verdict == "ignored"
    assert step_at(d, "gc", ()).verdict == "untestable"
    assert d.shares["cpu"] == pytest.approx(100 / 103)


def test_a_lock_wait_ranks_as_sync() -> None:
    b = Builder()
    # The worker waits in Queue.get -> Condition.wait 60 samples; the main thread computes 40.
    b.add(1, ["<module>", "main", "compute"], 40, 40)
    queue_get = ("Queue.get", "/usr/lib/python3.11/queue.py")
    b.add(2, ["Thread._bootstrap", "worker", queue_get, ("Condition.wait", THREADING)], 60, 0)
    d = diagnose(b.profile())
    first = d.bottlenecks[0]
    assert first.hypothesis == "sync"
    assert first.path[-1] == label("Condition.wait", THREADING)
    assert first.path[0] == label("Thread._bootstrap")
    assert first.share == pytest.approx(0.6)
    assert d.bottlenecks[1].hypothesis == "cpu" and d.bottlenecks[1].path[-1] == label("compute")
    assert step_at(d, "io", ()).verdict == "failed" and step_at(d, "io", ()).share == 0


def test_a_lock_acquired_in_application_code_is_told_by_its_source_line() -> None:
    b = Builder()
    b.add(1, ["main", ("consumer", APP, 12)], 50, 0)
    b.add(1, ["main", ("consumer", APP, 14)], 50, 50)
    lines = {12: "        lock.acquire()\n", 14: "        total += step(x)\n"}
    d = diagnose(b.profile(), line_text=lambda f, n: lines.get(n, ""))
    assert [(x.hypothesis, x.path[-1], round(x.share, 2)) for x in d.bottlenecks] == [
        ("cpu", label("consumer"), 0.5),
        ("sync", label("consumer"), 0.5),
    ]
    # Without the source there is nothing to go by: blocked, but on what is not known.
    blind = diagnose(b.profile())
    assert {x.hypothesis for x in blind.bottlenecks} == {"cpu", "wait"}


def test_a_socket_read_is_io() -> None:
    b = Builder()
    b.add(1, ["main", "fetch", ("SocketIO.readinto", SOCKET)], 70, 0)
    b.add(1, ["main", "parse"], 30, 30)
    d = diagnose(b.profile())
    first = d.bottlenecks[0]
    assert (first.hypothesis, first.kind) == ("io", "self")
    assert first.path == (label("main"), label("fetch"), label("SocketIO.readinto", SOCKET))
    assert first.share == pytest.approx(0.7)
    assert step_at(d, "io", ()).verdict == "passed"
    assert step_at(d, "sync", ()).verdict == "failed"


def test_the_spread_out_function_under_ten_parents_is_still_found() -> None:
    b = Builder()
    # common() costs 40% in all, 4% under each of 10 parents; each parent is 4.5% inclusive.
    for i in range(10):
        b.add(1, ["main", f"p{i}"], 5, 5)
        b.add(1, ["main", f"p{i}", "common"], 40, 40)
    for k in range(11):
        b.add(1, ["main", f"other{k}"], 40, 40)
    b.add(1, ["main"], 110, 110)
    d = diagnose(b.profile())
    assert d.total == 1000
    # Top-down, no parent passes: refinement stops at main.
    for i in range(10):
        assert step_at(d, "cpu", (label("main"), label(f"p{i}"))).verdict == "failed"
    # ... so the only test of common is the bottom-up one.
    assert [s.path for s in d.history if s.path and s.path[-1] == label("common")] == [(label("common"),)]
    # Bottom-up finds common, and it ranks first.
    first = d.bottlenecks[0]
    assert (first.hypothesis, first.kind, first.path) == ("cpu", "spread", (label("common"),))
    assert first.share == pytest.approx(0.4)
    assert "spread over 10 callers, none reaching the threshold alone: p0 4.0%" in first.evidence
    assert [(c, round(v, 3)) for c, v in first.callers] == [(label(f"p{i}"), 0.04) for i in range(10)]
    assert first.tree_path[-1] == label("common") and first.tree_path[0] == label("main")
    bottom_up = step_at(d, "cpu", (label("common"),))
    assert bottom_up.verdict == "passed" and bottom_up.parent == step_at(d, "cpu", ()).step
    # main's own 11% is a place too; the 89% spread over its callees comes last.
    assert [(x.kind, x.path, round(x.share, 3)) for x in d.bottlenecks[1:]] == [
        ("self", (label("main"),), 0.11),
        ("diffuse", (label("main"),), 0.89),
    ]


def test_a_function_reached_top_down_is_not_reported_bottom_up_again() -> None:
    b = Builder()
    b.add(1, ["main", "a", "work"], 60, 60)
    b.add(1, ["main", "b", "work"], 40, 40)
    d = diagnose(b.profile())
    # Bottom-up, work is refined to its dominant caller a; top-down finds main > a > work, the same
    # samples: reported once, as the refinement (it names the caller), then work under b.
    assert [(x.kind, x.path, x.share) for x in d.bottlenecks] == [
        ("path", (label("a"), label("work")), 0.6),
        ("self", (label("main"), label("b"), label("work")), 0.4),
    ]
    assert "60.0% of work's 100.0% comes from a" in d.bottlenecks[0].evidence
    bottom_up = step_at(d, "cpu", (label("work"),))
    assert bottom_up.verdict == "passed" and bottom_up.share == 1.0
    covered = [s for s in d.history if s.verdict == "covered"]
    assert [s.path for s in covered] == [(label("main"), label("a"), label("work"))]


def test_a_hot_leaf_under_a_shared_routine_is_one_bottleneck_with_the_routine() -> None:
    b = Builder()
    # normalize (10% own) calls fold (30%, a hot leaf); 12 handlers call normalize, each 3.3% in all.
    for i in range(12):
        b.add(1, ["main", f"handle_{i:02d}", "normalize"], 10, 10)
        b.add(1, ["main", f"handle_{i:02d}", "normalize", "fold"], 30, 30)
    b.add(1, ["main", "tidy"], 200, 200)
    b.add(1, ["main"], 320, 320)
    d = diagnose(b.profile())
    assert d.total == 1000
    first = d.bottlenecks[0]
    assert (first.kind, first.path, first.share) == ("spread", (label("normalize"),), 0.48)
    assert len(first.callers) == 12
    # fold alone is not a bottleneck of its own: it is the same samples.
    assert all(label("fold") not in x.path or x is first for x in d.bottlenecks)


def test_an_idle_event_loop_is_not_a_bottleneck_what_blocks_it_is() -> None:
    b = Builder()
    loop = [("BaseEventLoop.run_forever", "/usr/lib/python3.11/asyncio/base_events.py"),
            ("BaseEventLoop._run_once", "/usr/lib/python3.11/asyncio/base_events.py")]  # fmt: skip
    b.add(1, ["main", *loop, ("EpollSelector.select", "/usr/lib/python3.11/selectors.py")], 900, 5)
    callback = ("Handle._run", "/usr/lib/python3.11/asyncio/events.py")
    b.add(1, ["main", *loop, callback, "compress_job", ("compress_blocking", APP, 7)], 300, 0)
    b.add(1, ["main", *loop, callback, "handler"], 20, 20)
    profile = b.profile()
    profile.proflets = {
        "results": {
            "tasks": {
                "loops": [{"thread": "MainThread", "blocks": 3, "blocked_pct": 40.0, "lag_ms_p99": 300.0}],
                "blocks": [
                    {"thread": "MainThread", "task": "Task-2", "duration_ms": 300.0,
                     "stack": [{"function": "compress_job"}, {"function": "compress_blocking"}]},
                ] * 3,
                "block_threshold_ms": 100.0,
            }
        }
    }  # fmt: skip
    d = diagnose(profile, line_text=lambda f, n: "time.sleep(0.3)" if n == 7 else "")
    first = d.bottlenecks[0]
    assert (first.hypothesis, first.kind, first.path[-1]) == ("loop", "loop", label("compress_blocking"))
    assert "the event loop was blocked 3 time(s) for 0.90 s in compress_blocking (task Task-2)" in first.evidence
    assert all("EpollSelector" not in p for x in d.bottlenecks for p in x.path)
    assert d.total == 300 + 25  # the selector's 895 waiting samples are the loop idle
    assert any(s.hypothesis == "idle" and s.verdict == "ignored" for s in d.history)


def test_nothing_over_the_threshold() -> None:
    b = Builder()
    for i in range(40):
        b.add(i, [f"t{i}"], 1, 1)
    d = diagnose(b.profile())
    assert d.bottlenecks == []
    cpu = step_at(d, "cpu", ())
    assert cpu.verdict == "passed"
    assert all(s.verdict == "failed" for s in d.history if s.hypothesis == "cpu" and s.path)
    # A higher threshold: the whole program still passes at 100%, a smaller one finds each thread.
    assert len(diagnose(b.profile(), threshold=0.02).bottlenecks) == 40


def test_gc_frames_make_gc_testable() -> None:
    b = Builder()
    b.add(1, ["main", "build", ("<GC>", "")], 30, 30)
    b.add(1, ["main", "build"], 70, 70)
    d = diagnose(b.profile())
    gc = step_at(d, "gc", ())
    assert gc.verdict == "passed" and gc.share == pytest.approx(0.3)
    assert any(x.hypothesis == "gc" and x.path[-1] == label("<GC>", "") for x in d.bottlenecks)
    assert step_at(diagnose(Builder().profile()), "gc", ()).verdict == "untestable"


def test_empty_profile() -> None:
    d = diagnose(Builder().profile())
    assert d.total == 0 and d.bottlenecks == []
    assert "the profile has no busy samples" in d.notes
    with pytest.raises(ValueError):
        diagnose(Builder().profile(), threshold=0)


def test_collapsed_tree_tests_only_where_the_samples_are() -> None:
    tree = CallTreeProfile.from_collapsed("a 1\na;b 2\na;b;c 5\na;b;c;d 30\na;b;c;e 52\na;c 10\n")
    d = diagnose_tree(tree)
    assert [(x.path, x.share) for x in d.bottlenecks][:2] == [(("a", "b", "c", "e"), 0.52), (("a", "b", "c", "d"), 0.3)]
    assert {s.hypothesis for s in d.history if s.verdict == "untestable"} == {"cpu", "io", "sync", "wait", "gc"}
    data = d.to_json()
    assert set(data["bottlenecks"][0]) >= {"path", "hypothesis", "share_pct", "evidence"}
    assert set(data["history"][0]) >= {"step", "hypothesis", "path", "share_pct", "verdict"}
    assert data["bottlenecks"][0]["share_pct"] == 52.0


@pytest.mark.parametrize(
    ("frames", "line", "kind"),
    [
        ([("Condition.wait", THREADING)], "", "sync"),
        ([("Thread.join", THREADING)], "", "sync"),
        ([("Queue.get", "/usr/lib/python3.11/queue.py")], "", "sync"),
        ([("Event.wait", THREADING)], "", "sync"),
        ([("SocketIO.readinto", SOCKET)], "", "io"),
        ([("SSLSocket.recv_into", "/usr/lib/python3.11/ssl.py")], "", "io"),
        ([("EpollSelector.select", "/usr/lib/python3.11/selectors.py")], "", "io"),
        ([("HTTPConnection.getresponse", "/usr/lib/python3.11/http/client.py")], "", "io"),
        ([("urlopen", "/usr/lib/python3.11/urllib/request.py")], "", "io"),
        ([("handler", APP)], "    time.sleep(0.5)", "sleep"),
        ([("handler", APP)], "    data = conn.recv(4096)", "io"),
        ([("handler", APP)], "    with x: lock.acquire()", "sync"),
        ([("handler", APP)], "    t.join()", "sync"),
        ([("handler", APP)], "", "wait"),
        ([("read_config", APP), ("handler", APP)], "", "io"),  # a caller's name counts
        ([("spawn_thread", APP)], "", "wait"),  # "thread" is no "read"
        ([("Thread.run", THREADING), ("handler", APP)], "", "wait"),  # a caller's module does not count
        ([("Condition.wait", THREADING)], "    waiter.acquire()", "sync"),
        ([("SocketIO.readinto", SOCKET)], "    return self._sock.recv_into(b)", "io"),
    ],
)
def test_classify_wait(frames: list[tuple[str, str]], line: str, kind: str) -> None:
    stack = [Frame(file, name, 1, 5) for name, file in frames]
    assert classify_wait(stack, lambda f, n: line) == kind


def test_comprehensions_are_charged_to_the_function_that_holds_them() -> None:
    tree = CallTreeProfile.from_collapsed(
        "main;build;build.<locals>.<listcomp>;Node.__init__ 50\n"
        "main;build;build.<locals>.<listcomp> 30\n"
        "main;other 20\n"
    )
    d = diagnose_tree(tree)
    assert [(b.path, b.share) for b in d.bottlenecks] == [
        (("main", "build", "Node.__init__"), 0.5),
        (("main", "build"), 0.3),
        (("main", "other"), 0.2),
    ]
    b = Builder()
    b.add(1, ["main", "normalize", "normalize.<locals>.<genexpr>"], 80, 80)
    b.add(1, ["main", "other"], 20, 20)
    first = diagnose(b.profile()).bottlenecks[0]
    assert first.path == (label("main"), label("normalize")) and first.share == 0.8


def test_a_loop_that_lags_without_blocks_starves_its_tasks() -> None:
    b = Builder()
    loop = [("BaseEventLoop.run_forever", "/usr/lib/python3.11/asyncio/base_events.py"),
            ("BaseEventLoop._run_once", "/usr/lib/python3.11/asyncio/base_events.py"),
            ("Handle._run", "/usr/lib/python3.11/asyncio/events.py")]  # fmt: skip
    b.add(1, ["main", *loop, "handler", "render"], 80, 80)
    b.add(1, ["main", *loop, "other"], 20, 20)
    profile = b.profile()
    profile.proflets = {
        "results": {
            "tasks": {
                "loops": [{"thread": "MainThread", "blocks": 0, "lag_ms_p99": 250.0, "lag_probes": 30}],
                "blocks": [],
                "block_threshold_ms": 100.0,
            }
        }
    }
    d = diagnose(profile)
    first = d.bottlenecks[0]
    assert first.hypothesis == "cpu" and first.path[-1] == label("render")
    assert "tasks wait their turn up to 250 ms" in first.evidence
    assert step_at(d, "starved", ()).verdict == "passed"


def test_threads_ready_to_run_are_left_out_not_ranked_as_waits() -> None:
    # Three threads share the GIL: the native sampler sees one on a CPU and the other two waiting
    # for the GIL or in the run queue, leaves named "<waiting for the GIL>" and "<run queue>".
    # They are not a wait on a queue: what the GIL's holders compute is the question.
    b = Builder()
    state = "<dyper state>"
    for thread in (1, 2, 3):
        b.add(thread, ["Thread._bootstrap", "spin"], 30, 30)
        b.add(thread, ["Thread._bootstrap", "spin", ("<waiting for the GIL>", state)], 50, 0)
        b.add(thread, ["Thread._bootstrap", "spin", ("<run queue>", state)], 20, 0)
    d = diagnose(b.profile())
    assert [(x.hypothesis, x.path[-1]) for x in d.bottlenecks] == [("cpu", label("spin"))]
    assert d.bottlenecks[0].share == pytest.approx(1.0)
    ready = [s for s in d.history if s.hypothesis == "idle" and "ready to run" in s.note]
    assert len(ready) == 1 and ready[0].note.startswith("210 samples"), d.history
    assert step_at(d, "sync", ()).verdict == "failed"
