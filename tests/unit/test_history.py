"""History in SQLite: what a restarted monitor keeps, windows across memory and disk, retention,
and a writer that never holds up the receive loop."""

import sqlite3
import time

import pytest

from dyper.agent import protocol
from dyper.monitor.history import History, HistoryError, Retention, parse_size
from dyper.monitor.model.profile import Profile
from dyper.monitor.server import Monitor
from dyper.monitor.session import WINDOW_RETENTION_S
from dyper.monitor.windows import WindowSpec
from tests.factories import HELLO, make_report, session_with

ID = b"h:1:x"


def feed(m, *reports):
    for r in reports:
        m.handle(ID, protocol.encode(protocol.REPORT, r))


#: the reports here are from 1970: keep them
KEEP = Retention(max_age_s=None, max_bytes=None)


def monitor_on(path, **kw):
    kw.setdefault("retention", KEEP)
    m = Monitor("tcp://127.0.0.1:0", history=History(path, **kw))
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    return m


def names(profile, metric="cpu"):
    return {r["name"]: r["self"] for r in profile.functions(metric) if r["self"]}


def ctl(m, op, **args):
    (reply,) = m.handle(b"cli", protocol.encode(protocol.CTL, {"id": 1, "op": op, "args": args}))
    _, body = protocol.decode(reply[1])
    assert body["ok"], body
    return body["result"]


def test_a_restarted_monitor_keeps_sessions_totals_and_windows(tmp_path):
    path = tmp_path / "h.sqlite3"
    m = monitor_on(path)
    feed(
        m,
        make_report([(7, 10, [1, 0])], seq=0, t=1000.0),
        make_report([(7, 5, [2, 1, 0]), (8, 3, [3])], seq=1, t=1010.0),
        make_report([(7, 2, [5, 0])], seq=2, t=1020.0),
    )
    before = Profile.from_json(ctl(m, "profile", pid=1))
    assert m.history is not None and m.history.flush()
    m.close()

    again = Monitor("tcp://127.0.0.1:0", history=History(path, KEEP))
    try:
        session = again.session_for(1)
        assert session is not None and not session.connected
        assert (session.samples, session.reports, session.first_report_t, session.last_report_t) == (
            20,
            3,
            1000.0,
            1020.0,
        )
        assert session.threads == {7: "MainThread", 8: "worker"}
        assert session.budget() == 0.01 and session.overhead() == pytest.approx(0.01 / 0.99)  # 0.01 s of 1 s
        (info,) = ctl(again, "sessions")
        assert info["pid"] == 1 and not info["connected"] and info["samples"] == 20

        whole = Profile.from_json(ctl(again, "profile", pid=1))
        assert names(whole) == names(before) == {"f": 10, "g": 5, "r": 2}
        assert names(whole, "wall") == {"f": 10, "g": 5, "r": 2, "main": 3}
        assert whole.process["samples"] == 20

        # windows come from disk now: memory holds nothing of the old run
        middle = again.window_profile(session, WindowSpec.between(1005.0, 1015.0))
        assert names(middle) == {"g": 5} and middle.process["window"]["reports"] == 1
        last = Profile.from_json(ctl(again, "profile", pid=1, window_s=15.0))  # after 1005: two reports
        assert names(last) == {"g": 5, "r": 2}
        first = again.window_profile(session, WindowSpec.parse(":+5"))  # up to 5 s after the first report
        assert names(first) == {"f": 10}
        timeline = ctl(again, "timeline", pid=1, bucket_s=10.0, window=WindowSpec().to_json())
        assert [b[1] for b in timeline["buckets"]] == [10, 8, 2]
    finally:
        again.close()


