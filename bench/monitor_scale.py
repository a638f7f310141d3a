"""How many agents one monitor process sustains on one core (SPEC section 9: 200 reporting once a second).

    python bench/monitor_scale.py [--counts 25,50,100,200,300,400] [--seconds 30] [--json FILE]
                                  [--procs 2] [--no-history] [--profile FILE] [--capture FILE]

1. Record a real agent. bench/workloads/deep_service.py (about 1500
   functions, 30-frame call paths from a skewed population, 8 threads) runs
   for --capture-seconds under ``dyper run --monitor`` with the default
   proflets at --capture-budget (default 5%: at 1% a real agent samples too
   little in 20 s to see much of the population), against a real monitor
   (monitor.server.Monitor) in this process that keeps every frame it
   receives. That gives a real hello and real reports: string and location
   tables, stacks, costs, delays, proflet states and detailing bursts (the
   cpu proflet's, on 3.12+), as a default agent of --python sends them.
   --capture FILE reuses a recording (--save-capture FILE keeps one), so
   that runs on different monitors or Pythons replay the same agent.
2. Start ``dyper monitor`` (with a history file, as by default, unless
   --no-history) on a free loopback port, pinned to one CPU (--monitor-cpu).
3. Simulated agents, in --procs processes pinned to the other CPUs: real
   ZeroMQ DEALER sockets with the real agent's socket options, speaking the
   real protocol. Each sends the recorded hello (its own identity), then a
   report once a second at a random phase (the real agent reports every few
   seconds, as its budget allows: a simulated report holds one second's
   worth of its samples, sampling passes and costs). A report's stacks are a
   fresh draw from the recorded population, weighted by how often the real
   agent saw each stack, so trees grow and then saturate; its string and location
   tables go out incrementally, the first time a report refers to them, as
   the agent's do. Everything else (costs, delays, proflets, data) is a
   recorded report's. A ``detail`` request from the monitor puts a recorded
   burst into the next report. Stacks are drawn and encoded ahead of time;
   a send only packs the few fields that change.
4. Step the agent count up through --counts, holding each for --seconds.
   The first --settle seconds of a step (new agents connect and send their
   tables) are not measured.

Measured per step, over the rest of it:

* reports sent by the simulators and ingested by the monitor (its ``ping``
  counters), per second; reports the agents could not send (the monitor's
  queue to them was full: what a real agent drops);
* ingest latency: the monitor answers every report with a ``configure``
  after ingesting it, on the same connection and in order, so the time from
  a report's send to its answer is an upper bound of send-to-ingested;
* backlog: reports sent and not answered yet; its trend over the step;
* the monitor's CPU (% of its core; its main thread, which runs the receive
  loop, separately), how long its threads waited for the core while other
  processes had it (/proc schedstat: on a shared machine this is what the
  rates lose), and its CPU per ingested report, which changes far less with
  such noise: one core's capacity follows from it ("est. agents");
* the monitor's RSS; RSS per session is the slope of RSS over the session
  count at the ends of the steps, and RSS per report its slope over reports
  ingested within a step (reports are kept for "now" windows);
* live queries under load: ``ping`` round trips each second, and the
  latency of ``top`` (what ``dyper top PID --window 10`` asks) over the last
  10 s and over the whole run, for one simulated process;
* the simulators' own health: how late their sends are against schedule
  and their CPU. A step where they lag (p99 over 50 ms) is flagged, since
  then the monitor got less than the nominal load.

A step keeps up when ingested >= 97% of sent, no report was dropped, the
backlog (reports sent and not answered yet) grows by at most 2% of the send
rate (its trend over the step: it comes and goes with every batch), and the
p99 latency is under the 1 s report interval. A step where the monitor is
clearly behind (ingesting under 90%, backlog growing by over 10% of the send
rate, or median latency over 1 s) ends the run, since more agents only pile
more backlog and memory onto it (--keep-going goes on).

--profile FILE runs the monitor under cProfile and prints where its time
went: all its threads on 3.12+ (cProfile uses sys.monitoring there), the main
thread only on 3.11. The profiler slows the monitor two- to threefold: read
the shares, not the times.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import heapq
import json
import os
import platform
import queue
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import msgpack  # noqa: E402
import psutil  # noqa: E402
import zmq  # noqa: E402

from bench import overhead  # noqa: E402
from dyper.agent import protocol  # noqa: E402

DEEP_SERVICE = HERE / "workloads" / "deep_service.py"
REPORT_PERIOD_S = 1.0
#: A step keeps up when the monitor ingests at least this share of what was sent ...
KEEP_UP_SHARE = 0.97
#: ... and the simulators are on schedule (p99 of how late a send is, ms).
SIM_LAG_OK_MS = 50.0
#: Fields of a recorded report a simulated one carries over as they were.
RECORDED_FIELDS = (
    "unit_costs",
    "startup_s",
    "budget",
    "delays",
    "dropped",
    "errors",
    "mode",
    "proflets",
    "data",
)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or len(set(xs)) < 2:
        return None
    return statistics.linear_regression(xs, ys).slope


# ---------------------------------------------------------------------------------------------------------------
# 1. recording a real agent


def record_agent(python: str, seconds: float, budget: str, workdir: Path) -> dict[str, Any]:
    """Run deep_service.py under the real agent against a real monitor that keeps every frame."""
    from dyper.monitor.server import Monitor

    class Recorder(Monitor):
        def __init__(self) -> None:
            super().__init__("tcp://127.0.0.1:0")
            self.recorded: list[bytes] = []

        def handle(self, ident: bytes, data: bytes) -> list[tuple[bytes, bytes]]:
            self.recorded.append(data)
            return super().handle(ident, data)

    recorder = Recorder()
    endpoint = recorder.bind()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def serve() -> None:
        loop.run_until_complete(recorder.serve(stop))

    thread = threading.Thread(target=serve, name="bench-recorder", daemon=True)
    thread.start()
    cmd = [
        python,
        "-m",
        "dyper",
        "run",
        "--monitor",
        endpoint,
        "--budget",
        budget,
        "--",
        python,
        str(DEEP_SERVICE),
        "--dir",
        str(workdir / "deep_service"),
        "--seconds",
        f"{seconds:g}",
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=seconds + 120)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        recorder.close()
        loop.close()
    if out.returncode != 0:
        raise SystemExit(f"recording a real agent failed ({out.returncode}): {out.stderr.strip()[-500:]}")
    hellos: dict[str, dict[str, Any]] = {}
    reports: dict[str, list[dict[str, Any]]] = {}
    for data in recorder.recorded:
        try:
            kind, body = protocol.decode(data, protocol.MONITOR_ACCEPTS)
        except protocol.DecodeError:
            continue
        if kind == protocol.HELLO:
            hellos[body["agent"]] = body
        elif kind == protocol.REPORT:
            reports.setdefault(body["agent"], []).append(body)
    if not reports:
        raise SystemExit(f"the recorded agent sent no report: {out.stderr.strip()[-500:]}")
    agent_id = max(reports, key=lambda a: len(reports[a]))
    if agent_id not in hellos:
        raise SystemExit("the recorded agent sent no hello")
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()
    return {"python": version, "budget": budget, "hello": hellos[agent_id], "reports": reports[agent_id]}


# ---------------------------------------------------------------------------------------------------------------
# 2. the population the simulated agents draw from


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj, use_bin_type=True)
    return data


def _field(key: str, value: Any) -> bytes:
    return _pack(key) + _pack(value)


_ENVELOPE = b"\x94" + _pack(protocol.MAGIC) + _pack(protocol.PROTOCOL_VERSION)


def _map_header(n: int) -> bytes:
    packer = msgpack.Packer()
    header: bytes = packer.pack_map_header(n)
    return header


@dataclass
class Variant:
    """One report's stacks, thread names and sampling passes, drawn and encoded ahead of time."""

    encoded: bytes  # the "stacks", "threads" and "samples" fields
    locs: frozenset[int]
    distinct: int
    stack_samples: int


