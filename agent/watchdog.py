"""The hang watchdog: no proflet can stall the sampler.

Every collector hook runs on the sampler thread through :meth:`Watchdog.call`,
which records it for the watchdog thread, ``dyper-watchdog``. That thread
wakes once a report interval (at least every WATCH_MAX_S) and, if the hook
in progress has run past its limit (HANG_MIN_S, HANG_FACTOR), has the agent
give the sampler thread up (Agent._give_up):

* the call is claimed (HookCall.claim), so exactly one of the watchdog and
  the returning hook decides what happens next;
* the given-up thread no longer owns anything (the agent's ``_ident`` is
  cleared): it never touches the agent's state or socket again, it only leaves;
* Abandoned is raised in it asynchronously: a hook spinning in Python ends
  at its next bytecode, and the thread exits quietly. One blocked in C (a
  sleep, a lock) stays blocked; should the call ever return, the thread
  exits then. Either way only that thread runs collector code;
* a replacement sampler thread switches the proflet off (reason
  "hung: ..."), charges the CPU the hook burned, restarts the ticker so it
  skips the new sampler thread, takes over the socket (handed over through
  the claim and the thread start, both full memory barriers, as ZeroMQ
  requires for moving a socket between threads) and goes on.

Limits: a hook that holds the GIL in C forever (a runaway regex) stops the
whole process, watchdog included; one that took a lock the agent needs
later (an import lock) could stall the replacement too, and it is given up
in turn. A hook interrupted mid-way may leave its proflet's own state
inconsistent: the proflet is off by then and its close() is called (watched
as well) to remove its hooks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any, Final, NoReturn, ParamSpec, Protocol, TypeVar

from dyper.agent.ledger import cost_clock
from dyper.agent.procfs import thread_cpu_s

#: A collector hook that has run longer than HANG_FACTOR times the slowest
#: call its proflet has made so far (or its planned fixed cost, for a census
#: that is slow by design), and at least HANG_MIN_S, is hung: the proflet is
#: switched off and the sampler thread is given up and replaced. A second of
#: wall time is far past any hook's normal cost (microseconds to a few
#: hundred ms: a heap census is capped at 200 ms of CPU) yet short enough
#: that the monitor sees only a brief gap.
HANG_MIN_S: Final = 1.0
HANG_FACTOR: Final = 10.0
#: Past its limit, a hook is hung only if it is not running (its thread's CPU
#: clock moved less than this since the watchdog's last look: blocked in C,
#: on a lock, in a sleep) or spins (it burned its whole limit in CPU). A hook
#: that runs, but slowly, waiting its turn for the GIL behind the
#: application's threads (five GIL-bound threads stretch a report hook's
#: 0.2 s of work to a second), is not: it is given up only past HANG_WALL_S.
HANG_PROGRESS_S: Final = 0.001
HANG_WALL_S: Final = 10.0
#: While the agent stops, a hook that has run this long is given up at once:
#: stop() must not wait for it. Not less: a proflet's close() (tracemalloc off,
#: its gc callback removed) took over 0.25 s on a loaded CI machine, and a
#: close() given up leaves its hooks behind.
STOP_HANG_S: Final = 1.0
#: The watchdog looks once a report interval, within these bounds: its
#: wake-up takes the GIL like the sampler's, so at low budgets it looks less
#: often (its cost is charged as "watchdog") ...
WATCH_MIN_S: Final = 1.0
WATCH_MAX_S: Final = 10.0
#: ... and while the agent stops, this often.
WATCH_STOP_S: Final = 0.05
WATCHDOG_NAME: Final = "dyper-watchdog"
#: What a given-up sampler thread is renamed to (it shows in ``top -H`` until its hook returns).
HUNG_THREAD_NAME: Final = "dyper-hung"

_P = ParamSpec("_P")
_T = TypeVar("_T")


class HookCaller(Protocol):
    """Calls a hook of proflet ``name`` on the sampler thread, under the watchdog's eye (Watchdog.call)."""

    def __call__(self, name: str, hook: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T: ...


class Abandoned(BaseException):
    """Raised in a sampler thread the watchdog has given up on, to end it quietly.

    A BaseException, so that a collector's ``except Exception`` does not keep
    a spinning hook going; nothing outside the agent's own threads sees it.
    """


class HookCall:
    """One collector hook call in progress, as the watchdog sees it."""

    __slots__ = ("_token", "cpu0", "hook", "interrupted", "limit_s", "name", "native", "seen_cpu", "settled", "start")

    def __init__(self, name: str, hook: str, start: float, cpu0: float, limit_s: float, native: int = 0) -> None:
        self.name = name
        self.hook = hook
        self.start = start
        #: the calling thread's CPU clock at the start (what a spinning hook cost is charged from)
        self.cpu0 = cpu0
        self.limit_s = limit_s
        #: the calling thread's kernel id: its CPU clock tells a hook that runs slowly from one
        #: that does not run (a kernel id, not a pthread handle, which would crash once the thread is gone)
        self.native = native
        #: its CPU clock at the watchdog's last look (None: not looked at yet)
        self.seen_cpu: float | None = None
        #: set by the watchdog once it has given the thread up: interrupted, or not
        self.settled = False
        self.interrupted = False
        self._token = [True]

    def claim(self) -> bool:
        """True for exactly one caller: the sampler thread as the hook returns, or the watchdog giving up on it.

        list.pop is one atomic step, so the two can race without a lock (a
        lock would be worse: the interruption could arrive while it is held).
        """
        try:
            self._token.pop()
        except IndexError:
            return False
        return True


#: PyThreadState_SetAsyncExc and the NULL that withdraws a pending exception, once needed
_async_exc: tuple[Any, Any] | None = None


def interrupt(ident: int, exc: type[BaseException] | None) -> bool:
    """Raise ``exc`` in thread ``ident`` at its next bytecode (None: withdraw it); False if not possible.

    The only way to stop a hook spinning in Python code. A thread blocked in
    C (a sleep, a lock) gets it only if the call ever returns.
    """
    global _async_exc
    try:
        if _async_exc is None:
            import ctypes  # only on a hang: not free to import

            # A private prototype: setting argtypes on ctypes.pythonapi's own
            # would change it for the application too.
            prototype = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)
            _async_exc = (prototype(("PyThreadState_SetAsyncExc", ctypes.pythonapi)), ctypes.py_object())
        set_async_exc, null = _async_exc
        return bool(set_async_exc(ident, exc if exc is not None else null) == 1)
    except Exception:  # no ctypes here (a minimal build): the hook is left to run
        return False


