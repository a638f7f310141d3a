"""Many attach/detach and start/stop cycles on one real process leave it as it was.

A real ``dyper attach PID --monitor`` + ``dyper detach PID --monitor`` takes
2 to 8 s here, nearly all of it two CLI start-ups on a loaded 2-core
machine; the injection itself (ptrace and a pending call, :mod:`monitor.attach`,
what both commands run) takes about 0.1 s. So the test does 13 real injector
cycles, the first three each until a detailing burst has hooked into the
process, then 200 start/stop cycles of the agent from inside the target, each
ended by the monitor's detach over the real socket, and checks from outside
(threads, descriptors, memory) and from inside (every kind of hook, sys.path,
sys.modules, the agent's atexit registrations, allocated blocks) that nothing
grew. ``bench/attach_cycles.py`` runs 200 real injector cycles with the same
checks and prints the figures.
"""

from __future__ import annotations

import time
from typing import Any

import psutil

from dyper.monitor.attach import attach, detach
from dyper.monitor.client import MonitorClient, MonitorRefused
from tests.factories import TARGETS, StandingMonitor, ask, start_commanded, stop, wait_for

#: real injector attach/detach cycles, each waiting for a burst (about 1.5 s each) ...
ATTACH_CYCLES = 3
#: ... and each only until the monitor knows the agent (about 0.2 s each)
QUICK_ATTACH_CYCLES = 10
#: start/stop cycles from inside, detached by the monitor (about 40 ms each)
CYCLES = 200
#: cycles after which the figures are taken as the baseline (first imports, caches)
WARMUP = 20
#: what must be exactly as before: the hooks of every kind, threads, descriptors
SAME = (
    "threads",
    "tasks",
    "fds",
    "monitoring",
    "frame_hook",
    "gc_callbacks",
    "tracemalloc",
    "alloc_hook",
    "fault_guard",
    "profile",
    "trace",
    "threading_profile",
    "threading_trace",
    "signals",
    "sys_path",
    "atexit",
    "agent_running",
)


def _differences(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: (before[k], after[k]) for k in SAME if before[k] != after[k]}


def _connected(client: MonitorClient, pid: int) -> bool:
    return any(s["pid"] == pid and s["connected"] for s in client.call("sessions"))


def _detach_through_the_monitor(client: MonitorClient, pid: int) -> None:
    """As ``dyper detach PID --monitor``: ask the monitor, once it knows the agent (its hello is in).

    Called with the previous agent's bye processed (see the loop): a detach
    sent while the monitor still thought that one connected would go to it.
    """
    deadline = time.monotonic() + 10
    while True:
        try:
            if client.call("detach", pid=pid)["detached"]:
                return
        except MonitorRefused:  # the process is not known yet
            pass
        assert time.monotonic() < deadline, "the monitor never knew the agent"
        time.sleep(0.005)


def test_attach_detach_and_start_stop_cycles_leave_the_process_as_it_was(standing_monitor: StandingMonitor) -> None:
    target = start_commanded(str(TARGETS / "cycles.py"))
    process = psutil.Process(target.pid)
    client = MonitorClient(standing_monitor.endpoint, timeout=3)
    try:
        before = ask(target, "probe")
        outside = (process.num_threads(), process.num_fds())
        t0 = time.monotonic()

        # Real attach/detach through the injector. The first cycles each run
        # until a detailing burst has been reported: the bursts' hooks
        # (sys.monitoring, tracemalloc, profile functions, gc callbacks) were
        # in and came out. The others until the monitor knows the agent.
        for cycle in range(ATTACH_CYCLES + QUICK_ATTACH_CYCLES):
            wait_for(lambda: not _connected(client, target.pid), interval=0.005, what="the last bye")
            attach(target.pid, standing_monitor.endpoint, 0.25, proflets=("all",))
            seen = wait_for(
                lambda: (s := standing_monitor.session(target.pid)) and s["connected"] and s,
                interval=0.01,
                what="the agent's hello",
            )
            if cycle < ATTACH_CYCLES:
                bursts = seen["spending"]["bursts"]  # type: ignore[index]
                wait_for(
                    lambda b=bursts: (s := standing_monitor.session(target.pid)) and s["spending"]["bursts"] > b,  # type: ignore[index]
                    timeout=20,
                    what=f"a burst in attach cycle {cycle}",
                )
            assert detach(target.pid), "no agent was running"
            assert ask(target, "stopped")["stopped"], f"attach cycle {cycle}"
        attached = ask(target, "probe")
        assert _differences(before, attached) == {}
        t1 = time.monotonic()

        # Start/stop from inside, each ended by the monitor's detach.
        warm: dict[str, Any] = {}
        rss_warm = 0
        for cycle in range(CYCLES):
            wait_for(lambda: not _connected(client, target.pid), interval=0.005, what="the last bye")
            # Every tenth with every proflet (their collectors' set-up and
            # close, gc callbacks included; three times as slow), the others
            # with the default ones.
            ask(target, f"start {standing_monitor.endpoint} 5%" + (" all" if cycle % 10 == 0 else ""))
            _detach_through_the_monitor(client, target.pid)
            assert ask(target, "stopped")["stopped"], f"cycle {cycle}"
            if cycle == WARMUP - 1:
                warm = ask(target, "probe")
                rss_warm = process.memory_info().rss
        after = ask(target, "probe")
        rss_after = process.memory_info().rss

        assert _differences(before, after) == {}
        assert (process.num_threads(), process.num_fds()) == outside
        took = time.monotonic() - t1
        attach_cycles = ATTACH_CYCLES + QUICK_ATTACH_CYCLES
        print(f"{attach_cycles} attach cycles: {t1 - t0:.1f} s; {CYCLES} start/stop cycles: {took:.1f} s")
        # Modules are imported by the first cycles, then never again.
        assert set(after["modules"]) - set(warm["modules"]) == set()
        # Memory: live Python blocks and RSS after 180 more cycles, against
        # what a single start/stop costs (thousands of blocks, a few MB).
        grown_blocks = after["blocks"] - warm["blocks"]
        grown_rss = rss_after - rss_warm
        print(f"after {CYCLES - WARMUP} cycles: {grown_blocks:+} blocks, {grown_rss / 1024:+.0f} KiB RSS")
        assert grown_blocks < 1000, grown_blocks
        assert grown_rss < 2 * 1024 * 1024, grown_rss
        assert target.poll() is None
    finally:
        client.close()
        stop(target)