def test_a_session_goes_on_after_a_restart_and_nothing_is_counted_twice(tmp_path):
    path = tmp_path / "h.sqlite3"
    m = monitor_on(path)
    feed(m, make_report([(7, 10, [1, 0])], t=1000.0))
    m.close()  # closing commits what was queued

    m = monitor_on(path)  # the same process says hello again
    feed(m, make_report([(7, 4, [1, 0])], seq=1, t=1010.0))
    session = m.session_for(1)
    assert session.connected and session.samples == 14 and session.reports == 2
    assert names(m.window_profile(session, WindowSpec())) == {"f": 14}
    # a window over both runs: one report from disk, one from memory
    assert names(m.window_profile(session, WindowSpec.between(None, 2000.0))) == {"f": 14}
    m.close()

    m = Monitor("tcp://127.0.0.1:0", history=History(path, KEEP))
    try:
        assert names(m.window_profile(m.session_for(1), WindowSpec())) == {"f": 14}
        assert m.session_for(1).reports == 2
    finally:
        m.close()


def test_windows_older_than_memory_are_read_from_history(tmp_path):
    m = monitor_on(tmp_path / "h.sqlite3")
    try:
        step = WINDOW_RETENTION_S / 4
        # reports 1..8, the first ones long gone from memory by the end
        for i in range(8):
            feed(m, make_report([(7, 1 + i, [1 if i < 4 else 2, 0])], seq=i, t=1000.0 + i * step))
        session = m.session_for(1)
        assert session.oldest_in_memory > 1
        assert m.history.flush()
        old = m.window_profile(session, WindowSpec.between(None, 1000.0 + 3 * step))
        assert names(old) == {"f": 1 + 2 + 3 + 4} and old.process["window"]["reports"] == 4
        across = m.window_profile(session, WindowSpec.between(1000.0 + 2 * step, None))  # reports 4..8
        assert names(across) == {"f": 4, "g": 5 + 6 + 7 + 8}
        assert across.process["samples"] == 4 + 5 + 6 + 7 + 8
        # and the same over the wire, off the loop when the loop runs (here it does not: answered at once)
        spec = WindowSpec.parse(f"@{1000.0 + 2 * step}:")
        assert names(Profile.from_json(ctl(m, "profile", pid=1, window=spec.to_json()))) == names(across)
    finally:
        m.close()


def test_retention_by_age_drops_old_reports_and_quiet_sessions(tmp_path):
    path = tmp_path / "h.sqlite3"
    m = monitor_on(path, clock=lambda: 1000.0)  # the monitor's clock, as old as the agent's here
    feed(m, *(make_report([(7, 1, [1, 0])], seq=i, t=1000.0 + 10 * i) for i in range(10)))
    m.close()

    now = [1075.0]
    h = History(path, Retention(max_age_s=30.0, max_bytes=None), clock=lambda: now[0])
    try:
        assert h.enforce_retention() == {"reports": 5, "sessions": 0}  # t < 1045 goes
        assert h.slice(("h", 1, 100.0), None, None).reports == 5
        now[0] = 1200.0
        assert h.enforce_retention() == {"reports": 5, "sessions": 1}  # the session's last report is too old
        frames, sessions = h.load()
        assert sessions == [] and frames  # frames stay: they are shared and small
    finally:
        h.close()


def test_retention_by_size_drops_the_oldest_reports_first(tmp_path):
    path = tmp_path / "h.sqlite3"
    big = [(tid, 1, [1, 0]) for tid in range(1, 400)]  # 400 threads: a few KiB per report
    session = session_with(*(make_report(big, seq=i, t=1000.0 + i) for i in range(300)))  # no scheduling: quicker
    h = History(path, KEEP)
    h._frames = session.frames
    h._write([("report", (session.key, session.hello, w, session.snapshot())) for w in session.windows])
    h.close()
    size_before = path.stat().st_size
    assert size_before > 600_000

    h = History(path, Retention(max_age_s=None, max_bytes=300_000), clock=lambda: 1300.0)
    try:
        dropped = h.enforce_retention()
        assert dropped["reports"] > 100 and dropped["sessions"] == 0
        assert h._used_bytes(h._conn) <= 300_000
        kept = h.reports_meta(("h", 1, 100.0), None, None)
        assert kept and kept[-1][0] == 1299.0 and kept[0][0] > 1000.0  # the newest stay
        # the whole run's totals stay with the session
        _, (stored,) = h.load()
        assert sum(w for w, _ in stored.counts.values()) == 300 * 399
    finally:
        h.close()
    assert path.stat().st_size < size_before / 2  # freed pages went back to the file system


