"""One thread per planted state, for the thread-state tests (issue 29).

``python planted_states.py waits SECONDS``: one thread each that sleeps
(``sleep``), sleeps with a call in its argument (``sleep_arg``), waits for a
lock nobody releases (``lock``), an Event nobody sets (``event``), a Queue
nobody fills (``queue``), a pipe nobody writes (``select``), a socket nobody
writes (``recv``), a child process (``child``), and one that spins (``spin``).
``python planted_states.py spinners SECONDS``: three spinners sharing the GIL.
``python planted_states.py runq SECONDS``: one spinner pinned to a CPU that a
busy child process (pinned there too) keeps taking: it waits in the kernel's
run queue, never for the GIL (the agent's threads stay unpinned).
Each waiting thread waits in one long call, re-entered until the end, so its
leaf is the planted one for the whole run.
"""

from __future__ import annotations

import contextlib
import os
import queue
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

#: what must outlive waits(): the write ends
KEEP: list[object] = []
SLICE = "2.5"  # seconds per blocking call: a str, so the call's argument calls float()


def spin(deadline: float) -> None:
    n = 0
    while time.monotonic() < deadline:
        for i in range(2000):
            n += i * i


def waits(deadline: float) -> dict[str, Callable[[], None]]:
    lock = threading.Lock()
    lock.acquire()
    event = threading.Event()
    q: queue.Queue[int] = queue.Queue()
    rd, wr = os.pipe()
    a, b = socket.socketpair()
    KEEP.extend((wr, b))  # the ends nobody writes stay open: closed, they would read EOF at once
    a.settimeout(float(SLICE))

    def left() -> float:
        return max(0.0, min(float(SLICE), deadline - time.monotonic()))

    def sleep() -> None:
        while time.monotonic() < deadline:
            time.sleep(2.5)

    def sleep_arg() -> None:
        while time.monotonic() < deadline:
            time.sleep(float(SLICE))

    def lock_wait() -> None:
        while time.monotonic() < deadline:
            lock.acquire(timeout=float(SLICE))

    def event_wait() -> None:
        while time.monotonic() < deadline:
            event.wait(left())

    def queue_get() -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                q.get(timeout=left() or 0.01)

    def select_wait() -> None:
        while time.monotonic() < deadline:
            select.select([rd], [], [], left())

    def recv() -> None:
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                a.recv(int("1") * 1024)

    def child() -> None:
        while time.monotonic() < deadline:
            subprocess.run(["sleep", SLICE], check=False)

    return {
        "sleep": sleep, "sleep_arg": sleep_arg, "lock": lock_wait, "event": event_wait, "queue": queue_get,
        "select": select_wait, "recv": recv, "child": child, "spin": lambda: spin(deadline),
    }  # fmt: skip


def pinned_spin(deadline: float) -> None:
    """Spin on the last CPU beside a busy process pinned there, which ends with us."""
    cpu = max(os.sched_getaffinity(0))
    hog = (
        "import os\n"
        f"os.sched_setaffinity(0, {{{cpu}}})\n"
        f"while os.getppid() == {os.getpid()}:\n"
        "    for _ in range(100000): pass\n"
    )
    # not profiled: without DYPER_* it starts no agent of its own
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYPER_")}
    child = subprocess.Popen([sys.executable, "-c", hog], env=env)
    try:
        os.sched_setaffinity(0, {cpu})  # this thread only: Linux pins threads one by one
        spin(deadline)
    finally:
        child.kill()
        child.wait()


def main() -> None:
    mode, seconds = sys.argv[1], float(sys.argv[2])
    deadline = time.monotonic() + seconds
    if mode == "waits":
        targets = waits(deadline)
    elif mode == "runq":
        targets = {"pinned": lambda: pinned_spin(deadline)}
    else:
        targets = {f"spin{i}": (lambda: spin(deadline)) for i in range(3)}
    threads = [threading.Thread(target=fn, name=name, daemon=True) for name, fn in targets.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()) + 5)
    print("done", flush=True)


if __name__ == "__main__":
    main()