#: fields a Variant encodes
VARIANT_FIELDS = 3


class Population:
    """What the recorded agent sent, merged: tables, stacks with how often they were seen, report fields.

    The recorded agent reports every few seconds (its budget sets the delay);
    a simulated one reports every second, so its stack samples, passes and
    costs are the recorded rates times one second.
    """

    def __init__(self, recording: dict[str, Any], stack_samples: int | None = None) -> None:
        reports: list[dict[str, Any]] = recording["reports"]
        self.hello: dict[str, Any] = recording["hello"]
        self.strings: dict[int, str] = {}
        self.locs: dict[int, list[int]] = {}
        seen: Counter[tuple[int, tuple[int, ...]]] = Counter()
        self.thread_names: dict[int, str] = {}
        for r in reports:
            self.strings.update((sid, text) for sid, text in r["strings"])
            self.locs.update((row[0], row) for row in r["locs"])
            for tid, n, stack in r["stacks"]:
                seen[(tid, tuple(stack))] += n
            self.thread_names.update((tid, name) for tid, name in r.get("threads") or ())
        self.epoch = int(reports[-1]["epoch"])
        self.stacks = list(seen)
        self.cum_weights = _accumulate([seen[s] for s in self.stacks])
        # The first report is the agent's start (local plan, no calibrated proflets yet).
        steady = reports[1:] or reports
        seconds = sum(float(r["window_s"]) for r in steady) or 1.0
        self.stack_samples = stack_samples or round(
            sum(n for r in steady for _, n, _ in r["stacks"]) * REPORT_PERIOD_S / seconds
        )
        self.passes_per_stack_sample = sum(int(r["samples"]) for r in steady) / max(
            1, sum(n for r in steady for _, n, _ in r["stacks"])
        )
        self.recorded: list[bytes] = []
        self.recorded_n: list[int] = []
        for r in steady:
            kept = {k: r[k] for k in RECORDED_FIELDS if k in r}
            scale = REPORT_PERIOD_S / max(float(r["window_s"]), 1e-3)
            kept["costs"] = {k: v * scale for k, v in (r.get("costs") or {}).items()}
            self.recorded.append(b"".join(_field(k, v) for k, v in kept.items()))
            self.recorded_n.append(len(kept))
        last = reports[-1]
        self.spent_share = float(last.get("spent_s") or 0.0) / max(float(last.get("elapsed_s") or 1.0), 1e-9)
        self.details = [d for r in reports for d in r.get("details") or ()]
        self.recorded_reports = len(reports)
        self.recorded_window_s = seconds / len(steady)

    def stats(self, rng: random.Random) -> dict[str, Any]:
        functions = {(row[1], row[2], row[3]) for row in self.locs.values()}
        depths = [len(stack) for _, stack in self.stacks]
        variants = [self.variant(rng) for _ in range(20)]
        tables = _field("strings", [[k, v] for k, v in self.strings.items()]) + _field("locs", list(self.locs.values()))
        return {
            "functions": len(functions),
            "locations": len(self.locs),
            "strings": len(self.strings),
            "population_stacks": len(self.stacks),
            "mean_depth": statistics.fmean(depths) if depths else 0.0,
            "max_depth": max(depths, default=0),
            "threads": len(self.thread_names),
            "recorded_reports": self.recorded_reports,
            "recorded_report_interval_s": self.recorded_window_s,
            "detail_bursts": len(self.details),
            "spent_share": self.spent_share,
            "stack_samples_per_report": statistics.fmean(v.stack_samples for v in variants),
            "distinct_stacks_per_report": statistics.fmean(v.distinct for v in variants),
            "report_bytes": statistics.fmean(len(v.encoded) for v in variants)
            + statistics.fmean(len(r) for r in self.recorded),
            "tables_bytes": len(tables),
        }

    def variant(self, rng: random.Random) -> Variant:
        k = max(1, round(self.stack_samples * rng.uniform(0.8, 1.2)))
        drawn = Counter(rng.choices(range(len(self.stacks)), cum_weights=self.cum_weights, k=k))
        stacks = []
        locs: set[int] = set()
        tids: set[int] = set()
        for i, n in drawn.items():
            tid, stack = self.stacks[i]
            stacks.append([tid, n, list(stack)])
            locs.update(stack)
            tids.add(tid)
        threads = [[tid, self.thread_names.get(tid, f"thread-{tid}")] for tid in sorted(tids)]
        passes = max(1, round(k * self.passes_per_stack_sample))
        encoded = _field("stacks", stacks) + _field("threads", threads) + _field("samples", passes)
        return Variant(encoded, frozenset(locs), len(stacks), k)


def _accumulate(xs: list[int]) -> list[int]:
    out, total = [], 0
    for x in xs:
        total += x
        out.append(total)
    return out


# ---------------------------------------------------------------------------------------------------------------
# 3. the simulated agents (bench/monitor_scale.py --worker CONFIG)


class SimAgent:
    __slots__ = (
        "agent_id",
        "detail",
        "hello",
        "hello_sent",
        "last_report",
        "pid",
        "sent_at",
        "sent_locs",
        "sent_strings",
        "seq",
        "sock",
        "started",
    )

    def __init__(self, sock: zmq.Socket[Any], agent_id: str, pid: int, hello: bytes, now: float) -> None:
        self.sock = sock
        self.agent_id = agent_id
        self.pid = pid
        self.hello = hello
        self.hello_sent = False
        self.seq = 0
        self.started = now
        self.last_report = now
        #: monotonic send times of reports not answered yet (answers come in order)
        self.sent_at: deque[float] = deque()
        self.sent_locs: set[int] = set()
        self.sent_strings: set[int] = set()
        self.detail = False


