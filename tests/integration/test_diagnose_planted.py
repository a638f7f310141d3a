"""`dyper diagnose` ranks the planted bottleneck first, on real runs at 1% (issue 31).

Six programs (tests/integration/targets/planted_diagnose.py), each with one
planted bottleneck of about half the busy time, are recorded at once by the
real CLI (`dyper run --budget 1% --duration N -o prof.json`), then diagnosed
from the saved profiles. The costs are planted large, and counted in work
rather than time, so that a busy machine (fewer samples, slower programs)
cannot reorder them: what would break these tests is a diagnosis that ranks
something else first, not a slow run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.factories import REPO, TARGETS, dyper

MODES = ("spread", "helper", "lock", "loop", "gc", "socket")
#: Seconds each program is recorded: a few hundred busy samples at 1% on a loaded machine.
SECONDS = 20
RUN = [sys.executable, "-m", "dyper", "run", "-q", "--budget", "1%", "--duration", str(SECONDS)]
#: The GC hypothesis reads the memory proflet's pauses, which is not one of the default proflets.
PROFLETS = {"gc": "cpu,tasks,memory"}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    out = tmp_path_factory.mktemp("planted")
    profiles = {mode: out / f"{mode}.json" for mode in MODES}
    procs = {}
    for mode in MODES:
        env = dict(os.environ)
        if mode in PROFLETS:
            env["DYPER_PROFLETS"] = PROFLETS[mode]
        target = [sys.executable, str(TARGETS / "planted_diagnose.py"), mode, str(SECONDS * 4)]
        procs[mode] = subprocess.Popen(
            [*RUN, "-o", str(profiles[mode]), "--", *target],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        for mode, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=SECONDS + 60)
            assert proc.returncode == 0, f"dyper run {mode} failed:\n{stdout}\n{stderr}"
            assert profiles[mode].exists(), stdout
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    yield profiles


@pytest.fixture(scope="module")
def diagnosed(recorded: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {mode: json.loads(dyper("diagnose", str(p), "--json", check=True).stdout) for mode, p in recorded.items()}


def functions(path: list[str]) -> list[str]:
    return [frame.split(" (", 1)[0] for frame in path]


def first(data: dict[str, Any]) -> dict[str, Any]:
    assert data["bottlenecks"], data
    top: dict[str, Any] = data["bottlenecks"][0]
    assert top["path"][-1].endswith("planted_diagnose.py)") or top["kind"] == "gc", top
    return top


def test_a_routine_spread_over_many_callers_is_one_bottleneck(diagnosed: dict[str, dict[str, Any]]) -> None:
    top = first(diagnosed["spread"])
    assert (top["hypothesis"], top["kind"], functions(top["path"])) == ("cpu", "spread", ["normalize"]), top
    # The 20 handlers are its callers (a few may have no sample), each under the threshold.
    callers = [c for c in top["callers"] if functions([c["name"]])[0].startswith("handle_")]
    assert len(callers) >= 10, top
    assert top["share_pct"] >= 30.0, top  # planted at about 55%, fold with it
    # fold, the hot leaf below it, is not a bottleneck of its own.
    assert not any(functions(b["path"])[-1] == "fold" for b in diagnosed["spread"]["bottlenecks"])
    assert functions(top["tree_path"])[-1] == "normalize" and functions(top["tree_path"])[-2].startswith("handle_")


def test_a_hot_helper_is_refined_to_its_heaviest_caller(diagnosed: dict[str, dict[str, Any]]) -> None:
    top = first(diagnosed["helper"])
    assert top["hypothesis"] == "cpu" and functions(top["path"])[-2:] == ["ingest", "crc"], top


def test_a_lock_convoy_is_synchronisation(diagnosed: dict[str, dict[str, Any]]) -> None:
    top = first(diagnosed["lock"])
    assert top["hypothesis"] == "sync" and functions(top["path"])[-1] == "update_shared", top
    # The main thread joining the workers waits by design.
    assert not any("join" in f for b in diagnosed["lock"]["bottlenecks"] for f in functions(b["path"]))


def test_an_event_loop_block_ranks_first_and_the_idle_selector_not_at_all(
    diagnosed: dict[str, dict[str, Any]],
) -> None:
    data = diagnosed["loop"]
    top = first(data)
    assert top["hypothesis"] == "loop" and functions(top["path"])[-1] == "compress_blocking", top
    assert not any("select" in f.lower() for b in data["bottlenecks"] for f in functions(b["path"]))
    # The tasks proflet's loop blocks are the evidence, when it saw one in the recorded part.
    if any(s["hypothesis"] == "idle" for s in data["history"]):
        assert "blocked" in top["evidence"] or top["share_pct"] >= 30.0, top


def test_a_gc_heavy_allocator_is_gc(diagnosed: dict[str, dict[str, Any]]) -> None:
    top = first(diagnosed["gc"])
    assert top["hypothesis"] == "gc", top
    assert functions(top["path"])[-1] in ("Node.__init__", "build_graph"), top


def test_a_slow_socket_peer_is_io(diagnosed: dict[str, dict[str, Any]]) -> None:
    top = first(diagnosed["socket"])
    assert top["hypothesis"] == "io" and functions(top["path"])[-1] == "fetch", top


def test_the_saved_profile_gives_the_task_view(recorded: dict[str, Path]) -> None:
    out = dyper("export", str(recorded["loop"]), "--view", "tasks", "-o", "-", "--format", "collapsed", check=True)
    # wall by default: the handlers awaiting I/O are there, and so is the task that blocks the loop
    stacks = [line.rsplit(" ", 1)[0] for line in out.stdout.splitlines()]
    assert any(s.startswith("handle_request (") for s in stacks), out.stdout
    assert any("compress_blocking (" in s for s in stacks), out.stdout
