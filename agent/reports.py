"""Reports and the hello: when each is next due, what every message carries, and what sending costs.

Every send is non-blocking; a report that cannot go keeps its counts and
marks for the next one that gets through.
"""

from __future__ import annotations

import math
import os
import random
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import zmq

from dyper.agent import procfs, protocol
from dyper.agent.budget import MIN_REPORT_DELAY_S
from dyper.agent.ledger import EWMA_ALPHA, Ledger
from dyper.agent.proflet import Collector, ReportContext
from dyper.agent.sampling import Counts, jitter
from dyper.agent.tables import Tables
from dyper.agent.watchdog import HookCaller, our_threads

AGENT_VERSION: Final = "0.1.0"

#: Starting guess until the first measurements come in; deliberately high so
#: the first plan errs on the side of spending less.
INITIAL_REPORT_COST_S: Final = 2e-3
#: How often to retry the hello while no monitor has accepted the connection.
HELLO_RETRY_S: Final = 0.5
#: The first retry, doubling up to HELLO_RETRY_S, each with a wake-up of its
#: own: the first hello usually goes before the connection is up, and
#: waiting for the next sample or report to retry kept a just-attached agent
#: unknown to the monitor for 0.5 to 1 s. Later retries ride on the loop's
#: other wake-ups, so no monitor at all costs no extra wake-ups.
HELLO_FIRST_RETRY_S: Final = 0.01
#: Marks (agent.mark, pause, resume, reset, boost) kept for the next report; older ones are dropped and counted.
MAX_PENDING_MARKS: Final = 256
#: While paused, reports (which tell the monitor the agent is alive and paused) go at most this often.
PAUSED_REPORT_S: Final = 10.0

Message = protocol.Hello | protocol.Report | protocol.Bye | protocol.Error


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


def hello_body(
    *,
    agent_id: str,
    pid: int,
    paths: dict[str, str],
    budget: float,
    capabilities: list[str],
    sampler: dict[str, str],
    attach_token: str | None,
    ceiling: float | None,
) -> protocol.Hello:
    """Who we are: the process, the interpreter, the budget and what the agent can do here."""
    body: protocol.Hello = {
        "agent": agent_id,
        "host": socket.gethostname(),
        "pid": pid,
        # the monitor groups a master and the workers it forked into one service by this
        "ppid": os.getppid(),
        "start_time": _process_start_time(),
        "argv": _argv(),
        "python": sys.version.split()[0],
        "executable": sys.executable or "",
        "paths": paths,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        "budget": budget,
        "agent_version": AGENT_VERSION,
        "capabilities": capabilities,
        "sampler": sampler,
    }
    if attach_token:
        body["attach_token"] = attach_token
    service = os.environ.get("DYPER_SERVICE", "").strip()
    if service:
        body["service"] = service[:200]
    if ceiling is not None:
        body["ceiling"] = ceiling
    return body


def thread_names(tids: set[int]) -> list[list[int | str]]:
    active = threading._active  # type: ignore[attr-defined]  # read-only, no lock needed
    main = procfs.main_ident()
    names: list[list[int | str]] = []
    for tid in tids:
        thread = active.get(tid)
        if thread is not None:
            names.append([tid, thread.name])
        else:
            # the main thread of a program that never imported threading (dyper attach)
            names.append([tid, "MainThread" if tid == main else f"thread-{tid}"])
    return names


