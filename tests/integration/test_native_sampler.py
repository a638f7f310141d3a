"""The native sampler (DYPER_SAMPLER=native) through `dyper run` and `dyper report`, against the truth.

One planted program: two CPU-bound threads, one thread doing file I/O
(fsync), one sleeping with a call in its argument, and one sorting a big
list (a C call that holds the GIL). Each thread measures its own CPU clock
and the program writes them out at exit; the report's CPU shares are compared
with those. The bounds are ones the GIL sampler fails by a wide margin (it
gave the I/O thread 50-60% of the CPU samples, the sleeper up to half, and
15% of sorted()'s time to the line after it) and sampling noise on a busy
machine does not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.factories import dyper

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the native sampler is for Linux"),
]

TARGET = """
import json, os, random, sys, tempfile, threading, time

stop = threading.Event()
cpu = {}


def timed(fn):
    def run(*args):
        c0 = time.thread_time()
        fn(*args)
        cpu[threading.current_thread().name] = time.thread_time() - c0
    return run


@timed
def spin():
    x = 0
    while not stop.is_set():
        for i in range(1000):
            x += i


@timed
def file_io(path):
    block = b"x" * 4096
    with open(path, "wb") as f:
        while not stop.is_set():
            f.write(block)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)


@timed
def sleeper(x):
    while not stop.is_set():
        time.sleep(float(x))


@timed
def sorter():
    data = [random.random() for _ in range(200_000)]
    n = 0
    while not stop.is_set():
        s = sorted(data)  # SORT LINE
        n += len(s) & 1  # NEXT LINE


d = tempfile.mkdtemp()
threads = [
    threading.Thread(target=spin, name="spin0"),
    threading.Thread(target=spin, name="spin1"),
    threading.Thread(target=file_io, args=(os.path.join(d, "f"),), name="file_io"),
    threading.Thread(target=sleeper, args=("0.05",), name="sleeper"),
    threading.Thread(target=sorter, name="sorter"),
]
for t in threads:
    t.start()
time.sleep(float(sys.argv[2]))
stop.set()
for t in threads:
    t.join()
with open(sys.argv[1], "w") as f:
    json.dump(cpu, f)
"""


def _native_available() -> bool:
    try:
        import dyper.agent._native  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _native_available(), reason="no native sampler for this interpreter")
def test_native_sampler_shares_match_the_threads_clocks(tmp_path: Path) -> None:
    target = tmp_path / "planted.py"
    target.write_text(TARGET)
    truth_file = tmp_path / "truth.json"
    out = tmp_path / "prof.json"
    dyper(
        "run", "-q", "--budget", "20%", "--duration", "60", "-o", str(out), "--",
        sys.executable, str(target), str(truth_file), "6",  # it ends by itself: --duration is a cap
        check=True, timeout=150, env={"DYPER_SAMPLER": "native", "DYPER_PROFLETS": "cpu"},
    )  # fmt: skip
    truth = json.loads(truth_file.read_text())
    report = json.loads(dyper("report", str(out), "--json", check=True).stdout)
    functions = {f["name"]: f for f in report["proflets"]["cpu"]["functions"] if f["file"] == str(target)}
    cpu_total = sum(truth.values())
    truth_share = {
        "spin": 100 * (truth["spin0"] + truth["spin1"]) / cpu_total,
        "file_io": 100 * truth["file_io"] / cpu_total,
        "sorter": 100 * truth["sorter"] / cpu_total,
        "sleeper": 100 * truth["sleeper"] / cpu_total,
    }
    got = {name: functions[name]["self_pct"] if name in functions else 0.0 for name in truth_share}
    samples = sum(f["self"] for f in functions.values())
    assert samples >= 60, (got, report["process"])
    for name, share in truth_share.items():
        assert abs(got[name] - share) <= 12, (name, got, truth_share)
    # sorted() holds the GIL: its time is its own line's, not the next one's
    lines = [r for r in report["proflets"]["cpu"]["lines"] if r["file"] == str(target) and r["name"] == "sorter"]
    sort_line = next(i for i, text in enumerate(TARGET.splitlines(), 1) if "SORT LINE" in text)
    by_line = {r["line"]: r["self"] for r in lines}
    assert by_line.get(sort_line, 0) >= 0.9 * sum(by_line.values()), (sort_line, by_line)
