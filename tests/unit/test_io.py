"""The io proflet's halves on their own: the routine files, naming a stack's I/O, the
collector's report hook and detailing burst on real code, and the analyzer on a real
session. Pipes stand in for sockets here (unit tests open none); the planted socket
behaviour is in tests/integration/test_io.py.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import CodeType
from typing import Any

import pytest

from dyper.agent.proflet import DetailContext, ReportContext
from dyper.agent.protocol import LOC_BLOCKING, LOC_IO
from dyper.agent.tables import _instructions, callee_name
from dyper.monitor.model.libraries import library_roots
from dyper.monitor.session import FrameTable, Session
from dyper.proflets.base import ReportView
from dyper.proflets.io import common as iop
from dyper.proflets.io.analyzer import IoAnalyzer
from dyper.proflets.io.collector import IoCollector, read_io
from dyper.proflets.io.common import Hit, classify, dotted_name, load_routines
from tests.factories import IO_HELLO, io_session

ROOTS = library_roots({"stdlib": "/usr/lib/python3.11", "purelib": "/usr/lib/python3.11/site-packages"})


# --- the routine files ----------------------------------------------------------------


def test_the_shipped_file_names_calls_and_functions_by_kind() -> None:
    r = load_routines()
    assert r.call("recv_into") == ("socket.recv_into", "socket")
    assert r.call("read") == ("file.read", "file")
    assert r.call("poll") == ("select.poll", "select")
    assert r.call("sleep") is None and r.call("acquire") is None  # waiting, not I/O
    assert r.function("selectors.EpollSelector.select", True) == ("selectors.EpollSelector.select", "select")
    assert r.function("ssl.SSLSocket.read", True) == ("ssl.SSLSocket.read", "ssl")
    assert r.function("http.client.HTTPResponse.readinto", True) == ("http.client.HTTPResponse.readinto", "http")
    # a wait for a child process is a wait, as the threads table says (its pipes' select and read are I/O)
    assert r.function("subprocess.Popen.communicate", True) is None
    assert r.function("json.dumps", True) is None


def test_an_application_file_adds_its_own_routines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = tmp_path / "app.toml"
    app.write_text('[rpc]\nfunctions = ["db.Client.query"]\n\n[socket]\ncalls = ["recv_exactly"]\n')
    r = load_routines([app])
    # The application's module is matched by the end of its dotted path; a library's must match whole.
    assert r.function("srv.myapp.db.Client.query", False) == ("db.Client.query", "rpc")
    assert r.function("myapp.db.Client.query", True) is None
    assert r.function("srv.myapp.xdb.Client.query", False) is None
    assert r.call("recv_exactly") == ("socket.recv_exactly", "socket")  # added to a shipped kind
    assert r.call("recv") == ("socket.recv", "socket")  # which keeps its own
    monkeypatch.setenv(iop.ENV, f"{app}{os.pathsep}")
    assert iop.routines().call("recv_exactly") == ("socket.recv_exactly", "socket")
    monkeypatch.delenv(iop.ENV)
    assert iop.routines().call("recv_exactly") is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('[rpc]\nfunctions = "db.query"\n', "functions must be a list"),
        ('[rpc]\nfunction = ["db.query"]\n', "unknown keys"),
        ('rpc = ["db.query"]\n', "must be a table"),
        ("[rpc\n", "app.toml"),
    ],
)
def test_a_bad_routine_file_says_where_and_what(tmp_path: Path, text: str, says: str) -> None:
    app = tmp_path / "app.toml"
    app.write_text(text)
    with pytest.raises(ValueError, match=says) as info:
        load_routines([app])
    assert str(app) in str(info.value)


def test_dotted_names_of_library_and_application_functions() -> None:
    assert dotted_name("/usr/lib/python3.11/http/client.py", "HTTPResponse.read", ROOTS) == (
        "http.client.HTTPResponse.read",
        True,
    )
    assert dotted_name("/usr/lib/python3.11/site-packages/urllib3/__init__.py", "f", ROOTS) == ("urllib3.f", True)
    assert dotted_name("<frozen os>", "read", ROOTS) == ("os.read", True)
    assert dotted_name("/srv/myapp/db.py", "Client.query", ROOTS) == ("srv.myapp.db.Client.query", False)


# --- naming a stack's I/O -------------------------------------------------------------

RECV = ("socket.recv", "socket")
HTTP = ("http.client.HTTPResponse.read", "http")
READINTO = ("socket.SocketIO.readinto", "socket")


def test_a_c_routine_called_by_application_code_is_charged_to_that_code() -> None:
    hit = classify([None, None], RECV, [False, False])
    assert hit == Hit("socket.recv", "socket", at=1, caller=1, site=1, c_call=True)


def test_a_c_routine_called_in_a_library_is_charged_to_the_application_frame_above() -> None:
    hit = classify([None, None, None], RECV, [False, True, True])
    assert hit is not None and (hit.caller, hit.site) == (0, 2)


def test_the_outermost_listed_python_routine_names_the_io() -> None:
    # app -> http.client read -> socket.SocketIO.readinto, whose leaf calls recv_into
    hit = classify([None, HTTP, READINTO], ("socket.recv_into", "socket"), [False, True, True])
    assert hit == Hit("http.client.HTTPResponse.read", "http", at=1, caller=0, site=0, c_call=False)


def test_without_application_frames_the_nearest_caller_is_charged() -> None:
    hit = classify([None, None, READINTO], None, [True, True, True])
    assert hit is not None and (hit.caller, hit.site) == (1, 1)
    started_in_it = classify([READINTO], None, [True])
    assert started_in_it is not None and (started_in_it.caller, started_in_it.site) == (0, None)


def test_a_stack_with_no_listed_routine_is_not_io() -> None:
    assert classify([None, None], None, [False, False]) is None


# --- /proc counters ---------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_io_counters_of_the_process_and_of_a_thread_see_a_pipe_write() -> None:
    mine = f"/proc/self/task/{threading.get_native_id()}/io"
    before, before_thread = read_io("/proc/self/io"), read_io(mine)
    assert before is not None and before_thread is not None and len(before) == len(iop.IO_FIELDS)
    r, w = os.pipe()
    try:
        os.write(w, b"x" * 5000)
        os.read(r, 5000)
    finally:
        os.close(r)
        os.close(w)
    after, after_thread = read_io("/proc/self/io"), read_io(mine)
    assert after is not None and after_thread is not None
    for b, a in ((before, after), (before_thread, after_thread)):
        assert a[1] - b[1] >= 5000 and a[0] - b[0] >= 5000  # wchar, rchar
    assert read_io("/proc/self/no-such-file") is None


# --- the collector on real code ----------------------------------------------------------


def pipe_reader(fd: int, n: int) -> int:
    """The application routine: n reads of one byte, and a call that is no I/O."""
    got = 0
    for _ in range(n):
        got += len(os.read(fd, 1))
    return got


def _call_at(code: CodeType, name: str) -> int:
    offsets, _ = _instructions(code)
    return next(o for o in offsets if callee_name(code, o) == name)


class Locations:
    """A stand-in for the agent's tables: location ids for (code, offset) pairs, with their flags."""

    def __init__(self, *where: tuple[CodeType, int, int]) -> None:
        self.where = [(code, offset) for code, offset, _ in where]
        self.flags = [flags for _, _, flags in where]

    def context(self, counts: dict[tuple[int, tuple[int, ...]], int], epoch: int = 0) -> ReportContext:
        return ReportContext(
            window_s=1.0,
            counts=counts,
            samples=sum(counts.values()),
            activity=[],
            loc_flags=lambda loc: self.flags[loc],
            agent_ident=-1,
            code_at=lambda loc: self.where[loc] if 0 <= loc < len(self.where) else None,
            epoch=epoch,
        )


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def _collector() -> IoCollector:
    """A collector built as the agent builds it: on its own thread, which it leaves out of its figures."""
    built: list[IoCollector] = []
    t = threading.Thread(target=lambda: built.append(IoCollector()), name="dyper-test")
    t.start()
    t.join()
    return built[0]