class Reports:
    """The report window, the hello, the marks waiting to go, and the collectors' report pass.

    Its state belongs to the sampler thread, but for :meth:`mark`, which any thread may call.
    """

    def __init__(
        self,
        ledger: Ledger,
        call: HookCaller,
        switch_off: Callable[[str, BaseException], None],
        *,
        agent_id: str,
        tables: Tables,
        errors: list[str],
        dropped: dict[str, int],
        rng: random.Random,
        restart_tables: Callable[[], None],
        window_start: float,
    ) -> None:
        self._ledger = ledger
        self._call = call
        self._switch_off = switch_off
        self._agent_id = agent_id
        self._tables = tables
        self._errors = errors
        self._dropped = dropped
        self._rng = rng
        #: what a send too large for the protocol does: drop what we hold
        self._restart_tables = restart_tables
        self.seq = 0
        #: when the current report window began
        self.window_start = window_start
        #: what one report costs (its encoding and sending, and the ticker's wake-ups it causes)
        self.cost_s = INITIAL_REPORT_COST_S
        #: the loop's wake-ups since the last report, with the ticker part of a report's cost
        self.wakes_s = 0.0
        #: the mean delay between reports in force (set by the agent's plan)
        self.delay_s = 0.0
        self.next_report = math.inf
        self.hello_sent = False
        #: the hello as last built (None: the agent builds it afresh before the next goes)
        self.hello: protocol.Hello | None = None
        self._hello_wait = HELLO_FIRST_RETRY_S
        self._next_hello = math.inf
        #: [wall time, name, kind] from any thread, for the next report; kind is mark, pause, resume,
        #: reset or boost. A deque: append and popleft are atomic, so a mark made while the sampler
        #: drains is never lost, and the oldest go first past the limit.
        self.marks: deque[list[Any]] = deque(maxlen=MAX_PENDING_MARKS)
        #: marks drained into a report that could not go (the sampler's own)
        self._unsent_marks: list[list[Any]] = []
        #: those whose report hook (or basic_cost_s) is overridden (only those are called)
        self.collectors: list[Collector] = []
        #: per collector: its basic_cost_s() already charged
        self._basic_charged: dict[str, float] = {}

    # --- when ---------------------------------------------------------------------

    def begin(self, now: float) -> None:
        """The loop starts (or a replacement's does): the first report and the first hello retry are due."""
        # The first report within a second, whatever the budget: the views show
        # the process and the monitor plans with its measured costs. At 0.1%
        # the planned delay is 30 s, and a short run reported nothing until it ended.
        self.next_report = now + min(self.delay_s, MIN_REPORT_DELAY_S)
        self._hello_wait = HELLO_FIRST_RETRY_S
        self._next_hello = now + self._hello_wait

    def next_due(self) -> float:
        """The next report, or the next quick hello retry (later retries ride on the other wake-ups)."""
        retrying = not self.hello_sent and self._hello_wait < HELLO_RETRY_S
        return min(self.next_report, self._next_hello if retrying else math.inf)

    def hello_due(self, now: float) -> bool:
        return not self.hello_sent and now >= self._next_hello

    def hello_retried(self, sent: bool, now: float) -> None:
        # Until the connection is up the hello cannot go; reports wait
        # for it, their counts keep accumulating meanwhile.
        self.hello_sent = sent
        self._hello_wait = min(2 * self._hello_wait, HELLO_RETRY_S)
        self._next_hello = now + self._hello_wait

    def report_due(self, now: float) -> bool:
        return now >= self.next_report

    def reschedule(self, paused: bool) -> None:
        """The next report one (jittered) delay from now; rarely while paused."""
        # Rescheduled even when no report could go (no monitor yet),
        # or the loop would wake at once, again and again.
        delay = max(self.delay_s, PAUSED_REPORT_S) if paused else self.delay_s
        self.next_report = self._ledger.clock() + jitter(self._rng, delay, spread=0.1)

    def due_by(self, at: float) -> None:
        """The next report no later than ``at``."""
        self.next_report = min(self.next_report, at)

    def due_now(self, now: float) -> None:
        self.next_report = now

    # --- messages -----------------------------------------------------------------

    def send(self, sock: zmq.Socket[Any], msg_type: str, body: Message) -> bool:
        try:
            sock.send(protocol.encode(msg_type, body), zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False
        except ValueError as exc:  # too large: drop what we hold, keep going
            self._errors.append(str(exc))
            self._restart_tables()
            return False

    def mark(self, name: str, kind: str) -> None:
        """Put a labelled point on the timeline, from any thread: it goes with the next report."""
        if len(self.marks) == MAX_PENDING_MARKS:
            self._dropped["marks"] += 1  # the deque drops the oldest
        self.marks.append([time.time(), str(name)[: protocol.MAX_MARK_CHARS], kind])

    def take_marks(self) -> list[list[Any]]:
        """The marks for the report about to go: those a failed send kept, then the new ones."""
        marks = self._unsent_marks
        while self.marks:
            marks.append(self.marks.popleft())
        del marks[:-MAX_PENDING_MARKS]
        return marks

    def counts_body(self, counts: Counts, samples: int, t: float, window_s: float) -> protocol.Report:
        """A report's required part: ``counts`` (less our own threads'), with the table entries they need."""
        # The samplers skip only the sampler thread: our other threads' stacks are left out here.
        ours = our_threads()
        kept = [(tid, n, stack) for (tid, stack), n in counts.items() if tid not in ours]
        self._tables.flag_leaves({stack[0] for _, _, stack in kept if stack})
        strings, locs = self._tables.unsent()
        return {
            "agent": self._agent_id,
            "seq": self.seq,
            "epoch": self._tables.epoch,
            "t": t,
            "window_s": window_s,
            "strings": strings,
            "locs": locs,
            "stacks": [[tid, n, list(stack)] for tid, n, stack in kept],
            "samples": samples,
            "threads": thread_names({tid for tid, _, _ in kept}),
        }

    def went(self, window_start: float) -> None:
        """A report went: the next one starts its window at ``window_start`` and its table entries afresh."""
        self.seq += 1
        self._tables.mark_sent()
        self.window_start = window_start

    def marks_went(self) -> None:
        self._unsent_marks = []

    def collector_data(self, ctx: ReportContext) -> dict[str, Any]:
        """The report pass: each collector's data, and the always-on hooks' cost charged as it grew."""
        data: dict[str, Any] = {}
        for collector in list(self.collectors):
            try:
                out = self._call(collector.name, collector.report, ctx)
                basic = self._call(collector.name, collector.basic_cost_s)
            except Exception as exc:
                self._switch_off(collector.name, exc)
                continue
            if out is not None:
                data[collector.name] = out
            # Always-on hooks on the application's threads: charged as they grow.
            grew = basic - self._basic_charged.get(collector.name, 0.0)
            if grew > 0:
                self._basic_charged[collector.name] = basic
                self._ledger.charge("basic", grew)
        return data

    def charge(self, spent: float) -> None:
        """What this report cost, with the wake-ups since the last: charged, and the moving average follows."""
        self._ledger.operation(spent)
        self._ledger.charge("report", spent)
        self.cost_s += EWMA_ALPHA * 4 * (spent + self.wakes_s - self.cost_s)
        self.wakes_s = 0.0
