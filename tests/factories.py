"""Builders shared by the test modules: synthetic reports and sessions, real targets and monitors,
free ports. Test modules import from here, never from one another."""

from __future__ import annotations

import asyncio
import gzip
import json
import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import strategies as st

from dyper.agent import core, protocol
from dyper.agent.protocol import LOC_BLOCKING, LOC_IO
from dyper.monitor.commands.run import child_env
from dyper.monitor.pprof import profile_pb2
from dyper.monitor.server import Monitor
from dyper.monitor.session import FrameTable, Session

# --- Synthetic reports and sessions (one process, app.py and json) --------------------------------

HELLO = {
    "agent": "h:1:x",
    "host": "h",
    "pid": 1,
    "start_time": 100.0,
    "argv": ["python", "app.py"],
    "python": "3.11.7",
    "budget": 0.01,
    "paths": {"stdlib": "/usr/lib/python3.11", "purelib": "/site"},
}


def make_report(stacks, *, seq=0, with_tables=True, t=1000.0, samples=None):
    """stacks: list of (tid, count, [loc ids leaf first]). Locations:
    0 main (app.py:1), 1 f (app.py:10), 2 g (app.py:20), 3 sleep-call in main (blocking),
    4 json.dumps (stdlib), 5 recursive r (app.py:30)."""
    strings = [
        [0, "/app/app.py"],
        [1, "main"],
        [2, "f"],
        [3, "g"],
        [4, "/usr/lib/python3.11/json/__init__.py"],
        [5, "dumps"],
        [6, "r"],
    ]
    locs = [
        [0, 0, 1, 1, 2, 0],
        [1, 0, 2, 10, 11, 0],
        [2, 0, 3, 20, 21, 0],
        [3, 0, 1, 1, 3, LOC_BLOCKING],
        [4, 4, 5, 200, 231, 0],
        [5, 0, 6, 30, 31, 0],
    ]
    return {
        "agent": "h:1:x",
        "seq": seq,
        "epoch": 0,
        "t": t,
        "window_s": 1.0,
        "strings": strings if with_tables else [],
        "locs": locs if with_tables else [],
        "stacks": [[tid, n, s] for tid, n, s in stacks],
        "samples": samples if samples is not None else sum(n for _, n, _ in stacks),
        "threads": [[7, "MainThread"], [8, "worker"]],
        "spent_s": 0.01,
        "elapsed_s": 1.0,
        "budget": 0.01,
    }


def session_with(*reports):
    s = Session(("h", 1, 100.0), HELLO, FrameTable())
    state = s.add_agent(HELLO)
    for r in reports:
        s.ingest(state, r)
    return s


# --- Services: a master and its workers -----------------------------------------------------------


def hello(pid: int, ppid: int, start: float, host: str = "h", **extra: Any) -> dict[str, Any]:
    return {
        "agent": f"{host}:{pid}:a",
        "host": host,
        "pid": pid,
        "ppid": ppid,
        "start_time": start,
        "argv": ["/usr/bin/python3.12", "/srv/bin/gunicorn", "-w", "2", "app:app"],
        "python": "3.12.1",
        "budget": 0.01,
        **extra,
    }


def report(agent: str, work: str, count: int, *, t: float, seq: int) -> dict[str, Any]:
    """One report whose only stack is main -> ``work`` (app.py), ``count`` samples."""
    return {
        "agent": agent,
        "seq": seq,
        "epoch": 0,
        "t": t,
        "window_s": 1.0,
        "strings": [[0, "/srv/app.py"], [1, "main"], [2, work]],
        "locs": [[0, 0, 1, 1, 2, 0], [1, 0, 2, 10, 11, 0]],
        "stacks": [[7, count, [1, 0]]],
        "samples": count,
        "threads": [[7, "MainThread"]],
        "spent_s": 0.01 * seq,
        "elapsed_s": 1.0 * seq,
        "budget": 0.01,
    }


# --- Exports: a profile to render and what each format must give back -----------------------------

STACKS = [(7, 30, [1, 0]), (7, 10, [2, 1, 0]), (8, 60, [3]), (7, 5, [4, 1, 0]), (8, 7, [5, 5, 5, 0])]


def expected(profile, metric, libraries=False, threads=True):
    """(thread, (name, file, line) root first) -> samples, straight from the profile."""
    out = Counter()
    for s, frames in profile.charged_stacks(libraries):
        n = s.cpu if metric == "cpu" else s.wall
        if n and frames:
            key = tuple((profile.frames[i].name, profile.frames[i].file, profile.frames[i].line) for i in frames)
            out[(s.thread if threads else None, key)] += n
    return out