def test_a_second_monitor_on_the_same_file_and_a_foreign_file_are_refused(tmp_path):
    path = tmp_path / "h.sqlite3"
    first = History(path)
    try:
        with pytest.raises(HistoryError, match="in use by another dyper monitor"):
            History(path)
    finally:
        first.close()
    History(path).close()  # free again once closed

    other = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(HistoryError, match="not a dyper history"):
        History(other)


def test_a_stuck_writer_never_holds_up_the_receive_loop(tmp_path):
    path = tmp_path / "h.sqlite3"
    m = monitor_on(path)
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")  # holds the write lock: the writer waits on it
        began = time.monotonic()
        feed(m, *(make_report([(7, 1, [1, 0])], seq=i, t=1000.0 + i) for i in range(200)))
        took = time.monotonic() - began
        assert m.session_for(1).samples == 200
        assert took < 2.0, took  # ingest + a queue put each, no waiting on the disk
        time.sleep(0.6)  # the writer is now stuck on the lock
        feed(m, make_report([(7, 1, [2, 0])], seq=200, t=1200.0))
        assert m.session_for(1).samples == 201
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert m.history.flush(timeout=15)
    assert m.history.counters["dropped"] == 0
    assert len(m.history.reports_meta(("h", 1, 100.0), None, None)) == 201
    m.close()


def test_sizes_and_windows_parse():
    assert parse_size("1GiB") == 1 << 30 and parse_size("500MB") == 500_000_000 and parse_size("2g") == 2 << 30
    assert parse_size("4096") == 4096
    with pytest.raises(ValueError):
        parse_size("lots")
    assert WindowSpec.parse("-10m:").resolve(0.0, 5000.0) == (4400.0, None)
    assert WindowSpec.parse(":").whole
    assert WindowSpec.parse("+1h:+2h").resolve(1000.0, 99999.0) == (4600.0, 8200.0)
    assert WindowSpec.parse("@1700000000:@1700000060").resolve(None, None) == (1700000000.0, 1700000060.0)
    start, end = WindowSpec.parse("2024-05-01T10:00:2024-05-01T10:05:30").resolve(None, None)
    assert end - start == 330.0
    assert WindowSpec.parse("-90:-30").describe() == "from 90s before the latest report to 30s before the latest report"
    assert WindowSpec.last(60).describe() == "last 1m"
    assert WindowSpec.from_json(WindowSpec.parse("5:-5").to_json()) == WindowSpec.parse("5:-5")
    for bad in ("10", "a:b", "-5x:", "1:2:3"):
        with pytest.raises(ValueError):
            WindowSpec.parse(bad)
    with pytest.raises(ValueError):
        WindowSpec.from_json({"start": ["soon", 1]})


def test_totals_not_yet_folded_are_made_up_from_the_reports_on_load(tmp_path):
    """Killed between two folds of the totals (every 30 s), nothing is lost: loading adds the newer reports."""
    path = tmp_path / "h.sqlite3"
    m = Monitor("tcp://127.0.0.1:0")  # no history of its own: its reports are written by hand below
    m.handle(ID, protocol.encode(protocol.HELLO, HELLO))
    feed(m, make_report([(7, 10, [1, 0])], t=1000.0), make_report([(7, 4, [2, 1, 0])], seq=1, t=1010.0))
    session = m.session_for(1)
    h = History(path, KEEP)
    h._frames = m.frames
    h._write([("report", (session.key, session.hello, session.windows[0], session.snapshot()))])
    h._fold_totals()
    h._write([("report", (session.key, session.hello, session.windows[1], session.snapshot()))])
    h._conn.close()  # as if killed: the second report is not in the totals
    h._unlock()

    again = Monitor("tcp://127.0.0.1:0", history=History(path, KEEP))
    try:
        assert names(again.window_profile(again.session_for(1), WindowSpec())) == {"f": 10, "g": 4}
    finally:
        again.close()
