"""The agent that runs inside the target: one sampler thread and its channel.

Everything here runs in someone's production process, so:

* one daemon thread, named ``dyper-sampler`` (also at the OS level, so it
  shows as such in ``top -H``), owns the ZeroMQ socket and does all the work;
  the application's threads never touch the socket and never wait for us;
* every send is non-blocking; when the monitor is away or slow, counts keep
  accumulating in a bounded table and what cannot be kept is dropped and
  counted, never queued without bound;
* every cost we add (sampling, encoding, sending) is measured and charged to
  the budget, and the guard holds the spend under it even without a monitor;
* no exception escapes into the application: the thread catches everything,
  reports it to the monitor and, if it cannot go on, stops cleanly.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import os
import random
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any, Final

import zmq

from agent import protocol
from agent.budget import Guard, Plan, plan
from agent.tables import Tables

_fast: Any
try:  # the optional C walker (agent/_fastsample.c); the pure-Python one is the reference
    _fast = importlib.import_module("agent._fastsample")
except ImportError:  # not built for this interpreter
    _fast = None

THREAD_NAME: Final = "dyper-sampler"
AGENT_VERSION: Final = "0.1.0"

#: Distinct (thread, stack) entries kept while reports cannot be sent. A busy
#: service has a few thousand; past this we drop samples and count them.
MAX_PENDING_STACKS: Final = 50_000
#: Reports ZeroMQ may hold for a connected but slow monitor before sends fail.
SEND_HWM: Final = 8

#: Starting guesses until the first measurements come in; deliberately high so
#: the first plan errs on the side of spending less.
INITIAL_SAMPLE_COST_S: Final = 200e-6
INITIAL_REPORT_COST_S: Final = 2e-3
#: How often the plan follows the measured costs, monitor or not.
REPLAN_S: Final = 1.0
#: Sample counts after which the plan is redone at once, so the first plan's
#: deliberately high cost guess does not hold sampling back for a whole second.
_EARLY_REPLANS: Final = frozenset({1, 2, 4, 8, 16, 32})
#: How often to retry the hello while no monitor has accepted the connection.
HELLO_RETRY_S: Final = 0.5
#: Weight of a new measurement in the moving averages of costs.
EWMA_ALPHA: Final = 0.05

Clock = Callable[[], float]


def _process_start_time() -> float:
    """Creation time of this process in seconds since the epoch (Linux /proc)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start_ticks = int(fields[19])
        with open("/proc/stat", "rb") as f:
            btime = next(int(line.split()[1]) for line in f if line.startswith(b"btime"))
        return round(btime + start_ticks / os.sysconf("SC_CLK_TCK"), 2)
    except (OSError, ValueError, IndexError, StopIteration):
        return round(time.time(), 2)


def _argv() -> list[str]:
    try:
        with open("/proc/self/cmdline", "rb") as f:
            parts = f.read().split(b"\0")
        return [p.decode(errors="replace") for p in parts if p]
    except OSError:
        return list(sys.argv)


def _name_os_thread(name: str) -> None:
    """Give the current thread an OS-level name, visible in ``top -H`` and ``ps -T``."""
    with contextlib.suppress(OSError), open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name[:15])


