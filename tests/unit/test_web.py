"""The dashboard without a browser: its pure data, its options, and its guard over real HTTP."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest

from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount
from dyper.monitor.server import Monitor
from dyper.monitor.web import data
from dyper.monitor.web.server import Dashboard, is_loopback, parse_http


def _profile(a: int, b: int) -> Profile:
    frames = [Frame("/app/main.py", "main", 1, 2), Frame("/app/main.py", "a", 5, 6), Frame("/app/main.py", "b", 9, 10)]
    stacks = [StackCount(1, (0, 1), a, a), StackCount(1, (0, 2), b, b)]
    return Profile(frames, stacks, {1: "MainThread"}, {"window_s": 10.0, "samples": a + b})


def test_http_option_and_loopback():
    assert parse_http("127.0.0.1:8341") == ("127.0.0.1", 8341)
    assert parse_http(":0") == ("127.0.0.1", 0)
    assert parse_http("[::1]:9000") == ("::1", 9000)
    with pytest.raises(ValueError):
        parse_http("localhost:http")
    assert is_loopback("localhost") and is_loopback("127.0.0.2") and is_loopback("::1")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1")


def test_off_loopback_needs_a_token():
    monitor = Monitor("tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="token"):
        Dashboard(monitor, "0.0.0.0", 0)


def test_flame_data_and_its_difference():
    now, before = _profile(30, 10), _profile(10, 30)
    plain = data.flame_data(now)
    root = plain["tree"]
    assert root[2] == 40 and len(root) == 4
    thread = root[3][0]
    assert plain["frames"][thread[0]][0] == "MainThread"
    diff = data.flame_data(now, base=before)
    assert diff["base_total"] == 40
    main = diff["tree"][3][0][3][0]
    a, b = sorted(main[3], key=lambda n: diff["frames"][n[0]][0])
    assert (a[2], a[4]) == (30, 10) and (b[2], b[4]) == (10, 30)


def test_findings_name_the_application_function_and_merge_alike():
    diagnosis = {
        "bottlenecks": [
            {"path": ["load (/app/s.py)", "recv (/lib/socket.py)"], "hypothesis": "io", "share_pct": 20,
             "kind": "self"},
            {"path": ["x (/app/s.py)", "load (/app/s.py)", "recv (/lib/socket.py)"], "hypothesis": "io",
             "share_pct": 5, "kind": "self"},
            {"path": ["work (/app/s.py)"], "hypothesis": "cpu", "share_pct": 9, "kind": "self"},
        ],
        "total_samples": 100,
    }  # fmt: skip
    found = data.findings(diagnosis, {}, lambda f: f.startswith("/lib/"))
    assert [f["text"] for f in found] == [
        "load (s.py) waits on I/O in recv (socket.py): 25% of the busy time.",
        "work (s.py) keeps the CPU busy: 9% of the busy time, in its own code.",
    ]


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
    from tests.unit.test_services import hello, report

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
