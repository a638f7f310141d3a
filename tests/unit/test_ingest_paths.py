"""The monitor's fast intake gives what the plain computations give.

A report's stacks are resolved once per agent and cached (and the cache is
dropped when the agent's tables change under it); windows are kept compact;
the scheduler's priorities come from running sums over the last seconds;
stacks' location ids stay msgpack bytes until first seen; history finds a
window's stacks by index; the threads analyzer keeps compact rows. Each is
checked here against the plain computation it replaces.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dyper.agent import protocol
from dyper.agent.protocol import LOC_AGENT, LOC_BLOCKING, LOC_GIL, LOC_LOCK, LOC_RUNQ, LOC_WAIT
from dyper.monitor.history import History, Retention
from dyper.monitor.model.frames import StackKey
from dyper.monitor.session import WINDOW_RETENTION_S, FrameTable, Session, leaf_kind
from dyper.proflets.base import KINDS, ReportView
from dyper.proflets.cpu import analyzer as cpu
from dyper.proflets.io.analyzer import IoAnalyzer
from dyper.proflets.threads.analyzer import ThreadsAnalyzer
from tests.factories import HELLO, IO_APP, broken_reports, io_report, io_session, make_report, report_bodies

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KEY = ("h", 1, 100.0)


def new_session(frames: FrameTable | None = None) -> tuple[Session, Any]:
    s = Session(KEY, HELLO, frames or FrameTable())
    return s, s.add_agent(HELLO)


#: stacks of make_report's locations (leaf first): 0 main, 1 f, 2 g, 3 main's sleep (blocking), 4 dumps, 5 r
STACKS = [[1, 0], [2, 1, 0], [3], [4, 1, 0], [5, 5, 0], [0], [2, 0], [4, 2, 1, 0]]


def random_report(rng: random.Random, t: float, seq: int) -> dict[str, Any]:
    stacks = [(rng.choice([7, 8]), rng.randint(0, 9), rng.choice(STACKS)) for _ in range(rng.randint(0, 12))]
    return make_report(stacks, seq=seq, t=t, samples=rng.randint(0, 40))


# --- compact windows and the cached stacks ----------------------------------------------------


def test_each_window_holds_what_its_report_alone_would_count() -> None:
    """The cached, compact path against a fresh session fed the one report (same frame table)."""
    rng = random.Random(1)
    frames = FrameTable()
    s, state = new_session(frames)
    for seq in range(40):
        report = random_report(rng, 1000.0 + seq, seq)
        s.ingest(state, report)
        alone, alone_state = new_session(frames)
        alone.ingest(alone_state, report)
        assert s.windows[-1].counts == alone.counts
        assert list(s.windows[-1].counts) == list(alone.counts)  # and in the report's order
    # The whole run is the sum of the windows, kept apart by other code (per-stack totals).
    merged, samples = s.window_counts(1e9)
    assert merged == s.counts and samples == s.samples
    assert list(merged) == list(s.counts)  # stacks in the order first counted


def test_a_restored_sessions_counts_go_on_from_what_history_kept() -> None:
    rng = random.Random(2)
    frames = FrameTable()
    s, state = new_session(frames)
    reports = [random_report(rng, 1000.0 + seq, seq) for seq in range(20)]
    for r in reports:
        s.ingest(state, r)
    half, half_state = new_session(frames)
    for r in reports[:10]:
        half.ingest(half_state, r)
    kept = {(tid, tuple(list(stack))): list(v) for (tid, stack), v in half.counts.items()}  # as history gives them
    again = Session.restore(KEY, HELLO, frames, {}, kept)
    state = again.add_agent(HELLO)
    for r in reports[10:]:
        again.ingest(state, r)
    assert again.counts == s.counts


def test_a_window_costs_a_few_bytes_per_stack() -> None:
    s, state = new_session()
    s.ingest(state, make_report([(7, 3, [1, 0]), (7, 200, [2, 1, 0]), (8, 1, [3])]))
    w = s.windows[-1]
    assert w.stacks.itemsize == 1 and w.values.itemsize == 1  # indices and counts under 256
    s.ingest(state, make_report([(7, 70_000, [1, 0])], seq=1, t=1001.0))
    assert s.windows[-1].values.itemsize == 4 and s.windows[-1].counts == {s.stack_keys[0]: [70_000, 70_000]}


def test_one_line_under_two_leaf_kinds_is_one_stack_with_its_cpu_samples_apart() -> None:
    """Two locations of one line, one flagged blocking (the agent tells calls apart): one stack, cpu from one."""
    s, state = new_session()
    report = make_report([(7, 5, [1, 0]), (7, 3, [6, 0])])
    report["locs"].append([6, 0, 2, 10, 11, LOC_BLOCKING | LOC_LOCK])  # f's line 11 again, blocked on a lock
    s.ingest(state, report)
    (key,) = s.windows[-1].counts
    assert s.windows[-1].counts == {key: [8, 5]} == s.counts
    assert len(s.windows[-1].stacks) == 1


def leaf_names(s: Session) -> dict[str, list[int]]:
    return {s.frames.frames[frames[-1]].name: n for (_, frames), n in s.counts.items()}


def test_the_cache_follows_the_agents_tables() -> None:
    """The same location ids mean other code after an epoch (new tables) or a location sent again."""
    s, state = new_session()
    s.ingest(state, make_report([(7, 4, [1, 0]), (7, 1, [2, 0])]))  # 1 is f, 2 is g
    again = make_report([(7, 2, [1, 0])], seq=1, t=1001.0)
    again["epoch"] = 1
    again["strings"][2:4] = [[2, "h"], [3, "k"]]  # a new agent incarnation's tables: 1 is h, 2 is k
    s.ingest(state, again)
    assert leaf_names(s) == {"f": [4, 4], "g": [1, 1], "h": [2, 2]}
    later = make_report([(7, 3, [2, 0])], seq=2, t=1002.0, with_tables=False)
    later["epoch"] = 1
    s.ingest(state, later)  # a stack cached in the old epoch, not sent since
    assert leaf_names(s) == {"f": [4, 4], "g": [1, 1], "h": [2, 2], "k": [3, 3]}
    moved = make_report([(7, 1, [5, 0])], seq=3, t=1003.0, with_tables=False)
    moved["epoch"] = 1
    moved["locs"] = [[2, 0, 2, 10, 11, 0]]  # 2 sent again as h's line, in a report of other stacks
    s.ingest(state, moved)
    s.ingest(state, dict(later, seq=4, t=1004.0))
    assert leaf_names(s) == {"f": [4, 4], "g": [1, 1], "h": [5, 5], "k": [3, 3], "r": [1, 1]}
    # dyper's own frames leave a stack, through the cache as through a first resolution
    hooked = make_report([(7, 2, [7, 1, 0])], seq=5, t=1005.0, with_tables=False)
    hooked["epoch"] = 1
    hooked["locs"] = [[7, 0, 3, 99, 99, LOC_AGENT]]
    for seq in (5, 6):
        s.ingest(state, dict(hooked, seq=seq, t=1000.0 + seq))
    assert leaf_names(s)["h"] == [9, 9]


def test_a_cached_stack_does_not_hide_a_hole_in_the_same_report() -> None:
    s, state = new_session()
    s.ingest(state, make_report([(7, 4, [1, 0])]))
    before = {k: list(v) for k, v in s.counts.items()}
    with pytest.raises(KeyError):  # UnknownLocation
        s.ingest(state, make_report([(7, 4, [1, 0]), (7, 1, [40, 0])], seq=1, t=1001.0, with_tables=False))
    assert s.counts == before and len(s.windows) == 1


# --- the stacks' ids as bytes ------------------------------------------------------------------


def _expanded(body: dict[str, Any]) -> dict[str, Any]:
    ids = protocol.stacks_ids([row[2] for row in body["stacks"]])
    return dict(body, stacks=[[tid, n, s] for (tid, n, _), s in zip(body["stacks"], ids, strict=True)])


@SETTINGS
@given(body=report_bodies())
def test_raw_stacks_decode_to_the_same_report(body: dict[str, Any]) -> None:
    frame = protocol.encode(protocol.REPORT, body)
    kind, raw = protocol.decode(frame, raw_stacks=True)
    assert kind == protocol.REPORT and all(type(row[2]) is bytes for row in raw["stacks"])
    assert _expanded(raw) == protocol.decode(frame)[1]


@SETTINGS
@given(body=broken_reports())
def test_raw_stacks_refuse_what_decode_refuses(body: dict[str, Any]) -> None:
    """What decode refuses, raw_stacks refuses too, or its stacks' ids do (before a monitor uses them)."""
    frame = msgpack.packb(["dyper", 1, "report", body], use_bin_type=True)
    try:
        plain = protocol.decode(frame)[1]
    except protocol.DecodeError:
        plain = None
    try:
        raw: dict[str, Any] | None = _expanded(protocol.decode(frame, raw_stacks=True)[1])
    except protocol.DecodeError:
        raw = None
    assert raw == plain