class Agent:
    """One agent incarnation: sampler thread, tables, ledger and socket."""

    def __init__(
        self,
        endpoint: str,
        budget: float,
        *,
        attach_token: str | None = None,
        ceiling: float | None = None,
        clock: Clock = time.monotonic,
        on_exit: Callable[[Agent], None] | None = None,
    ) -> None:
        self._on_exit = on_exit
        self._pending_budget: float | None = None
        self.endpoint = endpoint
        self.budget = budget
        self.ceiling = ceiling
        self.attach_token = attach_token
        self.clock = clock
        self.pid = os.getpid()
        self.agent_id = f"{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self.tables = Tables()
        #: (thread ident, stack of location ids, leaf first) -> samples
        self.counts: dict[tuple[int, tuple[int, ...]], int] = {}
        self.samples_in_window = 0
        self.seq = 0
        self.errors: list[str] = []
        self.dropped: dict[str, int] = {"reports": 0, "samples": 0, "bad_messages": 0}
        self._rng = random.Random()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._ident = 0
        self.sample_cost_s = INITIAL_SAMPLE_COST_S
        self.report_cost_s = INITIAL_REPORT_COST_S
        now = clock()
        self.guard = Guard(budget, now)
        self.plan: Plan = plan(budget, self.sample_cost_s, self.report_cost_s)
        self._window_start = now
        self._window_costs = {"sample": 0.0, "report": 0.0, "detail": 0.0}
        self._bye_reason = "stop"
        self._hello_sent = False
        #: the costliest single operation so far: how far the ledger can be
        #: over the budget at any instant (see Guard.wait_needed)
        self.max_op_s = 0.0
        self._samples_total = 0
        self._hello: dict[str, Any] | None = None

    # --- control, from any thread ---------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping.is_set()

    def stop(self, timeout: float = 2.0, reason: str = "stop") -> None:
        """Ask the sampler to send its last report and a bye, then wait for it."""
        self._bye_reason = reason
        self._stopping.set()
        self._wake()
        thread = self._thread
        # Neither Thread.join() nor threading.current_thread(): both register a
        # _DummyThread for a foreign caller (the attach bootstrap's thread),
        # which would stay in threading._active for good.
        if thread is not None and thread.ident != threading.get_ident():
            deadline = time.monotonic() + timeout
            self._stopped.wait(timeout)
            while thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)

    def set_budget(self, budget: float) -> None:
        # Read by the sampler thread at its next wake-up; a float store is atomic.
        self._pending_budget = budget
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    # --- the sampler thread ---------------------------------------------------------

    def _run(self) -> None:
        self._ident = threading.get_ident()
        _name_os_thread(THREAD_NAME)
        ctx: zmq.Context[Any] | None = None
        sock: zmq.Socket[Any] | None = None
        try:
            # A private context: the application may use ZeroMQ itself, and we
            # must be able to terminate ours without touching its sockets.
            ctx = zmq.Context(io_threads=1)
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.setsockopt(zmq.RCVHWM, 64)
            # Only queue to a live connection: with no monitor, sends fail at
            # once and we keep counting locally instead of buffering reports.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.RECONNECT_IVL, 200)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            # Heartbeats notice a vanished monitor (SIGKILL, cable) within seconds.
            sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
            sock.setsockopt(zmq.ROUTING_ID, self.agent_id.encode())
            sock.connect(self.endpoint)
            self._loop(sock)
        except BaseException as exc:  # never let anything reach the application
            self.errors.append(f"agent stopped by {type(exc).__name__}: {exc}")
            if sock is not None:
                with contextlib.suppress(Exception):
                    self._send(sock, protocol.ERROR, {"agent": self.agent_id, "message": self.errors[-1]})
        finally:
            if sock is not None:
                with contextlib.suppress(Exception):
                    sock.close(linger=0)
            if ctx is not None:
                with contextlib.suppress(Exception):
                    ctx.term()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.counts.clear()
            self._stopping.set()
            self._stopped.set()
            if self._on_exit is not None:
                with contextlib.suppress(Exception):
                    self._on_exit(self)

    def _loop(self, sock: zmq.Socket[Any]) -> None:
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        self._hello_sent = self._send_hello(sock)
        now = self.clock()
        next_sample = now + self._jitter(self.plan.sample_delay_s)
        next_report = now + self.plan.report_delay_s
        next_hello = now + HELLO_RETRY_S
        next_replan = now + REPLAN_S
        while not self._stopping.is_set():
            now = self.clock()
            if now >= next_replan:
                self._replan()
                next_replan = now + REPLAN_S
            if now >= next_sample:
                wait = self.guard.wait_needed(now, self.sample_cost_s)
                if wait > 0:
                    next_sample = now + wait
                else:
                    t0 = time.perf_counter()
                    self.sample()
                    spent = time.perf_counter() - t0
                    self._window_costs["sample"] += spent
                    self.guard.charge(spent, self.clock())
                    self.max_op_s = max(self.max_op_s, spent)
                    # A plain mean over the first samples, then a moving average:
                    # the plan follows real costs within a few samples of start.
                    self._samples_total += 1
                    alpha = max(EWMA_ALPHA, 1.0 / self._samples_total)
                    self.sample_cost_s += alpha * (spent - self.sample_cost_s)
                    if self._samples_total in _EARLY_REPLANS:
                        self._replan()
                    next_sample = now + self._jitter(self.plan.sample_delay_s)
            if not self._hello_sent and now >= next_hello:
                # Until the connection is up the hello cannot go; reports wait
                # for it, their counts keep accumulating meanwhile.
                self._hello_sent = self._send_hello(sock)
                next_hello = now + HELLO_RETRY_S
            if now >= next_report:
                if self._hello_sent:
                    self._report(sock)
                # Rescheduled even when no report could go (no monitor yet),
                # or the loop would wake at once, again and again.
                next_report = self.clock() + self._jitter(self.plan.report_delay_s, spread=0.1)
            budget = self._pending_budget
            if budget is not None:
                self._pending_budget = None
                self._apply_budget(budget)
                next_sample = min(next_sample, self.clock() + self.plan.sample_delay_s)
            # Round up: a sub-millisecond wait truncated to poll(0) would make
            # this loop spin, taking the GIL from the application each time.
            remaining_ms = (min(next_sample, next_report) - self.clock()) * 1000.0
            timeout_ms = math.ceil(remaining_ms) if remaining_ms > 0 else 0
            for item, _ in poller.poll(timeout_ms):
                if item == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                else:
                    self._receive(sock)
        # Leaving: the last counts and a bye, best effort and never blocking.
        if self._hello_sent:
            self._report(sock)
        with contextlib.suppress(Exception):
            self._send(sock, protocol.BYE, {"agent": self.agent_id, "reason": self._bye_reason})

    def _jitter(self, mean: float, spread: float = 0.25) -> float:
        # A gaussian around the planned mean so samples never lock step with a
        # periodic application (DYPER section 4).
        return max(mean * 0.1, self._rng.gauss(mean, mean * spread))

    def _apply_budget(self, budget: float) -> None:
        if self.ceiling is not None:
            budget = min(budget, self.ceiling)
        self.budget = budget
        self.guard.set_budget(budget, self.clock())
        self._replan()

    def _replan(self) -> None:
        self.plan = plan(self.budget, self.sample_cost_s, self.report_cost_s)

    # --- sampling (the hot path) --------------------------------------------------

    def sample(self) -> None:
        """Record one snapshot of every thread's Python stack.

        Runs with the GIL held, so every application thread is paused while
        it runs: keep it tight. Stacks are recorded leaf first as walked;
        the monitor reverses them once. The C walker, when it was built,
        does the same without creating frame objects.
        """
        if _fast is not None:
            _fast.sample(self.counts, self.tables.locs, self.tables.new_loc, self._ident)
        else:
            self._sample_python()
        self.samples_in_window += 1
        if len(self.counts) > MAX_PENDING_STACKS:
            # The monitor has been away long enough to fill the table: drop
            # these samples (counted) rather than grow without bound.
            self.dropped["samples"] += sum(self.counts.values())
            self.counts.clear()
        if self.tables.full():
            self._restart_tables()

    def _sample_python(self) -> None:
        locs = self.tables.locs
        new_loc = self.tables.new_loc
        counts = self.counts
        me = self._ident
        for tid, frame in sys._current_frames().items():
            if tid == me:
                continue
            stack: list[int] = []
            push = stack.append
            f: FrameType | None = frame
            while f is not None:
                code = f.f_code
                # One int instead of a tuple: user-space addresses fit in 48
                # bits, so the instruction offset above them keeps keys unique.
                key = (f.f_lasti << 48) | id(code)
                loc = locs.get(key)
                if loc is None:
                    loc = new_loc(key, code, f.f_lasti, f.f_lineno)
                push(loc)
                f = f.f_back
            k = (tid, tuple(stack))
            counts[k] = counts.get(k, 0) + 1

    def _restart_tables(self) -> None:
        self.dropped["samples"] += sum(self.counts.values())
        self.counts.clear()
        self.tables.restart()

    # --- reports and messages ------------------------------------------------------

    def _thread_names(self) -> list[list[int | str]]:
        active = threading._active  # type: ignore[attr-defined]  # read-only, no lock needed
        tids = {tid for tid, _ in self.counts}
        names: list[list[int | str]] = []
        for tid in tids:
            thread = active.get(tid)
            names.append([tid, thread.name if thread is not None else f"thread-{tid}"])
        return names

    def _report(self, sock: zmq.Socket[Any]) -> None:
        t0 = time.perf_counter()
        now = self.clock()
        self.tables.flag_leaves({stack[0] for _, stack in self.counts if stack})
        strings, locs = self.tables.unsent()
        body: dict[str, Any] = {
            "agent": self.agent_id,
            "seq": self.seq,
            "epoch": self.tables.epoch,
            "t": time.time(),
            "window_s": now - self._window_start,
            "strings": strings,
            "locs": locs,
            "stacks": [[tid, n, list(stack)] for (tid, stack), n in self.counts.items()],
            "samples": self.samples_in_window,
            "threads": self._thread_names(),
            # this window's sampling and earlier reports; this report's own cost goes in the next
            "costs": dict(self._window_costs),
            "spent_s": self.guard.spent_s,
            "elapsed_s": now - self.guard.started,
            "budget": self.budget,
            "delays": {"sample": self.plan.sample_delay_s, "report": self.plan.report_delay_s},
            "dropped": dict(self.dropped),
            "errors": self.errors[-10:],
        }
        sent = self._send(sock, protocol.REPORT, body)
        if sent:
            self.seq += 1
            self.tables.mark_sent(self.tables.sent_strings + len(strings), self.tables.sent_locs + len(locs))
            self.counts.clear()
            self.samples_in_window = 0
            self._window_start = now
            self._window_costs = {"sample": 0.0, "report": 0.0, "detail": 0.0}
            self.errors.clear()
        else:
            # Keep the counts: they go out with the next report that gets through.
            self.dropped["reports"] += 1
        spent = time.perf_counter() - t0
        self.max_op_s = max(self.max_op_s, spent)
        self._window_costs["report"] += spent
        self.guard.charge(spent, self.clock())
        self.report_cost_s += EWMA_ALPHA * 4 * (spent - self.report_cost_s)
        self._replan()

    def _send(self, sock: zmq.Socket[Any], msg_type: str, body: dict[str, Any]) -> bool:
        try:
            sock.send(protocol.encode(msg_type, body), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except ValueError as exc:  # too large: drop what we hold, keep going
            self.errors.append(str(exc))
            self._restart_tables()
            return False

    def _send_hello(self, sock: zmq.Socket[Any]) -> bool:
        if self._hello is None:
            self._hello = self._hello_body()
        self._hello["budget"] = self.budget
        return self._send(sock, protocol.HELLO, self._hello)

    def _hello_body(self) -> dict[str, Any]:
        import sysconfig  # only here: hello is built once and sysconfig is not free to import

        body: dict[str, Any] = {
            "agent": self.agent_id,
            "host": socket.gethostname(),
            "pid": self.pid,
            "start_time": _process_start_time(),
            "argv": _argv(),
            "python": sys.version.split()[0],
            "executable": sys.executable or "",
            "paths": {k: v for k, v in sysconfig.get_paths().items() if isinstance(v, str)},
            "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
            "budget": self.budget,
            "agent_version": AGENT_VERSION,
            "capabilities": ["cpu"],
        }
        if self.attach_token:
            body["attach_token"] = self.attach_token
        if self.ceiling is not None:
            body["ceiling"] = self.ceiling
        return body

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        for _ in range(64):  # bounded: a flood of control messages cannot starve sampling
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                msg_type, body = protocol.decode(data, protocol.AGENT_ACCEPTS)
            except protocol.DecodeError:
                self.dropped["bad_messages"] += 1
                continue
            if msg_type == protocol.DETACH:
                self._bye_reason = "detach"
                self._stopping.set()
            elif msg_type == protocol.RESYNC:
                self.tables.resend_all()
                self._hello_sent = self._send_hello(sock)
                if self._hello_sent:
                    self._report(sock)
            elif msg_type == protocol.CONFIGURE:
                budget = body.get("budget")
                if isinstance(budget, int | float) and 0 < budget <= 0.5:
                    self._apply_budget(float(budget))
