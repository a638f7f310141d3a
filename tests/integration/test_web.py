"""The dashboard served over HTTP (moved from tests/unit/test_web.py: they open sockets)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

from dyper.monitor.server import Monitor
from dyper.monitor.web.server import Dashboard


def _serve(token: str | None, check) -> None:  # type: ignore[no-untyped-def]
    async def main() -> None:
        monitor = Monitor("tcp://127.0.0.1:0")
        dashboard = Dashboard(monitor, "127.0.0.1", 0, token)
        url = await dashboard.start()
        try:
            await asyncio.to_thread(check, url, dashboard.port)
        finally:
            await dashboard.close()

    asyncio.run(main())


def _get(url: str, **headers: str) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _post(url: str, body: bytes, content_type: str) -> int:
    request = urllib.request.Request(url, data=body, headers={"Content-Type": content_type}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_guard_on_loopback_without_token():
    def check(url: str, port: int) -> None:
        status, body = _get(url)
        assert status == 200 and "static/app.js" in body
        assert _get(f"http://127.0.0.1:{port}/static/app.js")[0] == 200
        assert _get(f"http://127.0.0.1:{port}/static/../server.py")[0] == 404
        # DNS rebinding: a foreign name that resolved to loopback
        assert _get(url, Host=f"evil.example:{port}")[0] == 421
        status, body = _get(f"{url}api/processes")
        assert status == 200 and "processes" in json.loads(body)
        # a cross-site form post cannot change anything
        assert _post(f"{url}api/budget", b"pid=1&budget=0.5", "application/x-www-form-urlencoded") == 403
        assert _post(f"{url}api/budget", b'{"pid": 1, "budget": 0.05}', "application/json") == 400  # unknown pid

    _serve(None, check)


def test_guard_with_token():
    def check(url: str, port: int) -> None:
        assert url.endswith("/?token=s3cret")
        bare = f"http://127.0.0.1:{port}/"
        assert _get(bare)[0] == 403
        assert _get(bare, **{"X-Dyper-Token": "wrong"})[0] == 403
        assert _get(url)[0] == 200
        assert _get(f"{bare}api/processes", Cookie="dyper_token=s3cret")[0] == 200

    _serve("s3cret", check)


def test_the_call_tree_of_a_whole_service_merges_its_processes():
    from dyper.agent import protocol
    from tests.factories import hello, report

    def check_with(monitor: Monitor):  # type: ignore[no-untyped-def]
        def check(url: str, port: int) -> None:
            base = f"http://127.0.0.1:{port}/api/"
            status, body = _get(f"{base}summary?pid=100&window=")
            assert status == 200, body
            assert json.loads(body)["service"]["processes"] == 3
            one = json.loads(_get(f"{base}flame?pid=100&window=")[1])
            merged = json.loads(_get(f"{base}flame?pid=100&window=&service=1")[1])
            assert one["tree"][2] == 3  # the master alone
            assert merged["tree"][2] == 3 + 30 + 60
            assert any(f[0] == "handle" for f in merged["frames"])

        return check

    async def main() -> None:
        monitor = Monitor("tcp://127.0.0.1:0")
        for pid, ppid, start, work, n in ((100, 1, 10.0, "idle", 1), (101, 100, 11.0, "handle", 10),
                                          (102, 100, 11.5, "handle", 20)):  # fmt: skip
            h = hello(pid, ppid, start)
            ident = h["agent"].encode()
            monitor.handle(ident, protocol.encode(protocol.HELLO, h))
            for seq in range(1, 4):
                monitor.handle(
                    ident, protocol.encode(protocol.REPORT, report(h["agent"], work, n, t=1000.0 + seq, seq=seq))
                )
        dashboard = Dashboard(monitor, "127.0.0.1", 0, None)
        await dashboard.start()
        try:
            await asyncio.to_thread(check_with(monitor), "", dashboard.port)
        finally:
            await dashboard.close()

    asyncio.run(main())