@SETTINGS
@given(data=st.binary(max_size=300))
def test_raw_stacks_refuse_garbage_as_decode_does(data: bytes) -> None:
    refused = []
    for raw in (False, True):
        try:
            protocol.decode(data, raw_stacks=raw)
            refused.append(False)
        except protocol.DecodeError:
            refused.append(True)
    assert refused[0] == refused[1]


# --- the priorities' running sums ------------------------------------------------------------------


def recomputed_cpu_priority(session: Session, window_s: float = 10.0) -> float:
    """cpu.priority as it was: merge the recent windows' stacks, then count."""
    counts, passes = session.window_counts(window_s)
    if passes <= 0:
        return 0.1
    frames = session.frames.frames
    cpu_total = 0
    by_function: dict[tuple[str, str, int], int] = {}
    for (_, stack), (_, n) in counts.items():
        if n and stack:
            cpu_total += n
            f = frames[stack[-1]].function
            by_function[f] = by_function.get(f, 0) + n
    if cpu_total == 0:
        return 0.1
    candidates = sum(1 for n in by_function.values() if 100.0 * n / cpu_total >= cpu.CANDIDATE_PCT)
    busy = min(1.0, cpu_total / passes)
    return max(0.1, busy * (0.5 + 0.5 * min(1.0, candidates / 4)))