def _agent_socket(ctx: zmq.Context[Any], endpoint: str, agent_id: str) -> zmq.Socket[Any]:
    """A DEALER with the real agent's options (agent/core.py Agent._run)."""
    sock: zmq.Socket[Any] = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 8)
    sock.setsockopt(zmq.RCVHWM, 64)
    sock.setsockopt(zmq.IMMEDIATE, 1)
    sock.setsockopt(zmq.RECONNECT_IVL, 200)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
    sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
    sock.setsockopt(zmq.ROUTING_ID, agent_id.encode())
    sock.connect(endpoint)
    return sock


class Simulator:
    """Many simulated agents in one process, on one poll loop."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.endpoint: str = cfg["endpoint"]
        self.index: int = cfg["index"]
        self.rng = random.Random(cfg["seed"])
        with open(cfg["recording"], "rb") as f:
            self.pop = Population(msgpack.unpackb(f.read(), raw=False, strict_map_key=False), cfg["stack_samples"])
        self.variants = [self.pop.variant(self.rng) for _ in range(cfg["pool"])]
        self.ctx: zmq.Context[Any] = zmq.Context(io_threads=1)
        self.poller = zmq.Poller()
        self.agents: list[SimAgent] = []
        self.by_sock: dict[zmq.Socket[Any], SimAgent] = {}
        #: (due, tie-break, agent index, kind): kind 0 = hello, 1 = report
        self.due: list[tuple[float, int, int, int]] = []
        self._tie = 0
        self.totals = Counter[str]()
        self.latencies: list[float] = []
        self.lags: list[float] = []
        self.stdin = sys.stdin.buffer.fileno()
        os.set_blocking(self.stdin, False)
        self.poller.register(self.stdin, zmq.POLLIN)
        self._inbuf = b""
        self.running = True
        self._check_encoding()

    def _check_encoding(self) -> None:
        """A simulated report must pass the monitor's own validation (agent.protocol)."""
        sim = SimAgent(None, "check", 1, b"", time.monotonic())  # type: ignore[arg-type]
        data = self._report_bytes(sim, time.monotonic())
        kind, body = protocol.decode(data, protocol.MONITOR_ACCEPTS)
        assert kind == protocol.REPORT and body["stacks"] and body["locs"], "bad simulated report"

    def add(self, n: int) -> None:
        now = time.monotonic()
        host = f"dyper-sim-{self.index}"
        for _ in range(n):
            i = len(self.agents)
            pid = 3_000_000 + self.index * 50_000 + i
            agent_id = f"{host}:{pid}:{uuid.uuid4().hex[:12]}"
            hello = dict(self.pop.hello, agent=agent_id, host=host, pid=pid, start_time=round(time.time(), 2))
            sock = _agent_socket(self.ctx, self.endpoint, agent_id)
            a = SimAgent(sock, agent_id, pid, protocol.encode(protocol.HELLO, hello), now)
            self.agents.append(a)
            self.by_sock[sock] = a
            self.poller.register(sock, zmq.POLLIN)
            self._schedule(now, i, 0)
            self._schedule(now + self.rng.random() * REPORT_PERIOD_S, i, 1)

    def _schedule(self, at: float, i: int, kind: int) -> None:
        self._tie += 1
        heapq.heappush(self.due, (at, self._tie, i, kind))

    def _report_bytes(self, a: SimAgent, now: float) -> bytes:
        pop = self.pop
        v = self.variants[self.rng.randrange(len(self.variants))]
        r = self.rng.randrange(len(pop.recorded))
        strings: list[list[Any]] = []
        locs: list[list[int]] = []
        if not v.locs <= a.sent_locs:
            for lid in sorted(v.locs - a.sent_locs):
                row = pop.locs[lid]
                locs.append(row)
                for sid in (row[1], row[2]):
                    if sid not in a.sent_strings:
                        a.sent_strings.add(sid)
                        strings.append([sid, pop.strings[sid]])
            a.sent_locs.update(v.locs)
        elapsed = now - a.started
        details: list[dict[str, Any]] = []
        if a.detail and pop.details:
            a.detail = False
            details = [dict(self.rng.choice(pop.details), t=time.time())]
        varying = (
            _field("agent", a.agent_id)
            + _field("seq", a.seq)
            + _field("epoch", pop.epoch)
            + _field("t", time.time())
            + _field("window_s", now - a.last_report)
            + _field("elapsed_s", elapsed)
            + _field("spent_s", elapsed * pop.spent_share)
            + _field("strings", strings)
            + _field("locs", locs)
            + _field("details", details)
        )
        n = 10 + VARIANT_FIELDS + pop.recorded_n[r]
        return _ENVELOPE + _pack(protocol.REPORT) + _map_header(n) + varying + v.encoded + pop.recorded[r]

    def _send(self, a: SimAgent, data: bytes) -> bool:
        try:
            a.sock.send(data, zmq.NOBLOCK)
        except zmq.Again:
            return False
        self.totals["bytes"] += len(data)
        return True

    def _fire(self, now: float) -> None:
        while self.due and self.due[0][0] <= now:
            at, _, i, kind = heapq.heappop(self.due)
            a = self.agents[i]
            if kind == 0:
                a.hello_sent = self._send(a, a.hello)
                if not a.hello_sent:  # not connected yet (IMMEDIATE): the real agent retries too
                    self._schedule(now + 0.05, i, 0)
                continue
            self._schedule(at + REPORT_PERIOD_S, i, 1)
            if not a.hello_sent:
                continue
            self.lags.append(1e3 * (now - at))
            if self._send(a, self._report_bytes(a, now)):
                a.sent_at.append(now)
                a.seq += 1
                a.last_report = now
                self.totals["sent"] += 1
            else:
                self.totals["dropped"] += 1
            now = time.monotonic()

    def _receive(self, a: SimAgent) -> None:
        for _ in range(64):
            try:
                data = a.sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            now = time.monotonic()
            try:
                kind, _ = protocol.decode(data, protocol.AGENT_ACCEPTS)
            except protocol.DecodeError:
                self.totals["bad_messages"] += 1
                continue
            if kind == protocol.CONFIGURE:
                if a.sent_at:
                    self.latencies.append(1e3 * (now - a.sent_at.popleft()))
                    self.totals["answered"] += 1
                else:
                    self.totals["unmatched"] += 1
            elif kind == protocol.DETAIL:
                a.detail = True
                self.totals["detail_requests"] += 1
            elif kind == protocol.RESYNC:
                # The monitor lost our tables: hello and every table again, as the agent does.
                self.totals["resyncs"] += 1
                a.sent_locs.clear()
                a.sent_strings.clear()
                a.hello_sent = self._send(a, a.hello)

    def _commands(self) -> None:
        try:
            chunk = os.read(self.stdin, 4096)
        except BlockingIOError:
            return
        if not chunk:
            self.running = False
            return
        self._inbuf += chunk
        while b"\n" in self._inbuf:
            line, self._inbuf = self._inbuf.split(b"\n", 1)
            words = line.decode().split()
            if words and words[0] == "add":
                self.add(int(words[1]))
            elif words and words[0] == "stop":
                self.running = False

    def _stats(self) -> None:
        out = {
            "t": time.monotonic(),
            "agents": len(self.agents),
            "outstanding": sum(len(a.sent_at) for a in self.agents),
            "cpu_s": time.process_time(),
            **self.totals,
            "lat_ms": [round(x, 2) for x in self.latencies],
            "lag_ms": [round(x, 2) for x in self.lags],
        }
        self.latencies, self.lags = [], []
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()

    def run(self) -> None:
        print("ready", flush=True)
        next_stats = time.monotonic() + 1.0
        while self.running:
            now = time.monotonic()
            self._fire(now)
            if now >= next_stats:
                self._stats()
                next_stats += 1.0
            wake = min(self.due[0][0] if self.due else now + 0.1, next_stats)
            timeout_ms = max(0, int(1e3 * (wake - time.monotonic())) + 1)
            for sock, _ in self.poller.poll(timeout_ms):
                if sock == self.stdin:
                    self._commands()
                else:
                    self._receive(self.by_sock[sock])
        for a in self.agents:
            with contextlib.suppress(zmq.ZMQError):
                a.sock.send(protocol.encode(protocol.BYE, {"agent": a.agent_id, "reason": "stop"}), zmq.NOBLOCK)
            a.sock.close(linger=200)
        self.ctx.term()
        self._stats()