def name_os_thread(name: str) -> None:
    """Give the current thread an OS-level name, visible in ``top -H`` and ``ps -T``."""
    with contextlib.suppress(OSError), open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as f:
        f.write(name[:15])


def our_threads() -> set[int | None]:
    """The watchdog and threads given up in a hung hook: ours, though the samplers see them."""
    return {t.ident for t in threading.enumerate() if t.name in (WATCHDOG_NAME, HUNG_THREAD_NAME)}


class Watchdog:
    """The hook in progress, each proflet's slowest hook so far, and the thread that watches them.

    The watching thread reads only ``hook_call`` and writes only ``spent_s``;
    everything else belongs to the sampler thread.
    """

    def __init__(
        self,
        *,
        stopping: threading.Event,
        stopped: threading.Event,
        errors: list[str],
        planned_s: Callable[[str], float],
        period_s: Callable[[], float],
        handoff_s: Callable[[], float],
        give_up: Callable[[HookCall, float], None],
    ) -> None:
        self._stopping = stopping
        self._stopped = stopped
        self._errors = errors
        #: a proflet's planned fixed cost (a census, say, is slow by design)
        self._planned_s = planned_s
        #: how long the watching thread sleeps between looks while the agent runs
        self._period_s = period_s
        #: the expected GIL hand-off cost of one wake-up (see Sampling.handoff_s)
        self._handoff_s = handoff_s
        #: what the agent does with a sampler thread found stuck in a hook
        self._give_up = give_up
        self.thread: threading.Thread | None = None
        #: wakes the watching thread at once (the agent stops)
        self.poke = threading.Event()
        #: the collector hook running on the sampler thread, if any
        self.hook_call: HookCall | None = None
        #: per proflet: its slowest hook call so far, wall seconds
        self.slowest: dict[str, float] = {}
        #: the watching thread's own cost (written only by it) and how much of it the sampler has charged
        self.spent_s = 0.0
        self.charged_s = 0.0

    def start(self) -> None:
        self.thread = threading.Thread(target=self._watch, name=WATCHDOG_NAME, daemon=True)
        self.thread.start()

    def unpaid_s(self) -> float:
        """The watching thread's cost since the last call, taken as charged."""
        unpaid = self.spent_s - self.charged_s
        if unpaid > 0:
            self.charged_s += unpaid
        return unpaid

    # --- on the sampler thread --------------------------------------------------------

    def call(self, name: str, hook: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Call a hook of proflet ``name`` on the sampler thread, under the watchdog's eye."""
        slowest = max(self.slowest.get(name, 0.0), self._planned_s(name))
        limit = max(HANG_MIN_S, HANG_FACTOR * slowest)
        call = HookCall(
            name, getattr(hook, "__name__", "hook"), time.monotonic(), cost_clock(), limit, threading.get_native_id()
        )
        self.hook_call = call
        try:
            result = hook(*args, **kwargs)
        except Abandoned:
            raise  # the watchdog's interruption: this thread is done
        except BaseException:
            self._returned(call)
            raise
        self._returned(call)
        return result

    def _returned(self, call: HookCall) -> None:
        if not call.claim():
            self._abandoned(call)
        self.hook_call = None
        took = time.monotonic() - call.start
        if took > self.slowest.get(call.name, 0.0):
            self.slowest[call.name] = took

    def _abandoned(self, call: HookCall) -> NoReturn:
        """The hook returned after the watchdog gave this thread up: leave, touching nothing."""
        while not call.settled:  # the watchdog is a few bytecodes from deciding whether to interrupt
            time.sleep(0.001)
        # An interruption on its way is taken here, where it only ends this
        # thread, and never later: once the thread is gone its id may be reused.
        deadline = time.monotonic() + 1.0
        while call.interrupted and time.monotonic() < deadline:
            time.sleep(0.001)
        interrupt(threading.get_ident(), None)
        raise Abandoned

    # --- on the watching thread -------------------------------------------------------

    def _watch(self) -> None:
        """The watchdog thread: gives up a sampler thread stuck in a collector hook."""
        name_os_thread(WATCHDOG_NAME)
        while not self._stopped.is_set():
            stopping = self._stopping.is_set()
            period = WATCH_STOP_S if stopping else min(max(self._period_s(), WATCH_MIN_S), WATCH_MAX_S)
            self.poke.wait(period)
            self.poke.clear()
            if self._stopped.is_set():
                return
            t0 = cost_clock()
            try:
                self._check_hang()
            except Exception as exc:  # never into the application, and keep watching
                self._errors.append(f"watchdog: {type(exc).__name__}: {exc}")
            # Charged by the sampler at its next report; a wake-up behind a
            # busy application thread costs it a GIL hand-off, like the sampler's.
            self.spent_s += cost_clock() - t0 + self._handoff_s()

    def _check_hang(self) -> None:
        call = self.hook_call
        if call is None:
            return
        elapsed = time.monotonic() - call.start
        stopping = self._stopping.is_set()
        limit = min(call.limit_s, STOP_HANG_S) if stopping else call.limit_s
        cpu = (thread_cpu_s(call.native) or 0.0) if call.native else 0.0
        seen, call.seen_cpu = call.seen_cpu, cpu
        if elapsed < limit:
            return
        if not stopping and cpu > 0 and elapsed < HANG_WALL_S:
            spinning = cpu - call.cpu0 >= limit
            stalled = seen is not None and cpu - seen < HANG_PROGRESS_S
            if not (spinning or stalled):
                return  # running, slowly: its turns at the GIL come far apart
        if not call.claim():
            return
        self._give_up(call, elapsed)