#: seconds between reports: steady, gaps past the 10 s of the priority, an agent clock stepping back,
#: and past the retention of windows
steps = st.lists(st.sampled_from([0.5, 1.0, 1.0, 3.0, 12.0, -4.0, -30.0, WINDOW_RETENTION_S + 5.0]), max_size=60)


@SETTINGS
@given(gaps=steps, seed=st.integers(0, 2**16))
def test_the_cpu_priority_from_running_sums_is_the_recomputed_one(gaps: list[float], seed: int) -> None:
    rng = random.Random(seed)
    s, state = new_session()
    t = 1000.0
    for seq, gap in enumerate(gaps):
        t += gap
        s.ingest(state, random_report(rng, t, seq))
        assert cpu.priority(s) == recomputed_cpu_priority(s)
        if rng.random() < 0.3:  # asked for another span now and then: the sums for 10 s start afresh after
            assert cpu.priority(s, 3.0) == recomputed_cpu_priority(s, 3.0)


def recomputed_io_priority(analyzer: IoAnalyzer) -> float:
    counts, _ = analyzer.session.window_counts(10.0)
    rows, _, grand = analyzer._rows(counts)
    if not rows:
        return 0.1
    share = sum(r.samples for r in rows.values()) / grand
    return min(1.0, 0.1 + share * (0.5 + 0.5 * min(1.0, len(rows) / 4)))


def test_the_io_priority_from_running_sums_is_the_recomputed_one() -> None:
    s = io_session()
    state = s.agents["h:1:x"]
    analyzer = s.analyzers["io"]
    assert isinstance(analyzer, IoAnalyzer)
    rng = random.Random(3)
    t = 1002.0
    for seq in range(40):
        t += rng.choice([1.0, 1.0, 4.0, 11.0]) if seq < 20 else 1.0
        shapes = [[0], [1], [2], [3, 4], [4]]
        stacks = [(rng.choice([7, 8, 9]), rng.randint(1, 50), rng.choice(shapes)) for _ in range(4)]
        data: dict[str, Any] = {}
        if seq == 30:  # the collector names a call at last: what counts as I/O changes for the old windows too
            data["calls"] = [[IO_APP, "buffered", 20, 21, "read", False]]
            before = recomputed_io_priority(analyzer)
        s.ingest(state, io_report(t, stacks, data))
        assert analyzer.priority() == recomputed_io_priority(analyzer)
    assert recomputed_io_priority(analyzer) != before


# --- history: a window's stacks by index ----------------------------------------------------------


