"""A small closed-loop HTTP load generator, for when wrk is not installed.

    python bench/workloads/loadgen.py URL [--connections 4] [--duration 10] [--stamps OUT]

Each of --connections threads sends GET requests one after the other on a new
connection each (gunicorn's sync workers close the connection after every
response anyway) until --duration passes. Prints one JSON line: requests,
errors, seconds, req/s and latency percentiles in ms. Being Python, it needs
far more CPU per request than wrk, so the figures are only comparable with
runs that used it too.

With --stamps it also writes OUT, ``{"threads": [[t, t, ...], ...]}``: per
connection the ``time.perf_counter()`` at which each response ended
(CLOCK_MONOTONIC, as bench/workloads/_windows.py writes them, for
bench/overhead_windows.py), and a SIGTERM ends the load early.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import threading
import time
from urllib.parse import urlsplit


def percentile(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("url")
    ap.add_argument("--connections", type=int, default=4)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--stamps", metavar="OUT", help="write when each response ended here")
    args = ap.parse_args()
    parts = urlsplit(args.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = parts.path or "/"
    latencies: list[list[float]] = [[] for _ in range(args.connections)]
    ends: list[list[float]] = [[] for _ in range(args.connections)]
    errors = [0] * args.connections
    deadline = [time.perf_counter() + args.duration]
    if args.stamps:
        signal.signal(signal.SIGTERM, lambda *_: deadline.__setitem__(0, 0.0))

    def client(i: int) -> None:
        lat = latencies[i]
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline[0]:
                return
            try:
                conn = http.client.HTTPConnection(host, port, timeout=10)
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                conn.close()
                if resp.status != 200:
                    errors[i] += 1
                    continue
            except (OSError, http.client.HTTPException):
                errors[i] += 1
                continue
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            ends[i].append(t1)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    if args.stamps:
        with open(args.stamps + ".tmp", "w") as f:
            json.dump({"threads": ends}, f)
        os.replace(args.stamps + ".tmp", args.stamps)
    all_lat = [x for lat in latencies for x in lat]
    print(
        json.dumps(
            {
                "requests": len(all_lat),
                "errors": sum(errors),
                "seconds": elapsed,
                "rps": len(all_lat) / elapsed,
                "p50_ms": 1e3 * percentile(all_lat, 0.50),
                "p90_ms": 1e3 * percentile(all_lat, 0.90),
                "p99_ms": 1e3 * percentile(all_lat, 0.99),
            }
        )
    )


if __name__ == "__main__":
    main()