def check_speedscope_schema(doc):
    """The fields speedscope's FileFormat.File requires, with their types (src/lib/file-format-spec.ts)."""
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    assert isinstance(doc["shared"], dict) and isinstance(doc["shared"]["frames"], list)
    for f in doc["shared"]["frames"]:
        assert isinstance(f["name"], str) and f["name"]
        assert set(f) <= {"name", "file", "line", "col"}
        assert isinstance(f.get("file", ""), str) and isinstance(f.get("line", 0), int)
    assert isinstance(doc["profiles"], list) and doc["profiles"]
    for optional, kind in (("name", str), ("activeProfileIndex", int), ("exporter", str)):
        assert isinstance(doc.get(optional, kind()), kind)
    assert 0 <= doc.get("activeProfileIndex", 0) < len(doc["profiles"])
    units = {"none", "nanoseconds", "microseconds", "milliseconds", "seconds", "bytes"}
    for p in doc["profiles"]:
        assert p["type"] == "sampled" and isinstance(p["name"], str) and p["unit"] in units
        assert isinstance(p["startValue"], int | float) and isinstance(p["endValue"], int | float)
        assert p["endValue"] >= p["startValue"]
        assert isinstance(p["samples"], list) and isinstance(p["weights"], list)
        assert len(p["samples"]) == len(p["weights"])
        for stack, w in zip(p["samples"], p["weights"], strict=True):
            assert all(isinstance(i, int) and 0 <= i < len(doc["shared"]["frames"]) for i in stack)
            assert isinstance(w, int | float) and w >= 0
        assert p["endValue"] - p["startValue"] == sum(p["weights"])


def read_pprof(data):
    prof = profile_pb2.Profile.FromString(gzip.decompress(data))
    st = prof.string_table
    assert st[0] == ""
    functions = {f.id: f for f in prof.function}
    locations = {loc.id: loc for loc in prof.location}
    assert 0 not in functions and 0 not in locations
    assert len(functions) == len(prof.function) and len(locations) == len(prof.location)
    types = [(st[t.type], st[t.unit]) for t in prof.sample_type]
    samples = []
    for s in prof.sample:
        assert len(s.value) == len(types)
        labels = {st[lb.key]: (st[lb.str] if lb.str else lb.num) for lb in s.label}
        stack = []
        for lid in reversed(s.location_id):  # the leaf is first in pprof
            (line,) = locations[lid].line
            fn = functions[line.function_id]
            stack.append((st[fn.system_name], st[fn.filename], line.line))
        samples.append((labels, tuple(stack), dict(zip((t for t, _ in types), s.value, strict=True))))
    return prof, types, samples


def html_data(text):
    m = re.search(r'<script id="dyper-data" type="application/json">(.*?)</script>', text, re.S)
    return json.loads(m[1])


# --- Report bodies for fuzzing the monitor's intake, valid and broken -----------------------------

AGENT = "fuzz-host:4242:0123456789ab"


texts = st.text(max_size=40)


finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False, allow_infinity=False)


flags = st.sampled_from(
    [
        0,
        protocol.LOC_AGENT,
        protocol.LOC_BLOCKING | protocol.LOC_IO,
        protocol.LOC_BLOCKING | protocol.LOC_LOCK,
        protocol.LOC_BLOCKING | protocol.LOC_SLEEP,
        protocol.LOC_BLOCKING | protocol.LOC_WAIT,
    ]
)