def test_history_keeps_windows_of_a_new_session_object_under_the_same_key(tmp_path: Any) -> None:
    """A monitor restarted on the file makes new Session objects: stacks by index must not mix them up."""
    h = History(tmp_path / "h.sqlite3", Retention(None, None))
    frames = FrameTable()
    h._frames = frames
    first, state = new_session(frames)
    first.ingest(state, make_report([(7, 1, [1, 0]), (7, 2, [2, 1, 0])]))
    h._write([("report", (first.key, first.hello, first.windows[-1], first.snapshot()))])
    second, state = new_session(frames)
    # the other stack first: index 0 is now g's stack
    second.ingest(state, make_report([(7, 4, [2, 1, 0]), (8, 8, [3])], seq=1, t=1001.0))
    second.windows[-1].n = 2
    h._write([("report", (second.key, second.hello, second.windows[-1], second.snapshot()))])
    got = h.slice(KEY, None, None)
    expected: dict[StackKey, list[int]] = {}
    for s in (first, second):
        for key, (wall, n) in s.counts.items():
            slot = expected.setdefault(key, [0, 0])
            slot[0] += wall
            slot[1] += n
    assert got.counts == expected and got.reports == 2
    h.close()


def test_history_totals_leave_out_a_transaction_that_failed(tmp_path: Any) -> None:
    path = tmp_path / "h.sqlite3"
    h = History(path, Retention(None, None))
    s, state = new_session()
    h._frames = s.frames
    s.ingest(state, make_report([(7, 3, [1, 0])]))
    h._write([("report", (s.key, s.hello, s.windows[-1], s.snapshot()))])
    s.ingest(state, make_report([(7, 5, [1, 0])], seq=1, t=1001.0))
    h._write([("report", (s.key, s.hello, s.windows[-1], {"unpackable": {1, 2}}))])  # fails, rolled back
    assert h.counters["errors"] == 1 and h.counters["dropped"] == 1
    s.ingest(state, make_report([(7, 7, [1, 0])], seq=2, t=1002.0))
    h._write([("report", (s.key, s.hello, s.windows[-1], s.snapshot()))])
    h._fold_totals()
    h.close()
    again = History(path, Retention(None, None))
    _, stored = again.load()
    assert [sum(w for w, _ in st.counts.values()) for st in stored] == [3 + 7]
    again.close()


def test_history_totals_count_each_report_once(tmp_path: Any) -> None:
    """Across transactions, folds, and windows with no stacks, the stored totals are the session's own."""
    path = tmp_path / "h.sqlite3"
    h = History(path, Retention(None, None))
    s, state = new_session()
    h._frames = s.frames
    rng = random.Random(9)
    batch = []
    for seq in range(30):
        report = random_report(rng, 1000.0 + seq, seq) if seq % 4 else make_report([], seq=seq, t=1000.0 + seq)
        s.ingest(state, report)
        batch.append(("report", (s.key, s.hello, s.windows[-1], s.snapshot())))
        if seq % 7 == 6:
            h._write(batch)
            batch = []
        if seq % 11 == 10:
            h._fold_totals()
    h._write(batch)
    h._fold_totals()
    h.close()
    again = History(path, Retention(None, None))
    _, (stored,) = again.load()
    assert stored.counts == {k: v for k, v in s.counts.items() if v != [0, 0]}
    again.close()


# --- the threads analyzer's compact rows ---------------------------------------------------------


def test_threads_windows_over_every_report_are_the_whole_run() -> None:
    """Rows kept compact and expanded for a window add up exactly as the running totals do."""
    rng = random.Random(5)
    a = ThreadsAnalyzer()
    cpu_seen = {1: 0.0, 2: 0.0}
    for k in range(50):
        kinds = {
            tid: {kind: rng.randint(0, 300) for kind in rng.sample(KINDS, rng.randint(1, len(KINDS)))}
            for tid in rng.sample([1, 2, 3], rng.randint(1, 3))
        }
        data: dict[str, Any] | None = None
        if k % 3:
            for tid in cpu_seen:
                cpu_seen[tid] += rng.random() * 0.5
            data = {"threads": [[tid, 0, c] for tid, c in cpu_seen.items()], "blocked_by": [[1, 2]] if k % 7 else []}
        samples = rng.choice([0, 100, 400])
        a.merge(ReportView(t=1000.0 + k, window_s=rng.random() * 2, samples=samples, data=data, kinds=kinds))
    assert a.table(0.0, 1e12) == a.table()
    assert a.table(1020.0, 1030.0) != a.table()  # a part is not the whole


def test_the_native_samplers_ready_leaves_are_kinds_of_their_own() -> None:
    # flagged as waits too, for monitors from before these kinds: the new kinds win
    assert leaf_kind(LOC_BLOCKING | LOC_WAIT | LOC_GIL) == "gil"
    assert leaf_kind(LOC_BLOCKING | LOC_WAIT | LOC_RUNQ) == "runq"
    assert leaf_kind(LOC_BLOCKING | LOC_WAIT) == "wait"
    assert leaf_kind(0) == "run"
