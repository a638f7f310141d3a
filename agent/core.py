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
  reports it to the monitor and, if it cannot go on, stops cleanly;
* no proflet can stall it: a second daemon thread, ``dyper-watchdog``, gives
  up a sampler thread stuck in a collector hook, switches that proflet off
  and starts a replacement sampler thread (see agent.watchdog).

The sampler thread's work is split among subsystems, each owning its state
and saying when it is next due; :meth:`Agent._serve` is the loop that runs
what is due and sleeps until the earliest of them:

* :mod:`agent.sampling`: the stack samples (the agent's thread, the C ticker
  or the native sampler), their subscribers and their measured cost;
* :mod:`agent.polls`: the collectors' own sampling passes;
* :mod:`agent.bursts`: detailing, its calibrated costs and its scheduler;
* :mod:`agent.reports`: the report window, the hello, marks, and sending;
* :mod:`agent.control`: what the application and the monitor ask for;
* :mod:`agent.events`: the triggers' checks and the events they fire;
* :mod:`agent.watchdog`: the hooks in progress and the thread that watches them.

All of them pay through one :class:`agent.ledger.Ledger`. What reads across
them (the plan, a report's body, pause and budget changes) stays here.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import zmq

from dyper.agent import procfs, protocol
from dyper.agent.budget import (
    MIN_REPORT_DELAY_S,
    MIN_SAMPLE_DELAY_S,
    MIN_THREAD_SAMPLE_DELAY_S,
    Guard,
    Plan,
    ProfletCosts,
    plan,
)
from dyper.agent.bursts import BURST_SLACK_S as BURST_SLACK_S  # tests read it here
from dyper.agent.bursts import Burst, Bursts
from dyper.agent.control import CONTROL_BATCH, Control
from dyper.agent.control import RESYNC_MIN_S as RESYNC_MIN_S  # tests read it here
from dyper.agent.events import Events
from dyper.agent.ledger import EWMA_ALPHA, Clock, Ledger, fresh_window, weakly
from dyper.agent.ledger import cost_clock as _cost_clock
from dyper.agent.lifeline import Lifeline
from dyper.agent.polls import Polls
from dyper.agent.proflet import Collector, ReportContext
from dyper.agent.reports import MAX_PENDING_MARKS, Reports, hello_body
from dyper.agent.sampling import MAX_PENDING_STACKS as MAX_PENDING_STACKS  # tests read it here
from dyper.agent.sampling import TICKER_DRAIN_AT as TICKER_DRAIN_AT  # tests read it here
from dyper.agent.sampling import Sampling, count_pending, fast, jitter, sample_python
from dyper.agent.schedule import DetailScheduler
from dyper.agent.tables import Tables, forget_decoded
from dyper.agent.triggers import DEFAULT_RAISED_MAX, Fired, Triggers, TriggerSpec
from dyper.agent.watchdog import (
    HUNG_THREAD_NAME,
    Abandoned,
    HookCall,
    Watchdog,
    interrupt,
    name_os_thread,
    our_threads,
)
from dyper.agent.watchdog import (
    STOP_HANG_S as STOP_HANG_S,  # tests read it here, with the agent's other limits
)

#: the optional C walker (agent/_fastsample.c), None where it was not built: tests read it here
_fast: Any = fast

THREAD_NAME: Final = "dyper-sampler"

#: Reports ZeroMQ may hold for a connected but slow monitor before sends fail.
SEND_HWM: Final = 8
#: Largest message taken from the monitor (a configure with its plan is well under 1 KiB).
MAX_RECEIVED_BYTES: Final = 1 << 20
#: how long the last report and the bye may take to leave when the agent stops (ms);
#: stop() waits about twice as long at interpreter exit
CLOSE_LINGER_MS: Final = 400
#: An agent stopped this soon after its start may still be connecting: its stop waits for
#: the connection (at most CLOSE_LINGER_MS) so that its hello, counts and bye get out.
SHORT_LIFE_S: Final = 1.0

#: How often the plan follows the measured costs, monitor or not.
REPLAN_S: Final = 1.0
#: Proflets whose collectors run by default: every built-in one (the
#: registry's, :data:`dyper.proflets.BUILTINS`; a test holds them equal), the
#: scheduler choosing within the budget which details when. Installed
#: third-party proflets run when named or with "all". One part runs only when
#: named, saying so in the report: cpu detailing on 3.11 without the C
#: extension, through yappi, which puts every thread on the eval loop's slow
#: path (a burst halves a busy process's speed, whatever its length).
DEFAULT_PROFLETS: Final = ("cpu", "threads", "timing", "heap", "io", "memory", "memory_stacks", "tasks")


def _load_collectors(names: tuple[str | Collector, ...] | None, off: dict[str, str]) -> dict[str, Collector]:
    """Build the collectors of ``names`` (None: every registered proflet).

    ``names`` may hold the entries ``--proflets`` takes (``all``, ``-heap``,
    ``+io``: :func:`proflets.select`); every proflet chosen so is named, so
    those that run only when named (cpu detailing through yappi on 3.11) obey ``all``.
    A proflet that cannot be loaded goes into ``off`` with the reason; the
    others still run.
    """
    from dyper import proflets  # lazy: the registry reads distribution metadata

    # Named: chosen by the user, not the default set (the agent's default argument).
    explicit = names is not None and tuple(names) != DEFAULT_PROFLETS
    if names is not None:
        given = tuple(n for n in names if isinstance(n, Collector))
        names = (
            *proflets.select((n for n in names if isinstance(n, str)), DEFAULT_PROFLETS, proflets.available),
            *given,
        )
    available = proflets.available(None if names is None else [n for n in names if isinstance(n, str)])
    wanted: tuple[str | Collector, ...] = tuple(available) if names is None else names
    collectors: dict[str, Collector] = {}
    for name in wanted:
        if isinstance(name, Collector):  # an instance given by the embedding program (or a test)
            collectors[name.name] = name
            continue
        try:
            module = proflets.load(name, available.get(name, ""), "collector")
            cls = getattr(module, "COLLECTOR", None)
            if cls is None:
                continue  # a monitor-only proflet
            collector = cls()
        except Exception as exc:
            off[name] = f"not loaded: {type(exc).__name__}: {exc}"
            continue
        collector.explicit = explicit
        collectors[name] = collector
    return collectors


class Agent:
    """One agent incarnation: sampler thread, tables, ledger and socket."""

    def __init__(
        self,
        endpoint: str,
        budget: float,
        *,
        attach_token: str | None = None,
        ceiling: float | None = None,
        curve: tuple[bytes, bytes, bytes] | None = None,
        clock: Clock = time.monotonic,
        on_exit: Callable[[Agent], None] | None = None,
        proflets: tuple[str | Collector, ...] | None = DEFAULT_PROFLETS,
        triggers: tuple[TriggerSpec, ...] = (),
        monitor_pid: int | None = None,
    ) -> None:
        self._on_exit = on_exit
        #: the process of a run-scoped monitor (dyper run's, dyper attach's): when it ends, we detach (agent.lifeline)
        self.monitor_pid = monitor_pid
        self._lifeline: Lifeline | None = None
        #: CURVE: (monitor's public key, our public key, our secret key), z85; None: no encryption
        self.curve = curve
        #: no samples, no bursts, no ticker: only a report now and then (see reports.PAUSED_REPORT_S)
        self.paused = False
        self.endpoint = endpoint
        self.ceiling = ceiling
        self.attach_token = attach_token
        self.clock = clock
        self.pid = os.getpid()
        self.agent_id = f"{socket.gethostname()}:{self.pid}:{uuid.uuid4().hex[:12]}"
        self.tables = Tables()
        #: (thread ident, stack of location ids, leaf first) -> samples
        self.counts: dict[tuple[int, tuple[int, ...]], int] = {}
        self.errors: list[str] = []
        self.dropped: dict[str, int] = {"reports": 0, "samples": 0, "bad_messages": 0, "marks": 0}
        self._rng = random.Random()
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        # The subsystems call back into this agent only weakly (see ledger.weakly).
        switch_off = weakly(self._switch_off, None)
        replan = weakly(self._replan, None)
        restart_tables = weakly(self._restart_tables, None)
        # The hang watchdog (agent.watchdog): every collector hook is called through it.
        self.watchdog = Watchdog(
            stopping=self._stopping,
            stopped=self._stopped,
            errors=self.errors,
            planned_s=weakly(self._planned_s, 0.0),
            period_s=weakly(self._report_delay, 0.0),
            handoff_s=weakly(self._handoff_s, 0.0),
            give_up=weakly(self._give_up, None),
        )
        self._call = self.watchdog.call
        now = clock()
        self.ledger = Ledger(Guard(budget, now), clock)
        self.guard = self.ledger.guard
        # Triggers (agent.events): checked by the sampler once a second while any are set.
        self.events = Events(triggers, clock, self.errors)
        #: the stack samples (agent.sampling): the sampler, its subscribers, its cost, its next due time
        self.sampling = Sampling(
            self.ledger,
            self._call,
            switch_off,
            replan,
            tables=self.tables,
            counts=self.counts,
            dropped=self.dropped,
            errors=self.errors,
            rng=self._rng,
            ring=self.events.ring,
            restart_tables=restart_tables,
        )
        #: reports and the hello (agent.reports): when each is due, what they carry, what they cost
        self.reports = Reports(
            self.ledger,
            self._call,
            switch_off,
            agent_id=self.agent_id,
            tables=self.tables,
            errors=self.errors,
            dropped=self.dropped,
            rng=self._rng,
            restart_tables=restart_tables,
            window_start=now,
        )
        self._plan: Plan = plan(budget, self.sampling.sample_cost_s, self.reports.cost_s)
        self._bye_reason = "stop"
        # Proflets. Collectors are built on the sampler thread, at start.
        self._proflet_names = proflets
        #: every running collector
        self.collectors: dict[str, Collector] = {}
        #: the interpreter's install paths (sysconfig), read by start()
        self._paths: dict[str, str] = {}
        #: collectors with their own sampling passes (Collector.poll)
        self.polls = Polls(self.ledger, self._call, switch_off, replan)
        #: CPU seconds of one-time start-up work on the sampler thread (loading the proflets)
        self.startup_s = 0.0
        #: the collectors load_proflets() built, until the sampler hooks them up
        self._loaded: dict[str, Collector] | None = None
        #: proflet name -> why it is off (unavailable here, or its collector raised)
        self.proflets_off: dict[str, str] = {}
        #: detailing (agent.bursts): the proflets' costs, the scheduler, the bursts in progress
        self.bursts = Bursts(
            self.ledger,
            self._call,
            switch_off,
            replan,
            collectors=self.collectors,
            plan=self._plan,
            counts=self.counts,
            tables=self.tables,
            rng=self._rng,
        )
        #: what the application and the monitor ask for (agent.control), the budget in force included
        self.control = Control(
            self.bursts,
            clock=clock,
            budget=budget,
            ceiling=ceiling,
            report_delay_s=weakly(self._report_delay, 0.0),
            replan=replan,
            detach=weakly(self._detach, None),
            dropped=self.dropped,
        )
        #: delays in force: the local plan's, or the monitor's where they spend less
        self.sample_delay_s = self.plan.sample_delay_s
        self.report_delay_s = self.plan.report_delay_s
        self._sock: zmq.Socket[Any] | None = None
        self._collectors_started = False
        self._closing = False
        #: the watchdog has given a sampler thread up and its replacement has not started yet
        self._handing_over = False

    @property
    def plan(self) -> Plan:
        """The plan in force: the local planner's, for the budget in force and the costs measured."""
        return self._plan

    @plan.setter
    def plan(self, new: Plan) -> None:
        self._plan = new
        self.bursts.plan = new  # its detail shares size the bursts

    @property
    def report_delay_s(self) -> float:
        """The mean delay between reports in force: the local plan's, or the monitor's where it spends less."""
        return self.reports.delay_s

    @report_delay_s.setter
    def report_delay_s(self, delay: float) -> None:
        self.reports.delay_s = delay

    @property
    def sample_delay_s(self) -> float:
        """The mean delay between samples in force: the local plan's, or the monitor's where it spends less."""
        return self.sampling.delay_s

    @sample_delay_s.setter
    def sample_delay_s(self, delay: float) -> None:
        self.sampling.delay_s = delay

    @property
    def _ident(self) -> int:
        """The sampler thread's id (see Sampling.ident): the one thread that owns the agent's state."""
        return self.sampling.ident

    @_ident.setter
    def _ident(self, ident: int) -> None:
        self.sampling.ident = ident

    @property
    def budget(self) -> float:
        """The budget in force (a boost's while one runs), under the ceiling."""
        return self.control.budget

    @property
    def triggers(self) -> Triggers | None:
        """The triggers set, if any (agent.triggers)."""
        return self.events.triggers

    # --- control, from any thread ---------------------------------------------------

    def start(self) -> None:
        self.load_proflets()
        # Read here, in the caller's thread: sysconfig imports modules on first use, and
        # a process that forks while our thread holds an import's module lock leaves
        # the child's agent waiting on that lock for good (a pre-fork server forks
        # right after start).
        import sysconfig

        self._paths = {k: v for k, v in sysconfig.get_paths().items() if isinstance(v, str)}
        # Decided before the sampler starts taking the collectors over.
        watched = bool(self._loaded)
        self._thread = threading.Thread(target=self._run, name=THREAD_NAME, daemon=True)
        self._thread.start()
        if watched:
            # Only collectors' hooks can hang the sampler: without them, no watchdog.
            self.watchdog.start()

    @property
    def alive(self) -> bool:
        if self._thread is None or self._stopping.is_set():
            return False
        return self._thread.is_alive() or self._handing_over

    def stop(self, timeout: float = 2.0, reason: str = "stop") -> None:
        """Ask the sampler to send its last report and a bye, then wait for it (at most ``timeout``).

        A sampler stuck in a collector hook is given up by the watchdog within
        STOP_HANG_S and its replacement says goodbye instead.
        """
        self._bye_reason = reason
        self._stopping.set()
        self._wake()
        self.watchdog.poke.set()
        me = threading.get_ident()
        # Neither Thread.join() nor threading.current_thread(): both register a
        # _DummyThread for a foreign caller (the attach bootstrap's thread),
        # which would stay in threading._active for good.
        if self._thread is not None and self._ident != me:
            deadline = time.monotonic() + timeout
            self._stopped.wait(timeout)
            # Read after the wait: a replacement may have taken over meanwhile.
            for thread in (self._thread, self.watchdog.thread):
                while thread is not None and thread.ident != me and thread.is_alive() and time.monotonic() < deadline:
                    time.sleep(0.001)

    def set_budget(self, budget: float) -> None:
        # Read by the sampler thread at its next wake-up; a float store is atomic.
        self.control.pending_budget = budget
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def mark(self, name: str, kind: str = "mark") -> None:
        """Put a labelled point on the timeline: it goes with the next report."""
        self.reports.mark(name, kind)
        triggers = self.events.triggers
        if kind == "mark" and triggers is not None and triggers.wants_marks:
            triggers.marked(str(name))

    def add_trigger(self, spec: TriggerSpec, predicate: Callable[[], object] | None = None) -> None:
        """Check ``spec`` from now on (a predicate trigger calls ``predicate``); the sampler takes it up."""
        self.events.new.append((spec, predicate))
        self._wake()

    def pause(self) -> None:
        """Stop sampling and detailing until :meth:`resume`; the agent stays attached."""
        self.control.pending_pause = True
        self._wake()

    def resume(self) -> None:
        self.control.pending_pause = False
        self._wake()

    def boost(self, budget: float, seconds: float) -> None:
        """Raise the budget to ``budget`` (never past the ceiling) for ``seconds``, then return to the one before.

        A boost never lowers the budget; another boost extends the running one
        from now; a budget change (set_budget, the monitor) ends it.
        """
        self.control.pending_boost = (budget, seconds)
        self._wake()

    def reset(self) -> None:
        """Start the statistics afresh: the monitor's whole-run profile begins here (its history keeps the old)."""
        self.control.pending_reset = True
        self._wake()

    # --- the sampler thread ---------------------------------------------------------

    def _run(self) -> None:
        self._ident = threading.get_ident()
        name_os_thread(THREAD_NAME)
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
            # The monitor sends only small control messages; a bigger frame
            # (a rogue monitor) drops the connection instead of our memory.
            sock.setsockopt(zmq.MAXMSGSIZE, MAX_RECEIVED_BYTES)
            # Only queue to a live connection: with no monitor, sends fail at
            # once and we keep counting locally instead of buffering reports.
            sock.setsockopt(zmq.IMMEDIATE, 1)
            # A refused CURVE handshake (the wrong monitor key) is retried at
            # the first interval, with no backoff: each costs key exchanges.
            sock.setsockopt(zmq.RECONNECT_IVL, 2000 if self.curve is not None else 200)
            sock.setsockopt(zmq.RECONNECT_IVL_MAX, 2000)
            # Heartbeats notice a vanished monitor (SIGKILL, cable) within seconds.
            sock.setsockopt(zmq.HEARTBEAT_IVL, 1000)
            sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
            sock.setsockopt(zmq.ROUTING_ID, self.agent_id.encode())
            if self.curve is not None:
                # The monitor's key pinned: nobody else can complete the handshake.
                sock.curve_serverkey, sock.curve_publickey, sock.curve_secretkey = self.curve
            sock.connect(self.endpoint)
            self._loop(sock)
        except BaseException as exc:  # never let anything reach the application
            if self._owns():  # else the watchdog gave this thread up (Abandoned): leave quietly
                self._failed(sock, exc)
        finally:
            if self._owns():
                with contextlib.suppress(Abandoned):
                    self._finish(ctx, sock)

    def _owns(self) -> bool:
        """Whether the calling thread is the sampler: the one thread that may touch its state and socket."""
        return self._ident == threading.get_ident()

    def _failed(self, sock: zmq.Socket[Any] | None, exc: BaseException) -> None:
        self.errors.append(f"agent stopped by {type(exc).__name__}: {exc}")
        if sock is not None and not self._closing:
            with contextlib.suppress(Exception):
                self.reports.send(sock, protocol.ERROR, {"agent": self.agent_id, "message": self.errors[-1]})

    def _finish(self, ctx: zmq.Context[Any] | None, sock: zmq.Socket[Any] | None) -> None:
        """Leave nothing behind. Run again by a replacement when a collector's close() hung in it."""
        self._closing = True
        self._sock = None
        if sock is not None:
            # The last report and the bye are only queued by send(): give
            # them a bounded moment to leave (with no monitor connected,
            # IMMEDIATE kept them from being queued, so this never waits).
            with contextlib.suppress(Exception):
                sock.close(linger=CLOSE_LINGER_MS if self._stopping.is_set() else 0)
        if ctx is not None:
            with contextlib.suppress(Exception):
                ctx.term()
        if self._lifeline is not None:
            self._lifeline.close()
        while self.collectors:
            # Out of the table before the call: a close() that hangs is not called twice.
            name, collector = self.collectors.popitem()
            with contextlib.suppress(Exception):
                self._call(name, collector.close)
        if self.sampling.ticker:
            # Before the pipe it writes to closes.
            with contextlib.suppress(Exception):
                self.sampling.stop_ticker()
        # Closed once: a descriptor number closed twice may by then be the application's.
        fds, self._wake_r, self._wake_w = (self._wake_r, self._wake_w), -1, -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.counts.clear()
        forget_decoded()
        self._stopping.set()
        self._stopped.set()
        self.watchdog.poke.set()
        if self._on_exit is not None:
            with contextlib.suppress(Exception):
                self._on_exit(self)

    def _loop(self, sock: zmq.Socket[Any]) -> None:
        self._sock = sock
        self._start_collectors()
        self.reports.hello_sent = self._send_hello(sock)
        self._start_ticker()
        self._serve(sock)
        self._leave(sock)

    def _start_ticker(self) -> None:
        sampler = self.sampling.sampler
        self.sampling.start_ticker(self._wake_w)
        if self.sampling.sampler != sampler:
            self.reports.hello = None  # it says which sampler runs

    def _serve(self, sock: zmq.Socket[Any]) -> None:
        """The sampler's loop, until the agent stops: run what is due, then sleep until the next thing is."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        lifeline_fd = self._tie_to_monitor(poller)
        sampling, reports, events = self.sampling, self.reports, self.events
        now = self.clock()
        sampling.begin(now)
        reports.begin(now)
        # The plan's own clock wakes nobody: it follows costs that only the other wake-ups measure.
        next_replan = now + REPLAN_S
        while not self._stopping.is_set():
            # Everything the sampler does between two polls holds the GIL and
            # so stalls a busy application thread: the whole wake-up is
            # charged, the part no operation below accounts for as "wake".
            awake_from = _cost_clock()
            self.ledger.accounted_s = 0.0
            now = self.clock()
            if now >= next_replan or self.control.expired(now):
                self._replan()
                next_replan = now + REPLAN_S
                # With the ticker, samples come in at reports, seconds apart:
                # a thread that started and ended between two would never be
                # seen alive by the collectors that note the threads' names.
                sampling.after_samples(0)
            sampling.run_due(now, self.paused)
            if self.polls.collectors and not self.paused:
                self.polls.run_due(now, self.budget)
            detailing = bool(self.bursts.running)
            if not self.paused and now >= self.bursts.next_due():
                self.bursts.run_due()
                detailing = True
            if events.new:
                events.take_new(now)
            if events.check_due(now, self.paused):
                try:
                    self._check_triggers(sock, now)
                except Exception as exc:  # a bug here must not take sampling down with it
                    events.switch_off(exc)
            if events.ended(now):
                reports.due_now(now)  # the event's window ends with this report
            if reports.hello_due(now):
                reports.hello_retried(self._send_hello(sock), now)
            if reports.report_due(now):
                if self._lifeline is not None and self._lifeline.fd is None and self._lifeline.gone():
                    self._monitor_gone()  # no pidfd to poll: asked here
                if reports.hello_sent:
                    self._report(sock)
                reports.reschedule(self.paused)
            self._take_requests(sock, now)
            wake = self._next_due()
            self._charge_wake(awake_from, detailing)
            # Round up: a sub-millisecond wait truncated to poll(0) would make
            # this loop spin, taking the GIL from the application each time.
            remaining_ms = (wake - self.clock()) * 1000.0
            timeout_ms = math.ceil(remaining_ms) if remaining_ms > 0 else 0
            for item, _ in poller.poll(timeout_ms):
                if item == self._wake_r:
                    with contextlib.suppress(OSError):
                        os.read(self._wake_r, 512)
                elif item == lifeline_fd:
                    self._monitor_gone()
                else:
                    self._receive(sock)

    def _next_due(self) -> float:
        """When the loop must wake next: the earliest of what each subsystem says (paused, only what still runs)."""
        paused = self.paused
        return min(
            self.sampling.next_due(),
            self.reports.next_due(),
            self.bursts.next_due() if not paused else math.inf,
            self.control.next_due(),
            self.polls.next_due() if not paused else math.inf,
            self.events.next_due(paused),
        )

    def _take_requests(self, sock: zmq.Socket[Any], now: float) -> None:
        """Apply what the application or the monitor asked for since the last wake-up."""
        control, sampling, reports = self.control, self.sampling, self.reports
        boost = control.pending_boost
        if boost is not None:
            control.pending_boost = None
            raised, seconds = boost
            self._apply_budget(control.boost(self.clock(), raised, seconds))
            self.mark(f"boost to {100 * self.budget:g}% for {seconds:g} s", "boost")
            sampling.hurry(self.clock() + self.sample_delay_s)
        elif control.boost_over(now):
            self._apply_budget(control.boost_base)
            self.mark(f"boost over: back to {100 * self.budget:g}%", "boost")
        budget = control.pending_budget
        if budget is not None:
            control.pending_budget = None
            control.boost_until = None  # the budget the user or the monitor sets now stands
            self._apply_budget(budget)
            sampling.hurry(self.clock() + self.sample_delay_s)
            # The views should show the new budget soon, not after a report
            # interval planned for the old one.
            reports.due_by(self.clock() + self.report_delay_s)
        pause = control.pending_pause
        if pause is not None:
            control.pending_pause = None
            if pause != self.paused:
                self._apply_pause(pause)
                sampling.next_sample = math.inf if pause else self.clock() + self._jitter(self.sample_delay_s)
                # The views should say so within a second.
                reports.due_by(self.clock() + MIN_REPORT_DELAY_S)
        if control.pending_reset:
            control.pending_reset = False
            if reports.hello_sent:
                self._report(sock)  # what came before the reset goes in the old statistics
            self.mark("reset", "reset")
            reports.due_by(self.clock() + MIN_REPORT_DELAY_S)

    def _charge_wake(self, awake_from: float, detailing: bool) -> None:
        """Charge the part of this wake-up no operation accounted for."""
        rest = _cost_clock() - awake_from - self.ledger.accounted_s
        if self.sampling.ticker:
            # This wake-up took the GIL too. Behind a busy thread that is a
            # hand-off: the thread waits for this one to wake up and for
            # itself to wake up again, each about as long as the ticker's
            # measured wake-up lateness on an otherwise idle CPU (the least
            # of its recent ones: the rest is waiting for a CPU, which the
            # application would do anyway). Charged as expected: times the
            # share of ticks that found the GIL held.
            rest += self.sampling.handoff_s
        if rest > 0:
            self.ledger.wake_cost_s += EWMA_ALPHA * (rest - self.ledger.wake_cost_s)
            if detailing:
                # Detailing's wake-ups (its ticks, starts and ends) are in
                # a burst's price: spread over the samples they would make
                # sampling look several times dearer at a low budget.
                self.ledger.charge("detail", rest)
            else:
                self.ledger.charge("wake", rest)
                if self.sampling.ticker:
                    # The ticker samples without this loop: what wakes it
                    # is reports, the messages that answer them and the
                    # drains before them. Spread over the samples, those
                    # made sampling at 0.1% look five times dearer (one
                    # sample every 2 s); they are the reports' price.
                    self.reports.wakes_s += rest

    def _tie_to_monitor(self, poller: zmq.Poller) -> int | None:
        """Watch a run-scoped monitor's process (see agent.lifeline); the pidfd the poll waits on, if any."""
        if self.monitor_pid is None:
            return None
        if self._lifeline is None:  # a replacement sampler keeps the one it took over
            self._lifeline = Lifeline(self.monitor_pid)
        if self._lifeline.gone():
            self._monitor_gone()
            return None
        if self._lifeline.fd is not None:
            poller.register(self._lifeline.fd, zmq.POLLIN)
        return self._lifeline.fd

    def _monitor_gone(self) -> None:
        """The run-scoped monitor's process ended: nobody will listen again, so detach (as DETACH would)."""
        if not self._stopping.is_set():
            self._bye_reason = "monitor gone"
            self.errors.append(f"the monitor's process {self.monitor_pid} ended: detached")
            self._stopping.set()

    def _leave(self, sock: zmq.Socket[Any]) -> None:
        """End bursts, send the last counts and a bye, best effort and never blocking.

        Run again by a replacement when a hook hung in it: what was done is not redone.
        """
        if self.sampling.ticker:
            self.sampling.stop_ticker()
        for name in list(self.bursts.running):
            self.bursts.stop(name, self.clock())
        reports = self.reports
        if not reports.hello_sent:
            # A short life (start, then stop at once): the connection may be up only now,
            # or in a moment (on a loaded machine, 20 lives of a few ms each all ended
            # before theirs was). Without a hello the monitor would drop the last counts
            # and ignore the bye. Waited for as long as the close lingers, and only after
            # a short life: after a longer one nobody is listening (no exit made slower).
            with contextlib.suppress(Exception):
                if self._stopping.is_set() and self.clock() - self.guard.started < SHORT_LIFE_S:
                    sock.poll(CLOSE_LINGER_MS, zmq.POLLOUT)
                reports.hello_sent = self._send_hello(sock)
        if reports.hello_sent:
            self._report(sock)
        with contextlib.suppress(Exception):
            reports.send(sock, protocol.BYE, {"agent": self.agent_id, "reason": self._bye_reason})

    def _planned_s(self, name: str) -> float:
        return self.bursts.planned_s(name)

    def _report_delay(self) -> float:
        return self.report_delay_s

    def _handoff_s(self) -> float:
        return self.sampling.handoff_s

    def _detach(self) -> None:
        """The monitor asked us to leave."""
        self._bye_reason = "detach"
        self._stopping.set()

    def _jitter(self, mean: float, spread: float = 0.25) -> float:
        return jitter(self._rng, mean, spread)

    # --- the budget, pause and the plan -------------------------------------------------

    def _apply_budget(self, budget: float) -> None:
        budget = self.control.under_ceiling(budget)
        lower = budget < self.budget
        self.control.budget_changed(budget)
        now = self.clock()
        self.guard.set_budget(budget, now)
        if lower:
            # A running burst was sized and reserved for the old budget: left
            # to run, it spends under the new one what only the old allowed.
            self.bursts.stop_all(now)
        self._replan()

    def _apply_pause(self, pause: bool) -> None:
        """Pause: end the bursts and stop the ticker, so that nothing runs in the application's threads. Or resume."""
        now = self.clock()
        if pause:
            self.bursts.stop_all(now)
            self.sampling.pause()
            self.paused = True
            self._pause_collectors(True)
            self.mark("pause", "pause")
        else:
            self.paused = False
            self._pause_collectors(False)
            sampler = self.sampling.sampler
            self.sampling.resume(self._wake_w)
            if self.sampling.sampler != sampler:
                self.reports.hello = None  # it says which sampler runs
            self.bursts.look_now()
            self.mark("resume", "resume")

    def _pause_collectors(self, paused: bool) -> None:
        for name, collector in list(self.collectors.items()):
            if type(collector).pause is Collector.pause:
                continue  # hooks not overridden are never called
            try:
                self._call(name, collector.pause, paused)
            except Exception as exc:
                self._switch_off(name, exc)

    def _replan(self) -> None:
        now = self.clock()
        # The collectors' own passes pace themselves to a share of the budget:
        # the stack samples are planned with the rest, or the ticker would take
        # every token and the passes would wait for ever.
        polls = min(0.5 * self.budget, self.polls.rate_total())
        self.plan = plan(
            self.budget - polls,
            # With the ticker the loop's wake-ups are spread over the samples
            # each drain brings (Sampling._undrained_s), already in sample_cost_s.
            self.sampling.sample_cost_s + (0.0 if self.sampling.ticker else self.ledger.wake_cost_s),
            self.reports.cost_s,
            self.bursts.fitted_costs(),
            self.sampling.sample_lag_s,
            MIN_SAMPLE_DELAY_S if self.sampling.ticker else MIN_THREAD_SAMPLE_DELAY_S,
        )
        sample, report = self.plan.sample_delay_s, self.plan.report_delay_s
        theirs = self.control.timings(now)
        if theirs is None:
            self.bursts.set_delays(self.plan.detail_delay_s, now)
        else:
            # The monitor decides when to detail (it sends a request per burst);
            # its timings are taken only where they spend no more than ours.
            sample = max(sample, float(theirs.get("sample_delay_s", sample)))
            report = max(report, float(theirs.get("report_delay_s", report)))
            if self.control.monitor_requests:
                self.bursts.hand_over()
            else:
                # Until its first request our own bursts go on, at the slower
                # of the two delays and only for the proflets it details at
                # all: its first plan comes with our first report, and its
                # first request up to a delay later; a short run (or the
                # first seconds of a long one) would otherwise go undetailed.
                wanted = theirs.get("detail_delay_s")
                wanted = wanted if isinstance(wanted, dict) else {}
                self.bursts.set_delays(
                    {
                        name: max(delay, float(wanted[name]))
                        for name, delay in self.plan.detail_delay_s.items()
                        if isinstance(wanted.get(name), int | float)
                    },
                    now,
                )
        self.sample_delay_s, self.report_delay_s = sample, report
        if self.sampling.ticker:
            self.sampling.sync_ticker()

    # --- proflets -----------------------------------------------------------------------

    def load_proflets(self) -> None:
        """Import the proflets and build their collectors; nothing is hooked yet.

        start() runs this on the caller's thread. On the agent's own thread
        each file an import reads would give up the GIL and wait up to a
        switch interval to get it back from a busy application: a program
        started under ``dyper run`` could end before its agent took a sample.
        """
        if self._loaded is not None:
            return
        t0 = _cost_clock()
        try:
            self._loaded = _load_collectors(self._proflet_names, self.proflets_off)
        except Exception as exc:  # a broken registry must not stop the sampler
            self.errors.append(f"proflets not loaded: {type(exc).__name__}: {exc}")
            self._loaded = {}
        for name, collector in list(self._loaded.items()):
            try:
                if collector.unavailable() is None:
                    collector.prepare()
            except Exception as exc:
                self.proflets_off[name] = f"{type(exc).__name__}: {exc}"
                del self._loaded[name]
        self.startup_s += _cost_clock() - t0

    def _start_collectors(self) -> None:
        """Hook up the loaded collectors. A replacement sampler runs it again to finish what a hang interrupted."""
        self.load_proflets()
        t0 = _cost_clock()
        loaded = self._loaded = self._loaded or {}
        if not self._collectors_started:
            self._collectors_started = True
            for name in self.proflets_off:
                self.errors.append(f"proflet {name} off: {self.proflets_off[name]}")
        while loaded:
            name = next(iter(loaded))
            collector = loaded.pop(name)
            try:
                reason = self._call(name, collector.unavailable)
            except Exception as exc:
                reason = f"{type(exc).__name__}: {exc}"
            if reason is not None:
                self.proflets_off[name] = reason
                continue
            self.collectors[name] = collector
            kind = type(collector)
            if kind.sampled is not Collector.sampled:
                self.sampling.subscribers.append(collector)
            if kind.poll is not Collector.poll:
                self.polls.add(collector, self.clock())
            # The report pass also charges the always-on hooks' cost: a collector with
            # hooks but nothing to report must still be in it, or they go uncharged.
            if kind.report is not Collector.report or kind.basic_cost_s is not Collector.basic_cost_s:
                self.reports.collectors.append(collector)
            if collector.WANTS_ACTIVITY:
                self.sampling.want_activity()
            if collector.DETAILS:
                try:
                    kinds = self._call(name, collector.burst_kinds)
                    by_kind = {kind: self._call(name, collector.kind_costs, kind) for kind in kinds}
                except Exception as exc:
                    self._switch_off(name, exc)
                    continue
                self.bursts.add(name, by_kind)
        self.bursts.scheduler.queue.allows = {name: self.collectors[name].ALLOWS for name in self.bursts.proflet_costs}
        # Loading is start-up, like importing the agent itself: one-time
        # imports (tens of ms of CPU), paid once per attach. Charging it to a
        # 1% budget would stop sampling for seconds; it is reported instead
        # (startup_s), so the user sees it.
        self.startup_s += _cost_clock() - t0
        self._replan()

    def _switch_off(self, name: str, why: BaseException | str) -> None:
        """A collector raised or hung: it is done for this run; nothing reaches the application."""
        collector = self.collectors.pop(name, None)
        self.sampling.subscribers = [c for c in self.sampling.subscribers if c is not collector]
        self.polls.forget(name, collector)
        self.reports.collectors = [c for c in self.reports.collectors if c is not collector]
        self.bursts.forget(name)
        reason = why if isinstance(why, str) else f"{type(why).__name__}: {why}"
        self.proflets_off[name] = reason
        self.errors.append(f"proflet {name} switched off: {reason}")
        if collector is not None:
            with contextlib.suppress(Exception):
                self._call(name, collector.close)

    # --- the hang watchdog (agent.watchdog) ----------------------------------------

    def _give_up(self, call: HookCall, elapsed: float) -> None:
        """On the watchdog's thread: the sampler thread is stuck in ``call``; a replacement carries on."""
        stuck = self._thread
        try:
            ident = self._ident
            self._handing_over = True
            self._ident = 0  # from here on, the stuck thread owns nothing
            cpu_s = max(0.0, (procfs.thread_cpu_s(call.native) or call.cpu0) - call.cpu0)
            call.interrupted = interrupt(ident, Abandoned)
        finally:
            call.settled = True
        if stuck is not None:
            stuck.name = HUNG_THREAD_NAME
            native = stuck.native_id
            with contextlib.suppress(OSError), open(f"/proc/self/task/{native}/comm", "w") as f:
                f.write(HUNG_THREAD_NAME)
        replacement = threading.Thread(target=self._resume, args=(call, elapsed, cpu_s), name=THREAD_NAME, daemon=True)
        try:
            replacement.start()
        except RuntimeError:  # no thread can be started: this one carries on as the sampler
            self._resume(call, elapsed, cpu_s)

    def _resume(self, call: HookCall, elapsed: float, cpu_s: float) -> None:
        """A replacement sampler thread: switch the hung proflet off and carry on where the last one stopped."""
        self._ident = threading.get_ident()
        self._thread = threading.current_thread()
        self._handing_over = False
        name_os_thread(THREAD_NAME)
        sock = self._sock
        ctx = sock.context if sock is not None else None
        try:
            try:
                self._hung(call, elapsed, cpu_s)
                if not self._closing and sock is not None:
                    if not self._stopping.is_set():
                        self._start_collectors()
                        self._start_ticker()
                        self._serve(sock)
                    self._leave(sock)
            except Abandoned:
                raise
            except BaseException as exc:  # never let anything reach the application
                self._failed(sock, exc)
            self._finish(ctx, sock)
        except Abandoned:
            pass  # hung again, in another hook: a newer replacement carries on

    def _hung(self, call: HookCall, elapsed: float, cpu_s: float) -> None:
        self._switch_off(call.name, f"hung: {call.hook}() ran for {elapsed:.1f} s (limit {call.limit_s:.1f} s)")
        if cpu_s > 0:
            # A spinning hook held the GIL as it ran: the application's time.
            self.ledger.charge("hung", cpu_s)
            self.ledger.max_op_s = max(self.ledger.max_op_s, cpu_s)

    # --- the tables' bounds ---------------------------------------------------------

    def _restart_tables(self) -> None:
        self.dropped["samples"] += sum(self.counts.values())
        self.counts.clear()
        self.events.ring.clear(self.clock())  # its counts are of the old epoch
        self.bursts.heat.clear()  # its keys are location ids of the old epoch
        self.sampling.pending.clear()  # so are these
        self.tables.restart()

    # --- reports and messages ------------------------------------------------------

    def _report(self, sock: zmq.Socket[Any], split_at: float | None = None) -> None:
        """Send the window's counts; with ``split_at``, what came before it first, as a report of its own."""
        sampling, reports, ledger, guard = self.sampling, self.reports, self.ledger, self.guard
        if sampling.ticker:
            sampling.ticker_step(drain=True)
        t0 = _cost_clock()
        now = self.clock()
        if split_at is not None:
            self._send_before(sock, split_at, now)
        watched = self.watchdog.unpaid_s()
        if watched > 0:  # the watchdog's wake-ups since the last report
            ledger.charge("watchdog", watched, now)
        guard.tokens(now)  # brings allowed_s up to now
        body = reports.counts_body(self.counts, sampling.samples_in_window, time.time(), now - reports.window_start)
        body.update(
            {
                # this window's sampling and earlier reports; this report's own cost goes in the next
                "costs": dict(ledger.window),
                # what one sample and one report cost, as our own plan has them (the
                # monitor plans with these: only we know which wake-ups are whose)
                "unit_costs": {"sample": sampling.sample_cost_s, "report": reports.cost_s},
                "spent_s": guard.spent_s,
                "allowed_s": guard.allowed_s,
                "startup_s": self.startup_s,
                "elapsed_s": now - guard.started,
                "budget": self.budget,
                "delays": {
                    "sample": self.sample_delay_s,
                    "report": self.report_delay_s,
                    "sample_lag": sampling.sample_lag_s,
                    **{f"detail.{name}": d for name, d in self.plan.detail_delay_s.items() if not math.isinf(d)},
                },
                "dropped": dict(self.dropped),
                "errors": self.errors[-10:],
                "mode": "monitor" if self.control.monitor_plan is not None else "local",
                "proflets": self._proflet_states(),
                "details": self.bursts.done,
                "paused": self.paused,
                "sampler": {"name": sampling.sampler, "why": sampling.sampler_why},
            }
        )
        marks = reports.take_marks()
        if marks:
            body["marks"] = marks
        if self.events.fired:
            body["triggers"] = self.events.fired[-MAX_PENDING_MARKS:]
        if reports.collectors:
            body["data"] = reports.collector_data(self._report_context(now - reports.window_start))
            # with the always-on hooks' cost, charged just now: in the ledger's
            # lines and in its total, or the last report's overhead would miss it
            body["costs"] = dict(ledger.window)
            body["spent_s"] = guard.spent_s
        if reports.send(sock, protocol.REPORT, body):
            self.bursts.cool()
            self.bursts.done = []
            reports.went(now)
            self.counts.clear()
            sampling.samples_in_window = 0
            ledger.window = fresh_window()
            self.errors.clear()
            reports.marks_went()
            self.events.fired = []
            self.events.ring.clear(now)
        else:
            # Keep the counts and marks: they go out with the next report that gets through.
            self.dropped["reports"] += 1
        reports.charge(_cost_clock() - t0)
        self._replan()

    def _send_before(self, sock: zmq.Socket[Any], split_at: float, now: float) -> None:
        """Send what the ring says was counted before ``split_at`` as a report of its own.

        So the monitor's window of a trigger's event begins where the event's
        "before" does, not where the agent's report window happened to.
        The window's costs are shared by time; proflet data and marks stay with
        the report that follows.
        """
        sampling, reports = self.sampling, self.reports
        part = self.events.ring.since(split_at, self.counts, sampling.samples_in_window)
        if part is None:
            return
        boundary, samples_after, after = part
        earlier = {k: v - after.get(k, 0) for k, v in self.counts.items() if v != after.get(k, 0)}
        # The window's costs, shared by time: the monitor's plot of spending would
        # otherwise show the whole window's at the event.
        share = (boundary - reports.window_start) / max(now - reports.window_start, 1e-9)
        costs = {k: v * share for k, v in self.ledger.window.items()}
        body = reports.counts_body(
            earlier,
            sampling.samples_in_window - samples_after,
            time.time() - (now - boundary),
            boundary - reports.window_start,
        )
        body.update(
            {
                "costs": costs,
                "spent_s": self.guard.spent_s,
                "startup_s": self.startup_s,
                "elapsed_s": boundary - self.guard.started,
                "budget": self.budget,
                "paused": self.paused,
            }
        )
        if reports.send(sock, protocol.REPORT, body):
            reports.went(boundary)
            self.counts.clear()
            self.counts.update(after)
            sampling.samples_in_window = samples_after
            self.ledger.window = {k: v - costs[k] for k, v in self.ledger.window.items()}

    def _report_context(self, window_s: float) -> ReportContext:
        """What the collectors' report hooks may read of this window."""
        rows = self.tables.loc_rows
        return ReportContext(
            window_s=window_s,
            counts=self.counts,
            samples=self.sampling.samples_in_window,
            activity=list(self.sampling.activity or ()),
            loc_flags=lambda loc: rows[loc][5] if 0 <= loc < len(rows) else 0,
            agent_ident=self._ident,
            code_at=self.tables.location,
            epoch=self.tables.epoch,
        )

    def _proflet_states(self) -> dict[str, protocol.ProfletState]:
        """Per proflet: the calibrated costs the monitor plans with, or why it is off."""
        states: dict[str, protocol.ProfletState] = {}
        for c in self.bursts.fitted_costs():
            states[c.name] = {
                "ovhd_ms": c.ovhd_ms,
                "slow": c.slow,
                "itvl_ms": c.itvl_ms,
                "prty": c.prty,
                "allows": sorted(self.collectors[c.name].ALLOWS),
                "detailing": c.name in self.bursts.running,
            }
        for name, reason in self.proflets_off.items():
            states[name] = {"off": reason}
        return states

    def _send_hello(self, sock: zmq.Socket[Any]) -> bool:
        reports = self.reports
        if reports.hello is None:
            reports.hello = self._hello_body()
        reports.hello["budget"] = self.budget
        return reports.send(sock, protocol.HELLO, reports.hello)

    def _hello_body(self) -> protocol.Hello:
        return hello_body(
            agent_id=self.agent_id,
            pid=self.pid,
            paths=self._paths,
            budget=self.budget,
            capabilities=sorted({"cpu", *self.collectors}),
            sampler={"name": self.sampling.sampler, "why": self.sampling.sampler_why},
            attach_token=self.attach_token,
            ceiling=self.ceiling,
        )

    def _receive(self, sock: zmq.Socket[Any]) -> None:
        """Take what the monitor sent: at most CONTROL_BATCH messages, each checked by the protocol (Control).

        Decoding is charged to the budget like the loop's other wake-ups.
        """
        t0 = _cost_clock()
        resync = False
        for _ in range(CONTROL_BATCH):
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            resync = self.control.on_message(data) or resync
        spent = _cost_clock() - t0
        self.ledger.charge("wake", spent)
        if self.sampling.ticker:
            self.reports.wakes_s += spent  # the messages answer reports: their price (see _charge_wake)
        if resync:
            self._resync(sock)

    def _resync(self, sock: zmq.Socket[Any]) -> None:
        """The monitor does not know us (it restarted): hello and the full tables.

        At most once per RESYNC_MIN_S, and the tables go at once only if the
        guard can pay for a report (else with the next one): a monitor asking
        again and again must not make us resend megabytes over the budget.
        """
        now = self.clock()
        if not self.control.resync_allowed(now):
            return
        self.tables.resend_all()
        reports = self.reports
        reports.hello_sent = self._send_hello(sock)
        if reports.hello_sent and self.guard.wait_needed(now, reports.cost_s) <= 0:
            self._report(sock)

    # --- triggers ------------------------------------------------------------------------

    def _check_triggers(self, sock: zmq.Socket[Any], now: float) -> None:
        """Cut the ring's slice, evaluate the conditions, fire what holds."""
        events = self.events
        triggers = events.triggers
        assert triggers is not None
        if events.ring.start is None:
            events.ring.clear(self.reports.window_start)  # what was counted before the first check is in its window
        events.checked(now)
        if self.reports.hello_sent:
            # Only while reports go: they empty the ring, and a split needs a report to go.
            if self.sampling.ticker:
                self.sampling.ticker_step(drain=True)  # the ring's cut needs this second's samples
            events.ring.cut(now, self.counts, self.sampling.samples_in_window)
        skip = frozenset({self._ident, *(t for t in our_threads() if t is not None)})
        fired = triggers.check(now, skip)
        if triggers.errors:
            self.errors.extend(triggers.errors)
            triggers.errors.clear()
        if fired:
            self._fire(sock, fired, now)

    def _raised_budget(self, spec: TriggerSpec) -> float:
        if spec.budget is not None:
            return spec.budget
        if self.ceiling is not None:
            return self.ceiling
        return max(self.budget, min(10 * self.budget, DEFAULT_RAISED_MAX))

    def _fire(self, sock: zmq.Socket[Any], fired: list[Fired], now: float) -> None:
        """An event: split the report at its "before", raise the budget for its "after", detail now."""
        events = self.events
        wall = time.time()
        before = max(f.spec.before_s for f in fired)
        after = max(f.spec.after_s for f in fired)
        raised = self.control.under_ceiling(max(self._raised_budget(f.spec) for f in fired))
        for f in fired:
            events.fired.append(
                {
                    "t": wall,
                    "name": f.spec.describe()[: protocol.MAX_MARK_CHARS],
                    "kind": f.spec.kind,
                    "why": f.why[: protocol.MAX_MARK_CHARS],
                    "before_s": before,
                    "after_s": after,
                    "budget": max(raised, self.budget),
                }
            )
            self.mark(f"{f.spec.describe()}: {f.why}", "trigger")
        # Kept for the next report that goes; without a monitor for long, only the newest.
        del events.fired[:-MAX_PENDING_MARKS]
        if self.reports.hello_sent:
            self._report(sock, split_at=now - before)
        # Applied by the loop below, as agent.boost's is; ends the event's higher budget after "after".
        self.control.pending_boost = (raised, after)
        self.bursts.look_now()  # detailing now, not at its planned time
        events.lasts_until(now + after)

    # --- what tests and bench scripts read of the subsystems --------------------------

    @property
    def report_cost_s(self) -> float:
        return self.reports.cost_s

    @property
    def seq(self) -> int:
        return self.reports.seq

    @property
    def max_op_s(self) -> float:
        """The costliest single operation so far (see Ledger.max_op_s)."""
        return self.ledger.max_op_s

    @property
    def wake_cost_s(self) -> float:
        """The loop's own GIL-held time per wake-up, beyond the operations it runs."""
        return self.ledger.wake_cost_s

    @property
    def sampler(self) -> str:
        """Which sampler takes the stack samples, "native" or "gil" (see Sampling.sampler)."""
        return self.sampling.sampler

    @property
    def sampler_why(self) -> str:
        return self.sampling.sampler_why

    @property
    def ticker(self) -> bool:
        return self.sampling.ticker

    @property
    def samples_taken(self) -> int:
        """Samples taken so far, those still in the ticker's queue included."""
        return self.sampling.samples_taken

    @property
    def sample_cost_s(self) -> float:
        return self.sampling.sample_cost_s

    @property
    def sample_lag_s(self) -> float:
        return self.sampling.sample_lag_s

    @property
    def samples_in_window(self) -> int:
        return self.sampling.samples_in_window

    def sample(self) -> None:
        """Record one snapshot of every thread's Python stack (see Sampling.sample)."""
        self.sampling.sample()

    @property
    def proflet_costs(self) -> dict[str, ProfletCosts]:
        """Calibrated costs per detailing proflet (see Bursts)."""
        return self.bursts.proflet_costs

    @property
    def kind_costs(self) -> dict[str, dict[str, ProfletCosts]]:
        return self.bursts.kind_costs

    @property
    def scheduler(self) -> DetailScheduler:
        return self.bursts.scheduler

    @property
    def bursts_total(self) -> int:
        return self.bursts.bursts_total

    # Private names tests reach for: kept so that they read the same state.

    @property
    def _tk(self) -> Any:
        return self.sampling.tk

    @property
    def _samples_total(self) -> int:
        return self.sampling.samples_total

    @property
    def _activity(self) -> list[int] | None:
        return self.sampling.activity

    @property
    def _pending(self) -> list[tuple[int, ...]]:
        return self.sampling.pending

    @_pending.setter
    def _pending(self, pending: list[tuple[int, ...]]) -> None:
        self.sampling.pending = pending

    def _sample_python(self) -> None:
        """The pure-Python walker, the C walker's reference (tests run it on stand-ins)."""
        activity = self._activity  # a stand-in without it has no _pending either
        sample_python(self.tables, self.counts, self._ident, activity, self._pending if activity is not None else [])

    def _count_pending(self) -> None:
        pending, self._pending = self._pending, []
        count_pending(self.tables, self._activity, pending)

    @property
    def _bursts(self) -> dict[str, Burst]:
        return self.bursts.running

    @property
    def _details_done(self) -> list[dict[str, Any]]:
        return self.bursts.done

    def _detail_step(self, now: float) -> None:
        self.bursts.step(now)

    def _burst_costs(self, name: str, kind: str) -> ProfletCosts:
        return self.bursts.costs_of(name, kind)

    def _burst_price_s(self, name: str) -> float:
        return self.bursts.price_s(name)

    @property
    def _pending_budget(self) -> float | None:
        return self.control.pending_budget

    @_pending_budget.setter
    def _pending_budget(self, budget: float | None) -> None:
        self.control.pending_budget = budget

    @property
    def _monitor_plan(self) -> dict[str, Any] | None:
        return self.control.monitor_plan

    @property
    def _monitor_requests(self) -> bool:
        return self.control.monitor_requests

    @property
    def _hello_sent(self) -> bool:
        return self.reports.hello_sent

    @_hello_sent.setter
    def _hello_sent(self, sent: bool) -> None:
        self.reports.hello_sent = sent

    @property
    def _marks(self) -> deque[list[Any]]:
        return self.reports.marks
