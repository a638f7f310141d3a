"""The dashboard without a browser: its pure data, its options, and its guard over real HTTP."""

from __future__ import annotations

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
