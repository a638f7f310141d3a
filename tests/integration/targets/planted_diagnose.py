"""Programs with one planted bottleneck each, for `dyper diagnose` (tests/integration/test_diagnose_planted.py).

    python planted_diagnose.py MODE SECONDS

Each mode runs for SECONDS and puts about half of the process's busy time in
one place, the planted bottleneck, beside other work. Costs are counted in
work, not time, so that a busy machine does not change the proportions.

- ``spread``: ``normalize`` (the planted one) is called from 20 handlers,
  each of them under 5% alone, and calls a leaf helper (``fold``);
- ``helper``: a hot leaf helper ``crc`` called from three callers of unequal
  weight: ``ingest`` (the planted one, about half) and two small ones;
- ``lock``: four threads convoy on one lock held in ``update_shared`` (the
  planted one), each doing a little work of its own;
- ``loop``: an asyncio service whose handlers await I/O, one of which
  (``compress_blocking``, the planted one) calls a blocking function;
- ``gc``: ``build_graph`` (the planted one) allocates reference cycles that the
  collector keeps collecting;
- ``socket``: ``fetch`` (the planted one) asks a slow peer (another process,
  at the other end of a socketpair) and waits for its answer.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable


def crunch(n: int) -> int:
    """Pure-Python work, n steps (background work of the workload, spread below the threshold)."""
    x = 0
    for i in range(n):
        x += i * i
    return x


# --- spread ---------------------------------------------------------------------------------


def fold(text: str) -> int:
    """A leaf helper: cheap per call, hot because normalize calls it always."""
    x = 0
    for c in text:
        x = (x * 31 + ord(c)) & 0xFFFF
    return x


def normalize(text: str) -> int:
    """The planted bottleneck: called from 20 handlers, each under 5% alone."""
    x = 0
    for i in range(3000):
        x += i * i
    return x + fold(text)


def _handler(i: int) -> Callable[[str], int]:
    def handler(text: str) -> int:
        return normalize(text)

    # A code object of its own per handler: the profiles name functions by their code.
    name = f"handle_{i:02d}"
    handler.__code__ = handler.__code__.replace(co_name=name, co_qualname=name)
    return handler


HANDLERS = [_handler(i) for i in range(20)]


def tidy_a() -> int:
    """Other work, each of its own (a helper the three shared would be a spread bottleneck too)."""
    x = 0
    for i in range(12000):
        x += i * i
    return x


def tidy_b() -> int:
    x = 0
    for i in range(12000):
        x += i * i
    return x


def tidy_c() -> int:
    x = 0
    for i in range(12000):
        x += i * i
    return x


def run_spread(until: float) -> None:
    text = "Hello, World! " * 200
    while time.monotonic() < until:
        for h in HANDLERS:
            h(text)
        tidy_a()
        tidy_b()
        tidy_c()


# --- helper ---------------------------------------------------------------------------------


def crc(data: bytes) -> int:
    """A hot leaf helper, called from three callers of unequal weight."""
    n = 0
    for b in data:
        n = (n * 31 + b) & 0xFFFFFFFF
    return n


def ingest(data: bytes) -> int:
    """The planted bottleneck: most of crc's calls (about half of all the time)."""
    return crc(data) + crc(data) + crc(data)


def audit(data: bytes) -> int:
    return crc(data[:2000])


def heartbeat(data: bytes) -> int:
    return crc(data[:1000])


def run_helper(until: float) -> None:
    data = bytes(range(256)) * 16
    while time.monotonic() < until:
        ingest(data)
        audit(data)
        heartbeat(data)
        crunch(10000)


# --- lock -----------------------------------------------------------------------------------

SHARED = threading.Lock()


def update_shared() -> None:
    """The planted bottleneck: four threads queue for the lock it holds while it works."""
    with SHARED:
        crunch(100000)


def worker(until: float) -> None:
    while time.monotonic() < until:
        update_shared()
        crunch(10000)


def run_lock(until: float) -> None:
    threads = [threading.Thread(target=worker, args=(until,), name=f"worker-{i}") for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# --- loop -----------------------------------------------------------------------------------


def compress_blocking(payload: bytes) -> int:
    time.sleep(0.25)  # a blocking call on the loop's thread: every task waits
    return len(payload)


async def handle_request(i: int) -> None:
    await asyncio.sleep(0.05)  # awaiting I/O: no cost to the loop


async def compress_job() -> None:
    while True:
        compress_blocking(b"x" * 1000)
        await asyncio.sleep(0.2)


async def serve(until: float) -> None:
    job = asyncio.create_task(compress_job())
    i = 0
    while time.monotonic() < until:
        await asyncio.gather(*(handle_request(i + k) for k in range(20)))
        i += 20
    job.cancel()


def run_loop(until: float) -> None:
    asyncio.run(serve(until))


# --- gc -------------------------------------------------------------------------------------


class Node:
    def __init__(self) -> None:
        self.peers: list[Node] = []


def build_graph() -> int:
    nodes = [Node() for _ in range(2000)]
    for a, b in itertools.pairwise(nodes):
        a.peers.append(b)
        b.peers.append(a)
    return len(nodes)


def run_gc(until: float) -> None:
    gc.set_threshold(200, 5, 5)
    while time.monotonic() < until:
        build_graph()
        crunch(10000)


# --- socket ---------------------------------------------------------------------------------


#: The peer: another process (not profiled), answering each request after 50 ms.
PEER = """
import socket, sys, time
conn = socket.socket(fileno=int(sys.argv[1]))
while True:
    data = conn.recv(64)
    if not data:
        break
    time.sleep(0.05)
    conn.sendall(data)
"""


def fetch(sock: socket.socket) -> bytes:
    """The planted bottleneck: a request to a slow peer, waiting for its answer."""
    sock.sendall(b"ping")
    return sock.recv(64)


def run_socket(until: float) -> None:
    mine, theirs = socket.socketpair()
    # Without dyper's variables: the peer stands for a remote service, which the agent does not see.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYPER") and k != "PYTHONPATH"}
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(theirs.fileno())], pass_fds=[theirs.fileno()], env=env)
    theirs.close()
    try:
        while time.monotonic() < until:
            fetch(mine)
            crunch(50000)
    finally:
        mine.close()
        peer.wait(10)


MODES = {
    "spread": run_spread,
    "helper": run_helper,
    "lock": run_lock,
    "loop": run_loop,
    "gc": run_gc,
    "socket": run_socket,
}

if __name__ == "__main__":
    mode, seconds = sys.argv[1], float(sys.argv[2])
    MODES[mode](time.monotonic() + seconds)