@st.composite
def report_bodies(draw: st.DrawFn, agent: str = AGENT) -> dict[str, Any]:
    n_strings = draw(st.integers(1, 12))
    strings = [[i, t] for i, t in enumerate(draw(st.lists(texts, min_size=n_strings, max_size=n_strings)))]
    sid = st.integers(0, n_strings - 1)
    n_locs = draw(st.integers(1, 20))
    line = st.integers(-1, 100_000)
    rows = draw(st.lists(st.tuples(sid, sid, line, line, flags), min_size=n_locs, max_size=n_locs))
    locs = [[i, *row] for i, row in enumerate(rows)]
    tid = st.integers(1, 2**47)
    stacks = draw(
        st.lists(
            st.tuples(tid, st.integers(1, 500), st.lists(st.integers(0, n_locs - 1), max_size=30)).map(list),
            max_size=20,
        )
    )
    costs = {k: draw(finite) / 1e6 for k in ("sample", "report", "detail", "wake")}
    cost = st.floats(min_value=0.0, max_value=1e4, allow_nan=False)
    proflet = st.fixed_dictionaries(
        {"ovhd_ms": cost, "slow": cost, "itvl_ms": cost, "prty": st.floats(0.0, 1.0), "allows": st.lists(texts)}
    )
    return {
        "agent": agent,
        "seq": draw(st.integers(0, 10**6)),
        "epoch": 0,
        "t": 1.7e9 + draw(st.floats(0, 1e6)),
        "window_s": draw(st.floats(0.0, 60.0)),
        "strings": strings,
        "locs": locs,
        "stacks": stacks,
        "samples": draw(st.integers(0, 10_000)),
        "threads": [[s[0], draw(texts)] for s in stacks[:3]],
        "costs": costs,
        "unit_costs": {"sample": 1e-4, "report": 2e-3},
        "spent_s": draw(finite),
        "startup_s": draw(finite),
        "elapsed_s": draw(finite),
        "budget": draw(st.floats(protocol.MIN_BUDGET, protocol.MAX_BUDGET)),
        "delays": {"sample": 0.01, "report": 1.0, "sample_lag": 0.0},
        "dropped": {"reports": 0, "samples": draw(st.integers(0, 100)), "bad_messages": 0},
        "errors": draw(st.lists(texts, max_size=2)),
        "mode": draw(st.sampled_from(["local", "monitor"])),
        "proflets": draw(st.dictionaries(st.sampled_from(["cpu", "threads", "io"]), proflet, max_size=2)),
        "details": [],
    }


#: Values no field of a monitor-bound message takes (bytes, NaN, infinities, out-of-range integers).
never_valid = st.sampled_from(
    [b"\x00bytes", math.nan, math.inf, -math.inf, 2**64 - 1, -(2**63), 2**63, msgpack.ExtType(5, b"x")]
)


def nested(depth: int) -> Any:
    v: Any = []
    for _ in range(depth):
        v = [v]
    return v


#: Field -> values that are wrong for it (types, ranges), beyond never_valid.
WRONG: dict[str, list[Any]] = {
    "agent": [1, None, [], {}, True],
    "seq": [-1, "1", 1.5, True, None],
    "epoch": [-1, "0", 0.5],
    "t": [-1.0, "now", 1e300, None],
    "window_s": [-0.5, "1", None],
    "samples": [-1, 2**32, 1.0],
    "strings": [[[-1, "x"]], [[0, b"x"]], [[0]], [["0", "x"]], "x", [[0, "x", 1]]],
    "locs": [[[0, 0, 0, 1, 1]], [[-1, 0, 0, 1, 1, 0]], [[0, 0, 0, 2**31, 1, 0]], [[0, 0, 0, 1, 1, -1]], [[0, "f"]]],
    "stacks": [[[1, -3, [0]]], [[1, 2**32, [0]]], [[1, 1, [-1]]], [[1, 1, ["0"]]], [[1, 1]], [[2**64 - 1, 1, [0]]]],
    "threads": [[[1]], [["t", "x"]]],
    "costs": [{"sample": "x"}, {"sample": None}, [1.0], {"sample": math.nan}],
    "unit_costs": [{"sample": -math.inf}],
    "budget": [0.0, -0.01, 1.5, "1%"],
    "delays": [{"sample": "fast"}],
    "dropped": [{"samples": -1}, {"samples": 1.5}],
    "errors": [[1], [None]],
    "mode": [1],
    "proflets": [
        {"cpu": {"ovhd_ms": -1.0}},
        {"cpu": {"slow": -1.0}},
        {"cpu": {"prty": math.nan}},
        {"cpu": {"itvl_ms": 1e300}},
        {"cpu": {"allows": [1]}},
        {"cpu": "off"},
        {"cpu": {"off": 3}},
    ],
    "details": [[{"proflet": 1}], [{}], ["x"], [{"proflet": "cpu", "x": nested(40)}]],
    "data": [{"cpu": []}, {"cpu": {"x": nested(40)}}, {"cpu": {b"k": 1}}],
}


@st.composite
def broken_reports(draw: st.DrawFn) -> dict[str, Any]:
    """A report with one field made wrong: a type, a range, a non-finite number, too deep."""
    body = draw(report_bodies())
    field = draw(st.sampled_from(sorted(WRONG)))
    body[field] = draw(st.sampled_from(WRONG[field]) | never_valid)
    return body


# --- The io proflet's analyzer on a session: a reader, a spinner and a buffered reader ------------

IO_HELLO = {"agent": "h:1:x", "host": "h", "pid": 1, "budget": 0.01, "paths": {"stdlib": "/usr/lib/python3.11"}}


IO_APP, IO_SOCKET_PY = "/app/app.py", "/usr/lib/python3.11/socket.py"