def _hooked_collector() -> tuple[IoCollector, dict[str, Any]]:
    """A collector whose report hook saw this thread in pipe_reader's os.read, called from here."""
    code = pipe_reader.__code__
    here = _hooked_collector.__code__
    locs = Locations((code, _call_at(code, "read"), LOC_BLOCKING | LOC_IO), (here, 0, 0))
    collector = _collector()
    collector.explicit = True  # yappi on 3.11 is opt-in
    out = collector.report(locs.context({(threading.get_ident(), (0, 1)): 20}))
    assert out is not None
    return collector, out


def test_the_report_hook_names_each_io_leaf_and_sends_the_process_counters() -> None:
    collector, out = _hooked_collector()
    code = pipe_reader.__code__
    line = next(line for start, end, line in code.co_lines() if start <= _call_at(code, "read") < end)
    assert out["calls"] == [[code.co_filename, "pipe_reader", code.co_firstlineno, line, "read", 1]]
    if sys.platform.startswith("linux"):
        assert len(out["io"]) == len(iop.IO_FIELDS) and len(out["since"]) == 2
    collector.close()


def test_a_burst_counts_the_calls_at_the_sites_only_and_times_them(pipe: tuple[int, int]) -> None:
    r, w = pipe
    collector, _ = _hooked_collector()
    os.write(w, b"x" * 300)
    collector.start_detail(DetailContext([], 1.0))
    assert pipe_reader(r, 300) == 300  # 300 reads, and 300 calls of len() that are no site
    result = collector.stop_detail()
    [site] = result["sites"]
    assert site[1] == "pipe_reader" and site[4] == "file.read"
    assert site[5] == 300 and site[7] == 300  # calls, and calls timed
    assert 0 < site[6] < 5.0  # seconds in the calls
    assert result["counted"] and result["slowdown_s"] > 0 and result["call_cost_s"] > 0
    me = [row for row in result["threads"] if row[0] == threading.get_ident()]
    if sys.platform.startswith("linux"):
        assert me and me[0][1 + iop.IO_FIELDS.index("rchar")] >= 300
    collector.close()


