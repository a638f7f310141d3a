"""An aiohttp service with planted behaviour, and a load generator for it.

    python bench/workloads/async_service.py serve --port N [--idle-tasks K] [--block-every S]
    python bench/workloads/async_service.py load --port N [--seconds S] [--concurrency C]

The service's routes:

* ``/order``: ``handle_order`` awaits ``fetch_order`` (a planted slow await:
  ``asyncio.sleep`` of ``SLOW_AWAIT_S``, standing for a database round trip),
  then ``price`` (a little CPU). So ``handle_order`` spends nearly all its wall
  time awaiting ``fetch_order``.
* ``/health``: answers at once.

Every ``--block-every`` seconds (default 1) a background task runs
``rebuild_cache``, which calls ``compress_blocking``: ``time.sleep`` of
``BLOCK_S`` inside a coroutine, a planted blocking call that holds the event
loop. ``--idle-tasks K`` parks K more tasks on events that never fire (the
"1,000 pending tasks" of the cost measurement).

The load generator keeps ``--concurrency`` requests in flight, nine /order
to one /health, and prints requests/s and p50/p99 latency as JSON at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time

SLOW_AWAIT_S = 0.05
BLOCK_S = 0.25


async def fetch_order(order_id: int) -> dict[str, int]:
    await asyncio.sleep(SLOW_AWAIT_S)  # the database round trip
    return {"id": order_id, "items": order_id % 7 + 1}


def price(order: dict[str, int]) -> int:
    return sum(i * i for i in range(200 * order["items"]))


async def handle_order(request: object) -> object:
    from aiohttp import web

    order = await fetch_order(int(time.time() * 1000) % 1000)
    return web.json_response({"order": order, "price": price(order)})


async def handle_health(request: object) -> object:
    from aiohttp import web

    return web.Response(text="ok")


def compress_blocking() -> None:
    time.sleep(BLOCK_S)  # blocking I/O inside a coroutine: the loop stands still


async def rebuild_cache(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        compress_blocking()


async def park(event: asyncio.Event) -> None:
    await event.wait()


async def serve(port: int, idle_tasks: int, block_every: float) -> None:
    from aiohttp import web

    app = web.Application()
    app.router.add_get("/order", handle_order)
    app.router.add_get("/health", handle_health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    never = asyncio.Event()
    parked = [asyncio.create_task(park(never), name=f"parked-{i}") for i in range(idle_tasks)]
    background = asyncio.create_task(rebuild_cache(block_every), name="cache-rebuilder") if block_every > 0 else None
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for t in [*parked, *([background] if background else [])]:
            t.cancel()
        await runner.cleanup()


async def load(port: int, seconds: float, concurrency: int) -> dict[str, float]:
    import aiohttp

    latencies: list[float] = []
    errors = 0
    end = time.monotonic() + seconds

    async def worker(session: aiohttp.ClientSession, k: int) -> None:
        nonlocal errors
        n = k
        while time.monotonic() < end:
            path = "/health" if n % 10 == 0 else "/order"
            n += 1
            t0 = time.perf_counter()
            try:
                async with session.get(f"http://127.0.0.1:{port}{path}") as resp:
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
            except aiohttp.ClientError:
                errors += 1
                await asyncio.sleep(0.05)
                continue
            latencies.append(time.perf_counter() - t0)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(worker(session, k) for k in range(concurrency)))
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors,
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else 0.0,
        "p99_ms": 1000 * latencies[int(0.99 * (len(latencies) - 1))] if latencies else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--idle-tasks", type=int, default=0)
    s.add_argument("--block-every", type=float, default=1.0)
    ld = sub.add_parser("load")
    ld.add_argument("--port", type=int, required=True)
    ld.add_argument("--seconds", type=float, default=10.0)
    ld.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    if args.cmd == "serve":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args.port, args.idle_tasks, args.block_every))
        return 0
    print(json.dumps(asyncio.run(load(args.port, args.seconds, args.concurrency))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