def io_report(t: float, stacks: list[tuple[int, int, list[int]]], data: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """Locations: 0 reader's recv call (app.py:12, blocking I/O), 1 reader's loop (app.py:11),
    2 main's line (app.py:3), 3 SocketIO.readinto's recv_into call (socket.py:700, blocking I/O),
    4 buffered's read call (app.py:21)."""
    strings = [[0, IO_APP], [1, "reader"], [2, "main"], [3, IO_SOCKET_PY], [4, "SocketIO.readinto"], [5, "buffered"]]
    io_flags = LOC_BLOCKING | LOC_IO
    locs = [[0, 0, 1, 10, 12, io_flags], [1, 0, 1, 10, 11, 0], [2, 0, 2, 1, 3, 0], [3, 3, 4, 690, 700, io_flags]]
    locs.append([4, 0, 5, 20, 21, 0])
    return {
        "seq": int(t),
        "epoch": 0,
        "t": t,
        "window_s": 1.0,
        "strings": strings,
        "locs": locs,
        "stacks": [[tid, n, s] for tid, n, s in stacks],
        "samples": 100,
        "threads": [[7, "reader"], [8, "spinner"], [9, "buffered"]],
        "data": {"io": data},
        "elapsed_s": t - 1000.0,
        **extra,
    }


def io_session() -> Session:
    s = Session(("h", 1, 100.0), IO_HELLO, FrameTable())
    state = s.add_agent(IO_HELLO)
    calls = [[IO_APP, "reader", 10, 12, "recv", 1], [IO_SOCKET_PY, "SocketIO.readinto", 690, 700, "recv_into", 1]]
    stacks = [(7, 90, [0]), (7, 10, [1]), (8, 100, [2]), (9, 100, [3, 4])]
    counters = [1000, 2000, 10, 20, 0, 0]
    s.ingest(state, io_report(1001.0, stacks, {"calls": calls, "io": counters, "since": [5.0, 0]}))
    burst = {
        "proflet": "io",
        "length_s": 2.0,
        "fixed_s": 0.001,
        "slowdown_s": 0.0002,
        "counted": True,
        "call_cost_s": 1e-6,
        "sites": [
            [IO_APP, "reader", 10, 12, "socket.recv", 100, 0.5, 100],
            [IO_APP, "buffered", 20, 21, "x", 40, 0.8, 40],
        ],
        "threads": [[7, 4000, 0, 4, 0, 0, 0]],
        "threads_s": 2.0,
    }
    counters2 = [1000 + 3000, 2000 + 500, 10 + 3, 20 + 1, 0, 4096]
    s.ingest(state, io_report(1002.0, stacks, {"io": counters2, "since": [5.0, 0]}, details=[burst]))
    return s


# --- Real processes, real monitors, free ports ----------------------------------------------------

TARGETS = Path(__file__).parent / "integration" / "targets"


REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dyper(
    *args: str, timeout: float = 60, check: bool = False, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, as a user would (``env``: added to the environment)."""
    proc = subprocess.run(
        [sys.executable, "-m", "dyper", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **env} if env else None,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"dyper {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def start_target(*args: str, python: str = sys.executable) -> subprocess.Popen[str]:
    proc = subprocess.Popen([python, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"target did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    return proc


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


class StandingMonitor:
    """``dyper monitor`` in a subprocess, keeping its history in ``history`` (never the user's own file)."""

    def __init__(self, port: int, history: Path | None = None, *args: str) -> None:
        import tempfile

        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.proc: subprocess.Popen[str] | None = None
        self._tmp = None if history is not None else tempfile.mkdtemp(prefix="dyper-history-")
        self.history = history if history is not None else Path(self._tmp or "") / "history.sqlite3"
        self.args = args

    def start(self) -> None:
        import tempfile

        # Its output is kept so that a failing test can show why the monitor went away.
        self.log = tempfile.NamedTemporaryFile(prefix="dyper-monitor-", suffix=".log", delete=False)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dyper",
                "monitor",
                "--listen",
                self.endpoint,
                "--history",
                str(self.history),
                *self.args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
        self.log.close()  # the monitor has its own descriptor
        from dyper.monitor.client import wait_for_monitor

        wait_for_monitor(self.endpoint, 15)

    def call(self, op: str, **args: object) -> object:
        from dyper.monitor.client import MonitorClient

        with MonitorClient(self.endpoint, timeout=3) as client:
            return client.call(op, **args)

    def session(self, pid: int) -> dict[str, object] | None:
        sessions = self.call("sessions")
        assert isinstance(sessions, list)
        found = [s for s in sessions if s["pid"] == pid]
        return found[-1] if found else None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def cleanup(self) -> None:
        import shutil

        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace") if self.proc is not None else ""


def wait_for(predicate, timeout: float = 15.0, interval: float = 0.1, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(interval)


def split_shares(profile_json: dict[str, object]) -> tuple[float, float]:
    """(heavy %, light %) of heavy+light total cpu samples."""
    from dyper.monitor.model.profile import Profile

    p = Profile.from_json(profile_json)
    rows = {r["name"]: r["total"] for r in p.functions("cpu")}
    heavy, light = rows.get("heavy", 0), rows.get("light", 0)
    assert heavy + light > 100, f"too few samples: {rows}"
    return 100.0 * heavy / (heavy + light), 100.0 * light / (heavy + light)


def split_tolerance(profile_json: dict[str, object], truth_pct: float) -> float:
    """How far the sampled heavy share may be from the truth: 5 points, or 3.5
    standard errors of a share estimated from this many samples if that is more
    (a few hundred samples put one standard error at 2 to 2.5 points)."""
    from dyper.monitor.model.profile import Profile

    p = Profile.from_json(profile_json)
    rows = {r["name"]: r["total"] for r in p.functions("cpu")}
    n = rows.get("heavy", 0) + rows.get("light", 0)
    q = truth_pct / 100.0
    return max(5.0, 3.5 * 100.0 * math.sqrt(q * (1.0 - q) / max(n, 1)))


def truth_share(heartbeat: Path) -> float:
    """The target's own measure of heavy's share of heavy+light, in percent."""
    _, heavy_s, light_s = heartbeat.read_text().split()
    return 100.0 * float(heavy_s) / (float(heavy_s) + float(light_s))


def threads_and_fds(pid: int) -> tuple[int, int]:
    return len(os.listdir(f"/proc/{pid}/task")), len(os.listdir(f"/proc/{pid}/fd"))


def threads_and_fds_named(pid: int) -> str:
    """The threads (by name) and open files of ``pid``: what a failed threads_and_fds check should show."""
    names = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task")):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            names.append(f"{tid} (gone)")
    fds = []
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            fds.append(f"{fd}->{os.readlink(f'/proc/{pid}/fd/{fd}')}")
        except OSError:
            fds.append(f"{fd} (gone)")
    return f"threads {names}, fds {fds}"


def load_json(path: Path) -> dict[str, object]:
    return json.loads(path.read_text())


class MonitorThread:
    """A real monitor on its own event loop in a background thread."""

    def __init__(self) -> None:
        self.monitor = Monitor("tcp://127.0.0.1:0")
        self.endpoint = self.monitor.bind()
        self.loop = asyncio.new_event_loop()
        self.stop_event: asyncio.Event | None = None
        self.thread = threading.Thread(target=self._run, name="test-monitor", daemon=True)
        self.thread.start()
        wait_for(lambda: self.stop_event is not None, what="monitor loop")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def main() -> None:
            self.stop_event = asyncio.Event()
            await self.monitor.serve(self.stop_event)

        self.loop.run_until_complete(main())

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_event.set)
        self.thread.join(5)
        self.monitor.close()
        self.loop.close()


# --- Targets that take commands on stdin ----------------------------------------------------------


def start_commanded(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A target that takes commands on stdin and answers on stdout."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", f"target did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}"
    return proc


def ask(proc: subprocess.Popen[str], command: str) -> dict[str, Any]:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(command + "\n")
    proc.stdin.flush()
    answer: dict[str, Any] = json.loads(proc.stdout.readline())
    return answer


# --- A target with an agent reporting to a monitor ------------------------------------------------


def start_with_agent(endpoint, *args, budget=0.05):
    env = child_env(endpoint, budget)
    proc = subprocess.Popen([sys.executable, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


# --- The C ticker ------------------------------------------------------------------------------------


@contextmanager
def running_ticker() -> Iterator[tuple[int, int]]:
    """The C ticker started, writing to a pipe: (the pipe's read end, the ident of the agent thread)."""
    fast: Any = core._fast
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    # The "agent" thread: a thread that exists but is never sampled.
    agent_ident = threading.get_ident() + 1
    fast.ticker_start(agent_ident, w)
    try:
        yield r, agent_ident
    finally:
        fast.ticker_stop()
        os.close(r)
        os.close(w)


def spin_here(seconds: float) -> int:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for i in range(200):
            n += i * i
    return n


def ticker_threads() -> int:
    """How many dyper-ticker threads this process has."""
    n = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            if (task / "comm").read_text().strip() == "dyper-ticker":
                n += 1
        except OSError:
            pass
    return n