def test_a_second_burst_counts_again_and_leaves_nothing_behind(pipe: tuple[int, int]) -> None:
    r, w = pipe
    collector, _ = _hooked_collector()
    for _ in range(2):
        os.write(w, b"x" * 50)
        collector.start_detail(DetailContext([], 1.0))
        pipe_reader(r, 50)
        assert collector.stop_detail()["sites"][0][5] == 50
    if sys.version_info >= (3, 12):
        assert all(sys.monitoring.get_tool(t) is None for t in (3, 4, 5))
    # closing in the middle of a burst removes the hooks too (conftest checks the tool ids and profilers)
    collector.start_detail(DetailContext([], 1.0))
    collector.close()


def test_a_new_epoch_forgets_the_locations(pipe: tuple[int, int]) -> None:
    collector, _ = _hooked_collector()
    assert collector._heat
    locs = Locations((_hooked_collector.__code__, 0, 0))
    collector.report(locs.context({(threading.get_ident(), (0,)): 5}, epoch=1))
    assert not collector._heat and not collector._sites
    collector.close()


def test_without_sites_a_burst_reads_the_counters_only() -> None:
    collector = _collector()
    collector.start_detail(DetailContext([], 1.0))
    result = collector.stop_detail()
    assert not result["counted"] and result["sites"] == [] and result["slowdown_s"] == 0
    collector.close()


# --- the analyzer on a real session ------------------------------------------------------


def test_the_analyzer_names_routines_callers_and_threads() -> None:
    s = io_session()
    analyzer = s.analyzers["io"]
    assert isinstance(analyzer, IoAnalyzer)
    result = analyzer.results()
    rows = {r["routine"]: r for r in result["routines"]}
    recv = rows["socket.recv"]
    assert recv["caller"] == "reader" and recv["caller_line"] == 12 and recv["threads"] == ["reader"]
    assert recv["pct"] == pytest.approx(100 * 180 / 600)  # of all the threads' samples
    assert recv["calls_per_s"] == pytest.approx(50.0) and recv["s_per_call"] == pytest.approx(0.005)
    assert recv["s_per_call_measured"]
    # a listed Python routine of the standard library, charged to the application line calling into it
    readinto = rows["socket.SocketIO.readinto"]
    assert readinto["caller"] == "buffered" and readinto["caller_line"] == 21 and readinto["kind"] == "socket"
    assert readinto["calls_per_s"] == pytest.approx(20.0) and readinto["s_per_call"] == pytest.approx(0.02)
    assert "socket.recv_into" not in rows  # the call it makes is part of it
    threads = {t["name"]: t for t in result["threads"]}
    assert threads["reader"]["io_pct"] == pytest.approx(90.0) and threads["reader"]["routine"] == "socket.recv"
    assert threads["reader"]["read_bytes_per_s"] == pytest.approx(2000.0)
    assert threads["spinner"]["io_pct"] == 0 and threads["spinner"]["routine"] is None
    assert result["io_pct"] == pytest.approx(100 * 380 / 600)
    # the process's counters: differences from the first report on, per second
    assert result["read_bytes_per_s"] == pytest.approx(3000.0) and result["write_bytes_per_s"] == pytest.approx(500.0)
    assert result["disk_write_bytes_per_s"] == pytest.approx(4096.0)
    assert result["detailing"]["bursts"] == 1 and result["detailing"]["call_cost_s"] == pytest.approx(1e-6)
    # a window: the last report alone
    last = analyzer.results(1001.5, None)
    assert last["samples"] == 300 and last["read_bytes_per_s"] == pytest.approx(3000.0)
    assert 0.5 < analyzer.status().problem < 0.7 and analyzer.status().confidence > 0.5
    assert 0.1 < (analyzer.priority() or 0) <= 1.0
    assert any("thread reader spends 90% of its time in I/O" in f for f in analyzer.findings())


def test_a_new_collector_starts_its_own_differences() -> None:
    s = io_session()
    analyzer = s.analyzers["io"]
    assert isinstance(analyzer, IoAnalyzer)
    view = ReportView(t=1003.0, window_s=1.0, samples=0, data={"io": [5, 5, 0, 0, 0, 0], "since": [9.0, 0]})
    analyzer.merge(view)  # lower counters from another agent: no negative rate, no new difference yet
    assert analyzer.results()["read_bytes_per_s"] == pytest.approx(3000.0)


def test_history_keeps_what_the_samples_cannot_give_back() -> None:
    s = io_session()
    kept = s.analyzers["io"].state()
    again = Session.restore(("h", 1, 100.0), IO_HELLO, FrameTable(), {"analyzers": {"io": kept}}, {})
    # the counts come back through history's own tables; here, the same frames and counts again
    again.frames = s.frames
    again.counts = s.counts
    again.samples = s.samples
    again.agents = s.agents
    again.threads = s.threads
    before, after = s.analyzers["io"].results(), again.analyzers["io"].results()
    assert after["routines"] == before["routines"]
    assert after["read_bytes_per_s"] == before["read_bytes_per_s"]