def worker_main(cfg_json: str) -> int:
    Simulator(json.loads(cfg_json)).run()
    return 0


# ---------------------------------------------------------------------------------------------------------------
# 4. the harness


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    agents: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(b"{"):
                rec = json.loads(line)
                with self.lock:
                    self.records.append(rec)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.records if start <= r["t"] <= end]

    def at(self, t: float) -> dict[str, Any] | None:
        """The last record at or before ``t``."""
        with self.lock:
            found = None
            for r in self.records:
                if r["t"] > t:
                    break
                found = r
            return found


def pinned(cpus: set[int]) -> Any:
    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def machine_info(python: str) -> dict[str, Any]:
    """bench.overhead's machine figures, with the simulators' Python and the ZeroMQ versions."""
    info = overhead.machine_info(python)
    info.pop("dyper_proflets", None)  # the monitor runs no agent
    return {**info, "simulator_python": platform.python_version(), "zmq": zmq.zmq_version(), "pyzmq": zmq.__version__}


class Pinger(threading.Thread):
    """Pings the monitor about once a second on its own socket, and reads its CPU and RSS.

    Its own thread (and socket), so that a monitor slow to answer delays
    only the pings, never the progress of the steps.
    """

    def __init__(self, endpoint: str, pid: int, timeout: float) -> None:
        super().__init__(name="bench-pinger", daemon=True)
        self.endpoint = endpoint
        self.timeout = timeout
        self.proc = psutil.Process(pid)
        self.pid = pid
        self.records: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.halt = threading.Event()
        #: when the ping in flight was sent (None: none is)
        self.waiting_since: float | None = None

    def run(self) -> None:
        from dyper.monitor.client import MonitorClient

        with MonitorClient(self.endpoint, timeout=self.timeout) as client:
            next_at = time.monotonic()
            while not self.halt.wait(max(0.0, next_at - time.monotonic())):
                next_at = max(next_at + 1.0, time.monotonic())
                t0 = self.waiting_since = time.monotonic()
                try:
                    info: dict[str, Any] | None = client.call("ping")
                    ping_ms: float | None = 1e3 * (time.monotonic() - t0)
                except Exception:
                    info, ping_ms = None, None
                self.waiting_since = None
                rec = {"t": time.monotonic(), "ping_ms": ping_ms, **self.usage()}
                if info:
                    rec.update({k: info.get(k) for k in ("counters", "sessions", "history")})
                with self.lock:
                    self.records.append(rec)

    def usage(self) -> dict[str, Any]:
        try:
            with self.proc.oneshot():
                cpu = self.proc.cpu_times()
                rss = self.proc.memory_info().rss
                threads = {th.id: th.user_time + th.system_time for th in self.proc.threads()}
        except psutil.Error:
            return {}
        return {
            "cpu_s": cpu.user + cpu.system,
            "main_cpu_s": threads.get(self.pid, 0.0),
            "rss": rss,
            "wait_s": self.runqueue_wait_s(),
        }

    def runqueue_wait_s(self) -> float:
        """Seconds the monitor's threads were ready to run but waited for the CPU (other work on its core)."""
        total = 0
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                with (
                    contextlib.suppress(OSError, ValueError, IndexError),
                    open(f"/proc/{self.pid}/task/{tid}/schedstat") as f,
                ):
                    total += int(f.read().split()[1])
        return total / 1e9

    def between(self, start: float, end: float) -> list[dict[str, Any]]:
        with self.lock:
            return [r for r in self.records if start <= r["t"] <= end]


