"""preflight() against real processes: every refusal is one actionable line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from dyper.monitor.inject import InjectError, TargetInfo, preflight

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
        reason="ptrace injector is Linux x86_64 only",
    ),
    pytest.mark.timeout(60),
]

PYENV = Path("/root/.pyenv/versions")
PY310 = PYENV / "3.10.13" / "bin" / "python"
PY311 = PYENV / "3.11.7" / "bin" / "python"
# Larger than any possible pid_max (2**22), so it can never exist.
NO_SUCH_PID = 2**22 + 4242


def _one_line(exc: pytest.ExceptionInfo[InjectError]) -> str:
    msg = str(exc.value)
    assert msg and "\n" not in msg and msg == msg.strip()
    return msg


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=10)


def _start(procs: list[subprocess.Popen[bytes]], *argv: str) -> subprocess.Popen[bytes]:
    p = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    procs.append(p)
    return p


def _start_python(procs: list[subprocess.Popen[bytes]], python: Path | str) -> subprocess.Popen[bytes]:
    """Start ``python`` sleeping, and wait until it is really the interpreter
    (libpython mapped / main module running), not a half-exec'ed child."""
    p = subprocess.Popen(
        [str(python), "-c", "import sys, time; print('up', flush=True); time.sleep(100)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    procs.append(p)
    assert p.stdout is not None
    assert p.stdout.readline() == b"up\n"
    p.stdout.close()
    return p


def test_nonexistent_pid() -> None:
    with pytest.raises(InjectError) as exc:
        preflight(NO_SUCH_PID)
    msg = _one_line(exc)
    assert f"no process with PID {NO_SUCH_PID}" in msg
    assert "ps" in msg  # says how to find the right one


@pytest.mark.parametrize("pid", [0, -5])
def test_invalid_pid(pid: int) -> None:
    with pytest.raises(InjectError) as exc:
        preflight(pid)
    assert "invalid PID" in _one_line(exc)


def test_own_process() -> None:
    with pytest.raises(InjectError) as exc:
        preflight(os.getpid())
    assert "own process" in _one_line(exc)


def test_not_a_python_process(procs: list[subprocess.Popen[bytes]]) -> None:
    p = _start(procs, "sleep", "100")
    time.sleep(0.1)
    with pytest.raises(InjectError) as exc:
        preflight(p.pid)
    msg = _one_line(exc)
    assert "not a CPython process" in msg
    assert "sleep" in msg


def test_thread_id_instead_of_pid(procs: list[subprocess.Popen[bytes]]) -> None:
    python = PY311 if PY311.exists() else Path(sys.executable)
    p = subprocess.Popen(
        [
            str(python),
            "-c",
            "import threading, time\n"
            "t = threading.Thread(target=time.sleep, args=(100,), daemon=True); t.start()\n"
            "print(t.native_id, flush=True); time.sleep(100)",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    procs.append(p)
    assert p.stdout is not None
    tid = int(p.stdout.readline())
    p.stdout.close()
    with pytest.raises(InjectError) as exc:
        preflight(tid)
    assert f"thread of process {p.pid}" in _one_line(exc)


@pytest.mark.skipif(not PY310.exists(), reason="pyenv CPython 3.10.13 not installed")
def test_python_older_than_311(procs: list[subprocess.Popen[bytes]]) -> None:
    p = _start_python(procs, PY310)
    with pytest.raises(InjectError) as exc:
        preflight(p.pid)
    msg = _one_line(exc)
    assert "Python 3.10" in msg
    assert "3.11 or newer" in msg


@pytest.mark.skipif(not PY311.exists(), reason="pyenv CPython 3.11.7 not installed")
def test_real_311_process(procs: list[subprocess.Popen[bytes]]) -> None:
    p = _start_python(procs, PY311)
    expected = subprocess.run(
        [str(PY311), "-c", "import sys; print(*sys.version_info[:3])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    info = preflight(p.pid)
    assert isinstance(info, TargetInfo)
    assert info.pid == p.pid
    assert info.version == tuple(int(x) for x in expected) == (3, 11, 7)
    assert info.exe == os.path.realpath(PY311)
    assert re.search(r"/libpython3\.11\.so[.\d]*$", info.libpython), info.libpython
    assert info.uid == os.geteuid()
    # preflight must not leave anything behind
    status = Path(f"/proc/{p.pid}/status").read_text()
    assert re.search(r"^TracerPid:\s*0$", status, re.M)
    assert p.poll() is None


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3.11"), reason="no system python3.11")
def test_statically_linked_python(procs: list[subprocess.Popen[bytes]]) -> None:
    p = _start_python(procs, "/usr/bin/python3.11")
    info = preflight(p.pid)
    assert info.version[:2] == (3, 11)
    # Debian links libpython statically: symbols come from the executable.
    assert info.libpython == info.exe == "/usr/bin/python3.11"


@pytest.mark.skipif(not PY311.exists(), reason="pyenv CPython 3.11.7 not installed")
def test_already_traced(procs: list[subprocess.Popen[bytes]]) -> None:
    target = _start_python(procs, PY311)
    # A second process PTRACE_SEIZEs the target (like gdb/strace would).
    tracer_src = (
        "import ctypes, sys, time\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
        "r = libc.ptrace(0x4206, int(sys.argv[1]), None, None)\n"
        "print('seized' if r == 0 else f'failed {ctypes.get_errno()}', flush=True)\n"
        "time.sleep(100)\n"
    )
    tracer = subprocess.Popen(
        [sys.executable, "-c", tracer_src, str(target.pid)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
    )
    procs.append(tracer)
    assert tracer.stdout is not None
    assert tracer.stdout.readline() == b"seized\n"
    tracer.stdout.close()
    with pytest.raises(InjectError) as exc:
        preflight(target.pid)
    msg = _one_line(exc)
    assert f"already being traced by PID {tracer.pid}" in msg
    assert "detach" in msg
    tracer.kill()
    tracer.wait()
    # Once the tracer is gone the kernel detaches it and preflight passes.
    assert preflight(target.pid).version[:2] == (3, 11)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to test a uid mismatch")
@pytest.mark.skipif(not PY311.exists(), reason="pyenv CPython 3.11.7 not installed")
def test_permission_denied_other_uid(procs: list[subprocess.Popen[bytes]]) -> None:
    """An unprivileged user may not ptrace a root process: the error names the
    uids and the fix."""
    target = _start_python(procs, PY311)
    repo = Path(__file__).resolve().parents[2]
    import elftools

    # The unprivileged child needs a world-readable interpreter (pyenv lives
    # under /root, mode 700): prefer the system one, with our code and
    # pyelftools put on its path explicitly.
    python = next(
        (p for p in ("/usr/bin/python3.11", "/usr/bin/python3", sys.executable) if os.path.exists(p)),
    )
    code = (
        "import os, sys\n"
        "os.setgroups([]); os.setgid(65534); os.setuid(65534)\n"
        "from monitor.inject import InjectError, preflight\n"
        "try:\n"
        "    preflight(int(sys.argv[1]))\n"
        "except InjectError as e:\n"
        "    print('ERR', e)\n"
        "else:\n"
        "    print('OK')\n"
    )
    path = [str(repo), str(Path(elftools.__file__).resolve().parents[1])]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": os.pathsep.join(path)}
    res = subprocess.run(
        [python, "-c", code, str(target.pid)],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=30,
        check=False,
    )
    last = (res.stderr.strip().splitlines() or [""])[-1]
    if res.returncode != 0 and re.match(r"(ModuleNotFoundError|ImportError|PermissionError)", last):
        pytest.skip(f"uid 65534 cannot load the code under test: {last}")
    out = res.stdout.strip()
    assert out.startswith("ERR "), (res.stdout, res.stderr)
    assert "\n" not in out
    assert "uid 0" in out and "uid 65534" in out
    assert "sudo" in out
