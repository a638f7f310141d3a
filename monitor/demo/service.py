"""A small HTTP service with three planted hot spots, for `dyper demo`.

* CPU: ``render_report`` formats numbers in pure Python.
* Lock: ``update_stats`` holds one global lock while it works, so request
  threads queue on it.
* I/O: ``fetch_upstream`` waits on a slow upstream socket server.
* asyncio: a notifier's event loop in its own thread, where each
  ``notify`` task awaits ``send_notification`` (a slow await, 50 ms) and
  ``flush_metrics`` makes a blocking call (``write_metrics_file``, 150 ms of
  ``time.sleep``) every 2 s, holding the loop.

A built-in load generator keeps it busy. Runs until killed. Prints its port.
"""

from __future__ import annotations

import argparse
import http.client
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATS_LOCK = threading.Lock()
STATS: dict[str, int] = {}


def render_report(n: int) -> str:
    rows = []
    for i in range(n):
        value = (i * 7919) % 10007
        rows.append(f"{i:6d} {value:8d} {value / 10007:8.4f} {'#' * (value % 20)}")
    return "\n".join(rows)


def update_stats(key: str) -> None:
    with STATS_LOCK:
        total = 0
        for i in range(200_000):
            total += i % 7
        STATS[key] = STATS.get(key, 0) + total


def upstream_server() -> int:
    """A slow upstream: answers each request after 20 ms."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)

    def serve(conn: socket.socket) -> None:
        with conn:
            while conn.recv(64):
                time.sleep(0.02)
                conn.sendall(b"ok")

    def accept() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True, name="upstream").start()

    threading.Thread(target=accept, daemon=True, name="upstream-accept").start()
    return int(srv.getsockname()[1])


UPSTREAM_PORT = 0
_local = threading.local()


def fetch_upstream() -> bytes:
    conn = getattr(_local, "conn", None)
    if conn is None:
        conn = _local.conn = socket.create_connection(("127.0.0.1", UPSTREAM_PORT))
    conn.sendall(b"get")
    return conn.recv(64)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path.startswith("/report"):
            body = render_report(8000).encode()
        elif self.path.startswith("/stats"):
            update_stats(self.path)
            body = b"ok"
        else:
            body = fetch_upstream()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


async def send_notification(n: int) -> None:
    import asyncio

    await asyncio.sleep(0.05)  # the push service's round trip


async def notify(n: int) -> None:
    await send_notification(n)


def write_metrics_file() -> None:
    time.sleep(0.15)  # blocking file I/O inside a coroutine


async def flush_metrics() -> None:
    import asyncio

    while True:
        await asyncio.sleep(2.0)
        write_metrics_file()


def notifier() -> None:
    import asyncio

    async def run() -> None:
        asyncio.get_running_loop().create_task(flush_metrics(), name="metrics-flusher")
        n = 0
        while True:
            await asyncio.gather(*(notify(n + k) for k in range(8)))
            n += 8

    asyncio.run(run())


def load(port: int, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    while True:
        try:
            conn.request("GET", path)
            conn.getresponse().read()
        except OSError:
            time.sleep(0.1)
            conn = http.client.HTTPConnection("127.0.0.1", port)


def main() -> None:
    global UPSTREAM_PORT
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    UPSTREAM_PORT = upstream_server()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    port = server.server_address[1]
    for path in ("/report", "/report", "/stats", "/stats", "/fetch", "/fetch"):
        threading.Thread(target=load, args=(port, path), daemon=True, name=f"load{path}").start()
    threading.Thread(target=notifier, daemon=True, name="notifier").start()
    print(f"demo service on http://127.0.0.1:{port}/ (pid {__import__('os').getpid()})", flush=True)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