class Querier(threading.Thread):
    """Runs ``top`` queries when asked, on its own socket, and keeps their latencies per step."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        super().__init__(name="bench-querier", daemon=True)
        self.endpoint = endpoint
        self.timeout = timeout
        self.jobs: queue.Queue[tuple[int, int, float | None] | None] = queue.Queue()
        #: (agent count of the step, query kind, latency in ms or None when it failed)
        self.results: list[tuple[int, str, float | None]] = []

    def run(self) -> None:
        from dyper.monitor.client import MonitorClient

        with MonitorClient(self.endpoint, timeout=self.timeout) as client:
            while (job := self.jobs.get()) is not None:
                count, pid, window_s = job
                args: dict[str, Any] = {"pid": pid}
                if window_s is not None:
                    args["window_s"] = window_s
                t0 = time.monotonic()
                try:
                    view = client.call("top", **args)
                    latency: float | None = 1e3 * (time.monotonic() - t0) if isinstance(view, dict) else None
                except Exception as exc:
                    log(f"  top query for {pid} failed: {exc}")
                    latency = None
                self.results.append((count, "top_10s" if window_s is not None else "top_all", latency))


class Harness:
    def __init__(self, args: argparse.Namespace, recording_path: Path, workdir: Path) -> None:
        self.args = args
        self.recording_path = recording_path
        self.workdir = workdir
        cpus = sorted(os.sched_getaffinity(0))
        self.monitor_cpu: int = args.monitor_cpu if args.monitor_cpu is not None else cpus[0]
        self.sim_cpus = {c for c in cpus if c != self.monitor_cpu}
        self.endpoint = f"tcp://127.0.0.1:{_free_port()}"
        self.monitor_log = workdir / "monitor.log"
        self.monitor: subprocess.Popen[bytes] | None = None
        self.workers: list[Worker] = []
        self.pinger: Pinger | None = None
        self.querier: Querier | None = None
        #: the monitor's CPU times and RSS, read once a second whether or not it answers pings
        self.usage: list[dict[str, Any]] = []
        self.agents = 0
        self.pids: list[int] = []

    def start(self) -> None:
        """The monitor on its CPU, the simulators on the others, and the pinger and querier; each ready."""
        from dyper.monitor.client import MonitorUnreachable, wait_for_monitor

        args, workdir = self.args, self.workdir
        cmd = [args.python]
        if args.profile:
            cmd += ["-m", "cProfile", "-o", str(args.profile)]
        cmd += ["-m", "dyper", "monitor", "--listen", self.endpoint]
        cmd += ["--no-history"] if args.no_history else ["--history", str(workdir / "history.sqlite3")]
        with open(self.monitor_log, "wb") as out:
            self.monitor = monitor = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, preexec_fn=pinned({self.monitor_cpu})
            )
        for i in range(args.procs):
            cfg = {
                "endpoint": self.endpoint,
                "index": i,
                "seed": args.seed * 1000 + i,
                "recording": str(self.recording_path),
                "pool": args.pool,
                "stack_samples": args.stack_samples,
            }
            with open(workdir / f"sim-{i}.log", "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, __file__, "--worker", json.dumps(cfg)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    cwd=REPO,
                    preexec_fn=pinned(self.sim_cpus),
                )
            self.workers.append(Worker(proc))
        # This process (pings, queries) stays off the monitor's core too.
        os.sched_setaffinity(0, self.sim_cpus)
        for i, w in enumerate(self.workers):
            assert w.proc.stdout is not None
            line = w.proc.stdout.readline()
            if line.strip() != b"ready":
                err_text = (workdir / f"sim-{i}.log").read_text(errors="replace").strip()
                raise SystemExit(f"simulator {i} did not start: {err_text[-800:] or line!r}")
            threading.Thread(target=w.read, name="bench-sim-reader", daemon=True).start()
        try:
            wait_for_monitor(self.endpoint, 30, alive=lambda: monitor.poll() is None)
        except MonitorUnreachable:
            raise SystemExit(f"the monitor did not start; its output: {self.monitor_log.read_text()[-800:]}") from None
        self.pinger = Pinger(self.endpoint, self.monitor.pid, args.query_timeout)
        self.pinger.start()
        self.querier = Querier(self.endpoint, args.query_timeout)
        self.querier.start()

    def grow(self, count: int) -> None:
        """Bring the simulated agents up to ``count``, spread evenly over the simulator processes."""
        n = len(self.workers)
        for i, w in enumerate(self.workers):
            want = count // n + (1 if i < count % n else 0)
            if want > w.agents:
                w.send(f"add {want - w.agents}")
                self.pids += [3_000_000 + i * 50_000 + k for k in range(w.agents, want)]
                w.agents = want
        self.agents = count

    def step(self, count: int) -> dict[str, Any]:
        args = self.args
        assert self.querier is not None
        self.grow(count)
        start = time.monotonic()
        settle = min(args.settle, args.seconds / 3)
        measure_from = start + settle
        end = start + args.seconds
        span = end - measure_from
        query_at = [measure_from + (i + 0.5) * span / max(1, args.queries) for i in range(args.queries)]
        last_progress = start
        while (now := time.monotonic()) < end:
            if query_at and now >= query_at[0]:
                query_at.pop(0)
                pid = random.choice(self.pids)
                self.querier.jobs.put((count, pid, 10.0))
                self.querier.jobs.put((count, pid, None))
            if now >= last_progress + 1.0:
                assert self.pinger is not None
                self.usage.append({"t": now, **self.pinger.usage()})
                self._progress(count, start, last_progress, now)
                last_progress = now
            time.sleep(max(0.0, min(last_progress + 1.0, query_at[0] if query_at else end, end) - now))
        return self._summarise(count, measure_from, end)

    def _sim(self, start: float, end: float) -> dict[str, Any]:
        """The simulators' figures between two times: rates, answers, lag, their CPU."""
        sent = answered = dropped = bytes_ = 0.0
        outstanding0 = outstanding1 = 0
        max_outstanding = 0
        cpu = 0.0
        growth = 0.0
        lat: list[float] = []
        lag: list[float] = []
        for w in self.workers:
            a, b = w.at(start), w.at(end)
            recs = w.between(start, end)
            if a is None or b is None or b["t"] <= a["t"]:
                continue
            dt = b["t"] - a["t"]
            sent += (b.get("sent", 0) - a.get("sent", 0)) / dt
            answered += (b.get("answered", 0) - a.get("answered", 0)) / dt
            dropped += b.get("dropped", 0) - a.get("dropped", 0)
            bytes_ += (b.get("bytes", 0) - a.get("bytes", 0)) / dt
            cpu += (b["cpu_s"] - a["cpu_s"]) / dt
            outstanding0 += a["outstanding"]
            outstanding1 += b["outstanding"]
            for r in recs:
                if r["t"] > a["t"]:
                    lat += r["lat_ms"]
                    lag += r["lag_ms"]
            max_outstanding = max(max_outstanding, max((r["outstanding"] for r in recs), default=0))
            growth += slope([r["t"] for r in recs], [float(r["outstanding"]) for r in recs]) or 0.0
        return {
            "sent_per_s": sent,
            "answered_per_s": answered,
            "dropped": int(dropped),
            "mb_per_s": bytes_ / 1e6,
            "cpu_pct": 100 * cpu,
            "backlog_start": outstanding0,
            "backlog_end": outstanding1,
            "backlog_max": max_outstanding,
            "backlog_growth_per_s": growth,
            "lat_ms": lat,
            "lag_ms": lag,
        }

    def _progress(self, count: int, start: float, since: float, now: float) -> None:
        assert self.pinger is not None
        pings = [r for r in self.pinger.between(since - 2.0, now) if r.get("counters")]
        rate = cpu = rss = ping = None
        if len(pings) >= 2:
            a, b = pings[-2], pings[-1]
            rate = (b["counters"]["reports"] - a["counters"]["reports"]) / (b["t"] - a["t"])
        if pings and pings[-1]["t"] > since:
            ping = f"{pings[-1]['ping_ms']:6.1f} ms"
        elif (waiting := self.pinger.waiting_since) is not None:
            ping = f"waiting {now - waiting:.0f} s"
        usage = [u for u in self.usage[-2:] if "cpu_s" in u]
        if len(usage) == 2:
            cpu = 100 * (usage[1]["cpu_s"] - usage[0]["cpu_s"]) / (usage[1]["t"] - usage[0]["t"])
        if usage:
            rss = usage[-1]["rss"] / 2**20
        sim = self._sim(since, now)
        log(
            f"  {count:4d} agents  t={now - start:5.1f}s  sent {sim['sent_per_s']:6.1f}/s  "
            f"ingested {_f(rate, '6.1f')}/s  latency p99 {_f(percentile(sim['lat_ms'], 0.99), '7.1f')} ms  "
            f"backlog {sim['backlog_end']:4d}  monitor cpu {_f(cpu, '5.1f')}%  rss {_f(rss, '6.1f')} MiB  "
            f"ping {ping or '-'}  sim lag p99 {_f(percentile(sim['lag_ms'], 0.99), '5.1f')} ms"
        )

    def _summarise(self, count: int, measure_from: float, end: float) -> dict[str, Any]:
        assert self.pinger is not None
        sim = self._sim(measure_from, end)
        usage = [u for u in self.usage if measure_from <= u["t"] <= end and "cpu_s" in u]
        answered = [r for r in self.pinger.between(measure_from, end) if r.get("counters") and "rss" in r]
        ingested = None
        rss_by_reports = None
        if len(answered) >= 2 and answered[-1]["t"] > answered[0]["t"]:
            a, b = answered[0], answered[-1]
            ingested = (b["counters"]["reports"] - a["counters"]["reports"]) / (b["t"] - a["t"])
            rss_by_reports = slope(
                [float(r["counters"]["reports"]) for r in answered], [float(r["rss"]) for r in answered]
            )
        cpu = main = wait = per_report = None
        if len(usage) >= 2 and usage[-1]["t"] > usage[0]["t"]:
            dt = usage[-1]["t"] - usage[0]["t"]
            cpu = 100 * (usage[-1]["cpu_s"] - usage[0]["cpu_s"]) / dt
            main = 100 * (usage[-1]["main_cpu_s"] - usage[0]["main_cpu_s"]) / dt
            wait = 100 * (usage[-1]["wait_s"] - usage[0]["wait_s"]) / dt
            # What one report costs the monitor is what a dedicated core's capacity follows
            # from; unlike the rates it hardly changes when other work shares the core.
            rate = ingested if ingested is not None else sim["answered_per_s"]
            if rate and rate > 0:
                per_report = 10 * cpu / rate
        last = answered[-1] if answered else {}
        hist0 = (answered[0].get("history") or {}) if answered else {}
        hist1 = last.get("history") or {}
        history_dropped = (hist1.get("counters") or {}).get("dropped", 0) - (hist0.get("counters") or {}).get(
            "dropped", 0
        )
        lat_p99 = percentile(sim["lat_ms"], 0.99)
        lag_p99 = percentile(sim["lag_ms"], 0.99)
        sent = sim["sent_per_s"]
        # Unanswered reports come and go with every batch the monitor takes:
        # what tells a monitor falling behind is their trend over the step.
        growth = sim["backlog_growth_per_s"]
        keeps_up = (
            ingested is not None
            and sent > 0
            and ingested >= KEEP_UP_SHARE * sent
            and sim["dropped"] == 0
            and growth <= 0.02 * sent + 0.5
            and lat_p99 is not None
            and lat_p99 < 1e3 * REPORT_PERIOD_S
        )
        overwhelmed = not keeps_up and (
            ingested is None
            or ingested < 0.9 * sent
            or growth > 0.1 * sent
            or (percentile(sim["lat_ms"], 0.5) or 0.0) > 1e3 * REPORT_PERIOD_S
        )
        pings = [r["ping_ms"] for r in self.pinger.between(measure_from, end) if r["ping_ms"] is not None]
        return {
            "agents": count,
            "sessions": last.get("sessions"),
            "measured_s": end - measure_from,
            "sent_per_s": sim["sent_per_s"],
            "ingested_per_s": ingested,
            "answered_per_s": sim["answered_per_s"],
            "keeps_up": keeps_up,
            "overwhelmed": overwhelmed,
            "dropped_by_agents": sim["dropped"],
            "backlog_start": sim["backlog_start"],
            "backlog_end": sim["backlog_end"],
            "backlog_max": sim["backlog_max"],
            "backlog_growth_per_s": growth,
            "latency_ms": {
                "p50": percentile(sim["lat_ms"], 0.5),
                "p90": percentile(sim["lat_ms"], 0.9),
                "p99": lat_p99,
                "max": max(sim["lat_ms"], default=None),
                "n": len(sim["lat_ms"]),
            },
            "monitor_cpu_pct": cpu,
            "monitor_main_thread_cpu_pct": main,
            "monitor_cpu_waited_pct": wait,
            "monitor_cpu_ms_per_report": per_report,
            "capacity_estimate_agents": 1e3 * REPORT_PERIOD_S / per_report if per_report else None,
            "monitor_rss_mib": usage[-1]["rss"] / 2**20 if usage else None,
            "rss_per_report_kib": rss_by_reports / 1024 if rss_by_reports is not None else None,
            "history_pending": hist1.get("pending"),
            "history_dropped": history_dropped,
            "monitor_counters": last.get("counters"),
            "ping_ms": {"p50": percentile(pings, 0.5), "max": max(pings, default=None), "answered": len(pings)},
            "sim": {
                "lag_ms_p50": percentile(sim["lag_ms"], 0.5),
                "lag_ms_p99": lag_p99,
                "lag_ms_max": max(sim["lag_ms"], default=None),
                "cpu_pct": sim["cpu_pct"],
                "mb_per_s": sim["mb_per_s"],
                "on_schedule": lag_p99 is not None and lag_p99 <= SIM_LAG_OK_MS,
            },
        }

    def query_stats(self, count: int) -> dict[str, Any]:
        """Latencies of the step's ``top`` queries (those answered so far)."""
        assert self.querier is not None
        out = {}
        for kind in ("top_10s", "top_all"):
            xs = [lat for c, k, lat in list(self.querier.results) if c == count and k == kind]
            ok = [x for x in xs if x is not None]
            out[kind] = {"p50": percentile(ok, 0.5), "max": max(ok, default=None), "failed": len(xs) - len(ok)}
        return out

    def close(self) -> None:
        if self.querier is not None:
            # Queries not started yet are dropped; the one running gets its answer or times out.
            with contextlib.suppress(queue.Empty):
                while True:
                    self.querier.jobs.get_nowait()
            self.querier.jobs.put(None)
            self.querier.join(self.args.query_timeout + 5)
        if self.pinger is not None:
            self.pinger.halt.set()
            self.pinger.join(self.args.query_timeout + 5)
        for w in self.workers:
            w.send("stop")
        for w in self.workers:
            try:
                w.proc.wait(15)
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(5)
        if self.monitor is not None and self.monitor.poll() is None:
            self.monitor.send_signal(signal.SIGTERM)
            try:
                self.monitor.wait(120)  # it ingests what is queued and commits its history first
            except subprocess.TimeoutExpired:
                log("the monitor did not stop within 120 s of SIGTERM: killed (no profile written)")
                self.monitor.kill()
                self.monitor.wait(5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _f(x: float | None, spec: str) -> str:
    if x is None:
        width = int(spec.split(".")[0]) if spec[0].isdigit() else 1
        return "-".rjust(width)
    return format(x, spec)


# ---------------------------------------------------------------------------------------------------------------
# output


def print_table(result: dict[str, Any]) -> None:
    m = result["machine"]
    pop = result["recording"]
    print()
    print(
        f"dyper monitor scale: one monitor pinned to CPU {result['settings']['monitor_cpu']}, simulated agents on "
        f"CPU(s) {result['settings']['sim_cpus']} in {result['settings']['procs']} process(es). Machine: "
        f"{m['cpu_model']}, {m['cores']} cores, monitor on CPython {m['python']}, {m['platform']}, "
        f"dyper {m['dyper_commit']}, load average at start {m['load_avg_at_start'][0]:.2f}"
    )
    print(
        f"agents replay a real agent (CPython {pop['python']}, budget {pop['budget']}): {pop['functions']} functions, "
        f"{pop['locations']} locations, {pop['population_stacks']} distinct stacks of mean depth "
        f"{pop['mean_depth']:.1f}; per report ~{pop['stack_samples_per_report']:.0f} stack samples in "
        f"~{pop['distinct_stacks_per_report']:.0f} distinct stacks, {pop['report_bytes'] / 1024:.1f} KiB "
        f"(tables {pop['tables_bytes'] / 1024:.0f} KiB, sent once); {pop['detail_bursts']} recorded detailing "
        f"burst(s); history {'off' if result['settings']['no_history'] else 'on'}"
    )
    print()
    head = [
        ("agents", 6),
        ("sent/s", 8),
        ("ingest/s", 9),
        ("answer/s", 9),
        ("keeps up", 9),
        ("backlog/s", 10),
        ("lat p50", 8),
        ("lat p99", 8),
        ("cpu %", 7),
        ("main %", 7),
        ("waited %", 9),
        ("ms/report", 10),
        ("est. agents", 12),
        ("RSS MiB", 8),
        ("ping ms", 8),
        ("top10s ms", 10),
        ("topall ms", 10),
        ("sim lag99", 10),
    ]
    print("".join(f"{h:>{w}}" for h, w in head))
    for s in result["steps"]:
        lat = s["latency_ms"]
        q = s["query_ms"]
        cells = [
            f"{s['agents']:>6}",
            _f(s["sent_per_s"], "8.1f"),
            _f(s["ingested_per_s"], "9.1f"),
            _f(s["answered_per_s"], "9.1f"),
            f"{('yes' if s['keeps_up'] else 'NO'):>9}",
            _f(s["backlog_growth_per_s"], "10.2f"),
            _f(lat["p50"], "8.1f"),
            _f(lat["p99"], "8.1f"),
            _f(s["monitor_cpu_pct"], "7.1f"),
            _f(s["monitor_main_thread_cpu_pct"], "7.1f"),
            _f(s["monitor_cpu_waited_pct"], "9.1f"),
            _f(s["monitor_cpu_ms_per_report"], "10.2f"),
            _f(s["capacity_estimate_agents"], "12.0f"),
            _f(s["monitor_rss_mib"], "8.1f"),
            _f(s["ping_ms"]["p50"], "8.1f"),
            _f(q["top_10s"]["max"], "10.1f"),
            _f(q["top_all"]["max"], "10.1f"),
            _f(s["sim"]["lag_ms_p99"], "10.1f") + ("" if s["sim"]["on_schedule"] else "!"),
        ]
        print("".join(cells))
        notes = []
        if s["dropped_by_agents"]:
            notes.append(f"{s['dropped_by_agents']} report(s) dropped by agents (monitor's queue full)")
        if s["history_dropped"]:
            notes.append(f"{s['history_dropped']} report(s) not written to history (its queue was full)")
        if any(v["failed"] for v in q.values()):
            notes.append("a top query failed or timed out")
        if not s["sim"]["on_schedule"]:
            notes.append("simulators behind schedule: the monitor got less than the nominal load")
        for note in notes:
            print(f"{'':>6}  {note}")
    print()
    print(
        "ingest/s: from the monitor's counters (- when no ping was answered); answer/s: answers to reports the "
        "agents got. latency: report sent -> the monitor's answer to it (ms). cpu %: monitor process, of its one "
        "core; main %: its receive loop; waited %: time its threads were ready but another process had its core. "
        "ms/report: monitor CPU per report ingested; est. agents: how many agents reporting once a second one "
        "whole core would take at that cost. top10s/topall: slowest `top` query over the last 10 s / the whole "
        "run (ms)."
    )
    print("backlog/s: trend of the reports sent and not yet answered over the measured part of the step, per s.")
    summary = result["summary"]
    if summary["rss_per_session_kib"] is not None:
        print(f"RSS per session (slope over the steps): {summary['rss_per_session_kib']:.0f} KiB")
    per_report = [s["rss_per_report_kib"] for s in result["steps"] if s["rss_per_report_kib"] is not None]
    if per_report:
        print(
            f"RSS per report ingested within a step (reports are kept {summary['window_retention_s']:.0f} s for "
            f"'now' windows): median {statistics.median(per_report):.1f} KiB"
        )
    sustained = summary["sustained_agents"]
    print(
        f"sustained: {f'up to {sustained} agents' if sustained else 'no step'} reporting once a second kept up "
        f"(target: 200)."
    )
    if summary["capacity_estimate_agents"]:
        print(
            f"at the median cost of {summary['cpu_ms_per_report']:.1f} ms of monitor CPU per report, one whole core "
            f"would take about {summary['capacity_estimate_agents']:.0f} agents reporting once a second."
        )
    print(
        "On a shared machine other processes take turns on the monitor's core (waited %), which lowers what it "
        "sustains here; the CPU per report changes far less. Load averages are in the JSON."
    )


def print_profile(path: Path, limit: int = 25) -> list[dict[str, Any]]:
    import pstats

    stats = pstats.Stats(str(path))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    entries = stats.stats  # type: ignore[attr-defined]
    for (file, line, func), (_, ncalls, tottime, cumtime, _) in entries.items():
        rows.append(
            {"where": f"{_short(file)}:{line}({func})", "calls": ncalls, "tottime_s": tottime, "cumtime_s": cumtime}
        )
    print()
    print(f"the monitor under cProfile: {total:.1f} s in total; top {limit} by own time")
    print(f"{'own s':>8}{'own %':>7}{'cum s':>8}{'cum %':>7}{'calls':>10}  where")

    def row(r: dict[str, Any]) -> str:
        own, cum = r["tottime_s"], r["cumtime_s"]
        return f"{own:8.2f}{100 * own / total:7.1f}{cum:8.2f}{100 * cum / total:7.1f}{r['calls']:>10}  {r['where']}"

    rows.sort(key=lambda r: -r["tottime_s"])
    for r in rows[:limit]:
        print(row(r))
    print()
    print(f"top {limit} of dyper's own functions by cumulative time")
    ours = [r for r in rows if r["where"].startswith(("monitor/", "agent/", "proflets/"))]
    ours.sort(key=lambda r: -r["cumtime_s"])
    for r in ours[:limit]:
        print(row(r))
    return rows[: limit * 2]


def _short(file: str) -> str:
    prefix = str(REPO) + os.sep
    return file[len(prefix) :] if file.startswith(prefix) else file


# ---------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--counts", default="25,50,100,200,300,400", help="agent counts to step through")
    ap.add_argument("--seconds", type=float, default=30.0, help="how long each step holds (default 30)")
    ap.add_argument("--settle", type=float, default=5.0, help="unmeasured start of each step (at most a third)")
    ap.add_argument("--procs", type=int, default=2, help="simulator processes (default 2)")
    ap.add_argument("--pool", type=int, default=128, help="pre-drawn stack sets per simulator process")
    ap.add_argument("--monitor-cpu", type=int, help="the CPU the monitor is pinned to (default: the first usable)")
    ap.add_argument("--python", default=sys.executable, help="Python of the monitor and the recorded agent")
    ap.add_argument("--no-history", action="store_true", help="run the monitor with --no-history")
    ap.add_argument("--queries", type=int, default=3, help="top queries (each kind) per step")
    ap.add_argument("--query-timeout", type=float, default=30.0, help="seconds before a query counts as timed out")
    ap.add_argument("--capture", type=Path, help="replay this recording instead of recording a real agent now")
    ap.add_argument("--save-capture", type=Path, help="keep the recording here")
    ap.add_argument("--capture-seconds", type=float, default=20.0, help="how long to record the real agent")
    ap.add_argument(
        "--capture-budget",
        default="5%",
        help="the recorded agent's budget (default 5%%: at 1%% it samples too little in a short recording "
        "to see much of the population)",
    )
    ap.add_argument(
        "--stack-samples",
        type=int,
        help="stack samples per simulated report (default: the recorded agent's rate times one second)",
    )
    ap.add_argument("--profile", type=Path, help="run the monitor under cProfile, write its stats here")
    ap.add_argument(
        "--keep-going", action="store_true", help="go on to the next step after one where the monitor fell behind"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker)
    try:
        counts = sorted({int(c) for c in args.counts.split(",") if c.strip()})
    except ValueError:
        ap.error(f"--counts {args.counts!r}: give agent counts like 25,100,200")
    if not counts or counts[0] <= 0:
        ap.error("--counts: give positive agent counts")
    if len(os.sched_getaffinity(0)) < 2:
        ap.error("needs at least two usable CPUs: one for the monitor, one for the simulated agents")
    if args.monitor_cpu is not None and args.monitor_cpu not in os.sched_getaffinity(0):
        ap.error(
            f"--monitor-cpu {args.monitor_cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}"
        )
    random.seed(args.seed)
    machine = machine_info(args.python)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dyper-scale-") as tmpname:
        workdir = Path(tmpname)
        if args.capture:
            recording_bytes = args.capture.read_bytes()
            log(f"replaying the recording in {args.capture}")
        else:
            log(f"recording a real agent on {DEEP_SERVICE.name} for {args.capture_seconds:g} s ...")
            recording = record_agent(args.python, args.capture_seconds, args.capture_budget, workdir)
            recording_bytes = _pack(recording)
        if args.save_capture:
            args.save_capture.write_bytes(recording_bytes)
            log(f"recording kept in {args.save_capture}")
        recording_path = workdir / "recording.msgpack"
        recording_path.write_bytes(recording_bytes)
        recorded = msgpack.unpackb(recording_bytes, raw=False, strict_map_key=False)
        pop_stats = {
            **Population(recorded, args.stack_samples).stats(random.Random(args.seed)),
            "python": recorded["python"],
            "budget": recorded["budget"],
        }
        log(
            "recorded: "
            + ", ".join(f"{k} {v:.1f}" if isinstance(v, float) else f"{k} {v}" for k, v in pop_stats.items())
        )
        harness = Harness(args, recording_path, workdir)
        steps: list[dict[str, Any]] = []
        try:
            harness.start()
            assert harness.monitor is not None
            log(
                f"monitor pid {harness.monitor.pid} on CPU {harness.monitor_cpu}; {args.procs} simulator process(es) "
                f"on CPU(s) {sorted(harness.sim_cpus)}; steps {counts}, {args.seconds:g} s each"
            )
            for count in counts:
                log(f"step: {count} agents")
                result = harness.step(count)
                steps.append(result)
                lat = result["latency_ms"]
                log(
                    f"step {count}: sent {result['sent_per_s']:.1f}/s, ingested {_f(result['ingested_per_s'], '.1f')}"
                    f"/s, keeps up: {'yes' if result['keeps_up'] else 'NO'}, latency p50 {_f(lat['p50'], '.1f')} "
                    f"p99 {_f(lat['p99'], '.1f')} ms, monitor cpu {_f(result['monitor_cpu_pct'], '.0f')}%, "
                    f"rss {_f(result['monitor_rss_mib'], '.0f')} MiB"
                )
                if harness.monitor.poll() is not None:
                    log(f"the monitor exited: {harness.monitor_log.read_text()[-800:]}")
                    break
                if result["overwhelmed"] and not args.keep_going and count != counts[-1]:
                    # More agents only pile up more backlog (and memory) on a monitor already behind.
                    log(f"stopping: the monitor fell behind at {count} agents (--keep-going to go on)")
                    break
        except KeyboardInterrupt:
            log("interrupted: reporting the steps done so far")
        finally:
            harness.close()
        for result in steps:
            result["query_ms"] = harness.query_stats(result["agents"])
        profile_rows = print_profile(args.profile) if args.profile and args.profile.exists() else None
    from dyper.monitor.session import WINDOW_RETENTION_S

    sustained = 0
    for s in steps:
        if not (s["keeps_up"] and s["sim"]["on_schedule"]):
            break
        sustained = s["agents"]
    costs = [s["monitor_cpu_ms_per_report"] for s in steps if s["monitor_cpu_ms_per_report"]]
    cost = statistics.median(costs) if costs else None
    sized = [s for s in steps if s["sessions"] and s["monitor_rss_mib"]]
    per_session = slope([float(s["sessions"]) for s in sized], [s["monitor_rss_mib"] * 2**20 for s in sized])
    machine["load_avg_at_end"] = os.getloadavg()
    result_all = {
        "machine": machine,
        "settings": {
            "counts": counts,
            "seconds": args.seconds,
            "settle": min(args.settle, args.seconds / 3),
            "procs": args.procs,
            "pool": args.pool,
            "monitor_cpu": harness.monitor_cpu,
            "sim_cpus": sorted(harness.sim_cpus),
            "no_history": args.no_history,
            "report_period_s": REPORT_PERIOD_S,
            "seed": args.seed,
        },
        "recording": pop_stats,
        "steps": steps,
        "summary": {
            "sustained_agents": sustained,
            "target_agents": 200,
            "cpu_ms_per_report": cost,
            "capacity_estimate_agents": 1e3 * REPORT_PERIOD_S / cost if cost else None,
            "rss_per_session_kib": per_session / 1024 if per_session is not None else None,
            "window_retention_s": WINDOW_RETENTION_S,
        },
        "profile_top": profile_rows,
        "elapsed_s": time.monotonic() - started,
    }
    if steps:
        print_table(result_all)
    if args.json:
        args.json.write_text(json.dumps(result_all, indent=2))
        print(f"\nwritten to {args.json}")
    return 0 if steps else 1


if __name__ == "__main__":
    sys.exit(main())
