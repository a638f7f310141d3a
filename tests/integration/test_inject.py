"""Integration tests for monitor.inject: real CPython targets, real ptrace, no mocks.

Each target is a child process running a small script; it writes a heartbeat
file so we can check it is still *working* (not just alive) after injection.
Every test checks the target afterwards: alive, heartbeat moving, TracerPid 0
on all threads, /proc/PID/task back to its previous count (the injected thread
ended), and no W+X anonymous mapping left (the stub page unmapped itself).
"""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dyper.monitor.inject import InjectError, run_in_target

pytestmark = [
    pytest.mark.skipif(
        not sys.platform.startswith("linux") or os.uname().machine != "x86_64",
        reason="ptrace injector is Linux x86_64 only",
    ),
    pytest.mark.timeout(60),
]

PYENV = Path("/root/.pyenv/versions")


def _pyenv_interpreter(minor: int) -> str | None:
    """Newest pyenv CPython 3.<minor>.x interpreter, if installed."""
    found = []
    for path in glob.glob(str(PYENV / f"3.{minor}.*" / "bin" / "python")):
        m = re.search(rf"/3\.{minor}\.(\d+)/bin/python$", path)
        if m and os.access(path, os.X_OK):
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None


INTERPRETERS = [
    pytest.param(
        _pyenv_interpreter(minor),
        id=f"py3.{minor}",
        marks=pytest.mark.skipif(_pyenv_interpreter(minor) is None, reason=f"pyenv CPython 3.{minor} not installed"),
    )
    # The injector is the same code under every Python, so one suite run (the
    # oldest, which the test script runs first) injects into every version and
    # the others only into their own: each pair once, not nine times per CI run.
    for minor in ((11, 12, 13) if sys.version_info < (3, 12) else (sys.version_info[1],))
]

# Debian/Ubuntu's /usr/bin/python3.X is statically linked against libpython
# (the Py_ symbols live in the executable); exercise that path too.
DEBIAN_STATIC = "/usr/bin/python3.11"


# -- target scripts (argv[1] = work dir) -----------------------------------

_HEARTBEAT = """
import os, sys, threading, time
D = sys.argv[1]
def beat(n):
    tmp = os.path.join(D, 'hb.tmp')
    with open(tmp, 'w') as f:
        f.write(str(n))
    os.replace(tmp, os.path.join(D, 'hb'))
def compute_forever():
    n = 0
    while True:
        n += 1
        sum(i * i for i in range(3000))
        if n % 10 == 0:
            beat(n)
def ready():
    open(os.path.join(D, 'ready'), 'w').close()
"""

# (a) main thread asleep in C for an hour, a worker thread computing.
SLEEPER_WITH_WORKER = (
    _HEARTBEAT
    + """
threading.Thread(target=compute_forever, daemon=True).start()
ready()
time.sleep(3600)
"""
)

# (b) single thread, pure Python CPU loop (no syscalls apart from rare heartbeats).
CPU_BOUND = (
    _HEARTBEAT
    + """
ready()
n = 0
while True:
    n += 1
    x = (n * n) % 7
    if n % 300000 == 0:
        beat(n)
"""
)

# (c) main thread blocked in Thread.join() (a lock acquire in C).
JOINER = (
    _HEARTBEAT
    + """
t = threading.Thread(target=compute_forever, daemon=True)
t.start()
ready()
t.join()
"""
)

# Sleeps a known time: the sleep must neither be cut short nor fail (EINTR /
# errno 514 ERESTARTNOHAND) by our interruption.
SLEEP_THEN_PRINT = (
    _HEARTBEAT
    + """
t0 = time.monotonic()
ready()
time.sleep(3)
print(f"slept {time.monotonic() - t0:.3f}", flush=True)
"""
)


# -- helpers ----------------------------------------------------------------


def wait_for(pred: Callable[[], bool], timeout: float = 10.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


@dataclass
class Target:
    proc: subprocess.Popen[bytes]
    workdir: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tasks(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/task"))

    def maps(self) -> list[str]:
        return Path(f"/proc/{self.pid}/maps").read_text().splitlines()

    def structural_maps(self) -> list[str]:
        """/proc/PID/maps minus the target's own Python heap churn.

        pymalloc allocates and frees 1 MiB anonymous arenas as the target (and
        the injected code) allocate objects; everything else - libraries,
        thread stacks, malloc arenas, our page - counts.
        """
        out = []
        for line in self.maps():
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if len(parts) == 5 and parts[1] == "rw-p" and hi - lo == 1 << 20:
                continue
            out.append(line)
        return out

    def wx_anon_maps(self) -> list[str]:
        """Anonymous mappings that are both writable and executable (our stub page)."""
        out = []
        for line in self.maps():
            parts = line.split()
            if len(parts) == 5 and "w" in parts[1] and "x" in parts[1]:
                out.append(line)
        return out

    def tracer_pids(self) -> set[int]:
        pids = set()
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                status = Path(f"/proc/{self.pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            m = re.search(r"^TracerPid:\s*(\d+)", status, re.M)
            assert m
            pids.add(int(m.group(1)))
        return pids

    def heartbeat(self) -> int:
        try:
            return int((self.workdir / "hb").read_text() or 0)
        except (OSError, ValueError):
            return 0

    def stderr(self) -> str:
        return (self.workdir / "stderr").read_text(errors="replace")

    def stdout(self) -> str:
        return (self.workdir / "stdout").read_text(errors="replace")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[[str | None, str], Target]]:
    """Factory starting target processes; all are killed at teardown."""
    procs: list[subprocess.Popen[bytes]] = []
    counter = [0]

    def _spawn(python: str | None, script: str) -> Target:
        assert python is not None
        counter[0] += 1
        workdir = tmp_path / f"target{counter[0]}"
        workdir.mkdir()
        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                [python, "-c", script, str(workdir)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
            )
        procs.append(proc)
        target = Target(proc, workdir)
        assert wait_for(lambda: (workdir / "ready").exists() or not target.alive(), 15)
        assert target.alive(), target.stderr()
        return target

    try:
        yield _spawn
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=10)


def inject_write(target: Target, name: str, text: str = "ok") -> Path:
    """Inject code writing ``text`` to workdir/name; return that path once it exists."""
    path = target.workdir / name
    run_in_target(target.pid, f"open({str(path)!r}, 'w').write({text!r})", timeout=10)
    assert wait_for(path.exists, 10), f"injected code did not run; stderr: {target.stderr()}"
    assert wait_for(lambda: path.read_text() == text, 5)
    return path


def assert_clean(target: Target, tasks_before: int, wx_before: list[str]) -> None:
    """The target is alive, still working, untraced and has no leftovers."""
    assert target.alive(), target.stderr()
    assert target.tracer_pids() == {0}
    # The injected thread ends right after running the source.
    assert wait_for(lambda: target.tasks() == tasks_before, 5), (target.tasks(), tasks_before)
    assert target.wx_anon_maps() == wx_before  # stub page unmapped itself
    hb = target.heartbeat()
    assert wait_for(lambda: target.heartbeat() > hb, 10), "target stopped working"
    assert "Traceback" not in target.stderr(), target.stderr()


def _baseline(target: Target) -> tuple[int, list[str]]:
    assert wait_for(lambda: target.heartbeat() > 0, 10), target.stderr()
    return target.tasks(), target.wx_anon_maps()


# -- tests ------------------------------------------------------------------


@pytest.mark.parametrize("python", INTERPRETERS)
def test_sleeping_main_thread_with_worker(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, SLEEPER_WITH_WORKER)
    tasks, wx = _baseline(target)
    assert tasks == 2
    inject_write(target, "injected")
    assert_clean(target, tasks, wx)


@pytest.mark.parametrize("python", INTERPRETERS)
def test_cpu_bound_single_thread(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, CPU_BOUND)
    tasks, wx = _baseline(target)
    assert tasks == 1
    for i in range(3):  # caught at different points of the loop each time
        inject_write(target, f"injected{i}")
    assert_clean(target, tasks, wx)


@pytest.mark.parametrize("python", INTERPRETERS)
def test_main_thread_blocked_in_join(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, JOINER)
    tasks, wx = _baseline(target)
    inject_write(target, "injected")
    assert_clean(target, tasks, wx)


@pytest.mark.parametrize("python", INTERPRETERS)
def test_interrupted_sleep_is_restarted(spawn: Callable[..., Target], python: str) -> None:
    """The main (only) thread is stopped inside clock_nanosleep; after we
    restore orig_rax/rax the kernel must restart the syscall: no EINTR, no
    errno 514, and the sleep lasts its full duration."""
    target = spawn(python, SLEEP_THEN_PRINT)
    time.sleep(0.3)
    inject_write(target, "injected")
    inject_write(target, "injected-again")
    assert target.proc.wait(timeout=10) == 0, target.stderr()
    m = re.fullmatch(r"slept (\d+\.\d+)\n", target.stdout())
    assert m, (target.stdout(), target.stderr())
    assert float(m.group(1)) >= 2.95
    assert target.stderr() == ""


@pytest.mark.parametrize("python", INTERPRETERS)
def test_twenty_injections_in_a_row(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, SLEEPER_WITH_WORKER)
    tasks, wx = _baseline(target)
    inject_write(target, "first")
    assert_clean(target, tasks, wx)
    # The first thread ever created in a process makes glibc keep a cached
    # thread stack and a malloc arena (as any threading.Thread would); from
    # then on injections must not add a single mapping or task.
    maps_after_first = len(target.structural_maps())
    durations = []
    for i in range(20):
        t0 = time.perf_counter()
        inject_write(target, f"injected{i:02d}", text=str(i))
        durations.append(time.perf_counter() - t0)
        assert target.alive()
        # One injected thread at a time, as in real use (else glibc may
        # legitimately cache a second thread stack).
        assert wait_for(lambda: target.tasks() == tasks, 5)
    assert_clean(target, tasks, wx)
    assert len(target.structural_maps()) == maps_after_first, target.structural_maps()
    # While an injected thread runs, it is the only extra task: the previous
    # injected threads are gone (not parked or leaked).
    path = target.workdir / "taskcount"
    run_in_target(
        target.pid,
        f"import os, threading\nopen({str(path)!r}, 'w').write("
        "f\"{len(os.listdir('/proc/self/task'))} {len(threading.enumerate())}\")",
    )
    assert wait_for(lambda: path.exists() and path.read_text() != "", 10)
    ntasks, nthreads = map(int, path.read_text().split())
    assert ntasks == tasks + 1
    assert nthreads == 2  # main + worker: our thread is not a threading.Thread
    assert_clean(target, tasks, wx)
    print(f"injection+run round trip: median {sorted(durations)[10] * 1000:.1f} ms")


@pytest.mark.parametrize("python", INTERPRETERS)
def test_injected_exceptions_never_hurt_the_target(spawn: Callable[..., Target], python: str) -> None:
    """SystemExit in injected code would make PyRun_SimpleString exit the
    whole process; our wrapper must print it and carry on."""
    target = spawn(python, SLEEPER_WITH_WORKER)
    tasks, wx = _baseline(target)
    run_in_target(target.pid, "raise SystemExit(3)")
    run_in_target(target.pid, "1 / 0")
    # Two injected threads may print their tracebacks interleaved: wait for both.
    assert wait_for(lambda: "ZeroDivisionError" in target.stderr() and "SystemExit: 3" in target.stderr(), 10), (
        target.stderr()
    )
    assert target.alive()
    # Own namespace, not __main__'s.
    path = inject_write(target, "name", text="x")
    run_in_target(target.pid, f"open({str(path)!r}, 'w').write(__name__)")
    assert wait_for(lambda: path.read_text() == "__dyper_inject__", 10)
    assert target.alive()
    assert target.tracer_pids() == {0}
    assert wait_for(lambda: target.tasks() == tasks, 5)
    assert target.wx_anon_maps() == wx


@pytest.mark.skipif(not os.path.exists(DEBIAN_STATIC), reason=f"{DEBIAN_STATIC} not present")
def test_statically_linked_system_python(spawn: Callable[..., Target]) -> None:
    target = spawn(DEBIAN_STATIC, SLEEPER_WITH_WORKER)
    tasks, wx = _baseline(target)
    info = run_in_target(target.pid, "pass")
    assert info.libpython == info.exe  # symbols came from the executable
    inject_write(target, "injected")
    assert_clean(target, tasks, wx)


@pytest.mark.parametrize("python", INTERPRETERS[:1])
def test_run_in_target_runs_preflight(spawn: Callable[..., Target], python: str) -> None:
    with pytest.raises(InjectError) as exc:
        run_in_target(2**22 + 12345, "pass")
    assert "\n" not in str(exc.value)
    sleeper = subprocess.Popen(["sleep", "100"])
    try:
        with pytest.raises(InjectError, match="not a CPython process"):
            run_in_target(sleeper.pid, "pass")
    finally:
        sleeper.kill()
        sleeper.wait()


# -- robustness ------------------------------------------------------------

# Main thread sleeps in a *relative* nanosleep (ctypes usleep): the kernel
# reports it as -ERESTART_RESTARTBLOCK and continues it with restart_syscall,
# which must still find its restart block: usleep returns 0 after the full
# time, not -1/EINTR early.
RESTART_BLOCK_SLEEP = (
    _HEARTBEAT
    + """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
t0 = time.monotonic()
ready()
r = libc.usleep(2_500_000)
print(f"usleep {r} errno {ctypes.get_errno()} slept {time.monotonic() - t0:.3f}", flush=True)
"""
)

# A 0.2 ms interval timer with a Python handler: SIGALRMs keep arriving
# while we hold the thread and must be delivered, not lost or fatal.
SIGNAL_STORM = (
    _HEARTBEAT
    + """
import signal
count = 0
def on_alarm(signum, frame):
    global count
    count += 1
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0002, 0.0002)
threading.Thread(target=compute_forever, daemon=True).start()
ready()
t0 = time.monotonic()
while time.monotonic() - t0 < 3:
    time.sleep(0.05)
signal.setitimer(signal.ITIMER_REAL, 0)
print(f"alarms {count}", flush=True)
"""
)


@pytest.mark.parametrize("python", INTERPRETERS)
def test_restart_block_sleep_is_continued(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, RESTART_BLOCK_SLEEP)
    time.sleep(0.3)
    inject_write(target, "injected")
    assert target.proc.wait(timeout=10) == 0, target.stderr()
    m = re.fullmatch(r"usleep (-?\d+) errno (\d+) slept (\d+\.\d+)\n", target.stdout())
    assert m, (target.stdout(), target.stderr())
    assert (m.group(1), m.group(2)) == ("0", "0")
    assert float(m.group(3)) >= 2.45


@pytest.mark.parametrize("python", INTERPRETERS)
def test_signals_arriving_during_injection(spawn: Callable[..., Target], python: str) -> None:
    target = spawn(python, SIGNAL_STORM)
    for i in range(10):
        inject_write(target, f"injected{i}")
    assert target.proc.wait(timeout=10) == 0, target.stderr()
    m = re.fullmatch(r"alarms (\d+)\n", target.stdout())
    # Signals coalesce under load; a mask left blocked would show as (nearly) none.
    assert m and int(m.group(1)) > 100, target.stdout()
    assert target.stderr() == ""


@pytest.mark.parametrize("python", INTERPRETERS)
def test_target_survives_injector_killed_mid_injection(spawn: Callable[..., Target], python: str) -> None:
    """SIGKILL the injecting process at random moments.  The kernel then
    detaches the target thread wherever it is - possibly inside one of our
    remote calls - and the thread must restore itself from the rt_sigframe
    we wrote before touching it.  (A kill inside the window shows up as a
    leaked page: that is the accepted cost.)"""
    import random

    target = spawn(python, SLEEPER_WITH_WORKER)
    tasks, _ = _baseline(target)
    repo = Path(__file__).resolve().parents[2]
    injector_src = (
        "import sys\n"
        "from dyper.monitor.inject import run_in_target\n"
        "print('go', flush=True)\n"
        "while True:\n"
        "    run_in_target(int(sys.argv[1]), 'x = 1')\n"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), *sys.path[1:]]))
    rng = random.Random(1234)
    for _ in range(15):
        injector = subprocess.Popen(
            # -S: skip site (everything needed is on PYTHONPATH): faster start.
            [sys.executable, "-S", "-c", injector_src, str(target.pid)],
            stdout=subprocess.PIPE,
            env=env,
        )
        try:
            assert injector.stdout is not None
            assert injector.stdout.readline() == b"go\n"
            time.sleep(rng.uniform(0.002, 0.08))
        finally:
            injector.kill()
            injector.wait()
            if injector.stdout is not None:
                injector.stdout.close()
        assert target.alive(), target.stderr()
    assert wait_for(lambda: target.tracer_pids() == {0}, 5)
    assert wait_for(lambda: target.tasks() == tasks, 5)
    hb = target.heartbeat()
    assert wait_for(lambda: target.heartbeat() > hb, 10), "target stopped working"
    inject_write(target, "still-injectable")
    assert target.alive()
    assert target.stderr() == ""


# -- vector registers ----------------------------------------------------------

# Keeps all-ones in ymm8 (AVX) and, with AVX-512VL/DQ, in ymm16 - the
# register glibc's EVEX memcpy/memset (which pthread_create uses) clobber -
# for the whole loop, counting iterations that found them changed.  The
# thread spends nearly all its time in this user-space loop, so injections
# stop it right here, outside libc and outside the interpreter.
_AVX_SPIN_ASM = r"""
    .text
    .globl avx_spin
    .type avx_spin,@function
avx_spin:
    vpcmpeqd %ymm8, %ymm8, %ymm8
{init512}
    xor %eax, %eax
1:  vpcmpeqd %ymm10, %ymm10, %ymm10
    vptest %ymm10, %ymm8
    jnc 3f
{check512}
    jmp 2f
3:  inc %rax
    vpcmpeqd %ymm8, %ymm8, %ymm8
{init512}
2:  dec %rdi
    jnz 1b
    vzeroupper
    ret
    .section .note.GNU-stack,"",@progbits
"""
_INIT512 = "    vpternlogd $0xff, %ymm16, %ymm16, %ymm16"
_CHECK512 = """    vpternlogd $0xff, %ymm17, %ymm17, %ymm17
    vpcmpeqd %ymm17, %ymm16, %k1
    kortestb %k1, %k1
    jnc 3f"""

AVX_TARGET = (
    _HEARTBEAT
    + """
import ctypes
lib = ctypes.CDLL(sys.argv[2])
lib.avx_spin.restype = ctypes.c_long
bad = 0
ready()
t0 = time.monotonic()
while time.monotonic() - t0 < 2.5:
    bad += lib.avx_spin(ctypes.c_long(20_000_000))
print(f"corrupted {bad}", flush=True)
"""
)


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def avx_spin_lib(tmp_path_factory: pytest.TempPathFactory) -> str:
    flags = _cpu_flags()
    if "avx2" not in flags:
        pytest.skip("CPU without AVX2")
    compiler = next((c for c in ("cc", "gcc", "clang") if _which(c)), None)
    if compiler is None:
        pytest.skip("no C compiler to build the AVX test library")
    avx512 = {"avx512f", "avx512vl", "avx512dq"} <= flags
    src = _AVX_SPIN_ASM.format(init512=_INIT512 if avx512 else "", check512=_CHECK512 if avx512 else "")
    d = tmp_path_factory.mktemp("avx")
    (d / "avx.S").write_text(src)
    lib = d / "libavxspin.so"
    subprocess.run([compiler, "-shared", "-o", str(lib), str(d / "avx.S")], check=True)
    return str(lib)


def _which(cmd: str) -> bool:
    import shutil

    return shutil.which(cmd) is not None


@pytest.mark.parametrize("restore_via", ["ptrace-setregset", "sigreturn"])
def test_vector_registers_survive_injection(
    spawn: Callable[..., Target],
    avx_spin_lib: str,
    restore_via: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Injections that stop the target inside an AVX loop must give back every
    vector register bit, whichever way the state is restored: by
    PTRACE_SETREGSET, or - on kernels where that fails, the reason gdb can't
    be used here - by the XRSTOR of the rt_sigreturn on our frame."""
    from dyper.monitor import inject as inject_mod

    python = next((p.values[0] for p in INTERPRETERS if p.values[0]), None)
    if python is None:
        pytest.skip("no pyenv CPython 3.11-3.13")
    if restore_via == "sigreturn":
        monkeypatch.setattr(inject_mod, "_setregset_works", False)
    target = spawn(python, AVX_TARGET.replace("sys.argv[2]", repr(avx_spin_lib)))
    for i in range(10):
        inject_write(target, f"injected{i}")
    assert target.proc.wait(timeout=15) == 0, target.stderr()
    assert target.stdout() == "corrupted 0\n", (target.stdout(), target.stderr())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a target as another user")
@pytest.mark.skipif(not os.path.exists(DEBIAN_STATIC), reason=f"{DEBIAN_STATIC} not present")
def test_thread_creation_failure_is_clean(tmp_path: Path) -> None:
    """RLIMIT_NPROC=1 for an unprivileged target: pthread_create fails inside
    it.  We must report it in one line and leave nothing behind."""
    import resource

    def demote() -> None:
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
        resource.setrlimit(resource.RLIMIT_NPROC, (1, 1))

    proc = subprocess.Popen(
        [DEBIAN_STATIC, "-c", "import time; print('up', flush=True); time.sleep(60)"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=demote,
        cwd="/",
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"up\n"
        wx_before = [ln for ln in Path(f"/proc/{proc.pid}/maps").read_text().splitlines() if "rwx" in ln]
        with pytest.raises(InjectError) as exc:
            run_in_target(proc.pid, f"open({str(tmp_path / 'never')!r}, 'w')")
        assert "pthread_create failed" in str(exc.value)
        assert "\n" not in str(exc.value)
        assert proc.poll() is None
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert re.search(r"^TracerPid:\s*0$", status, re.M)
        wx_after = [ln for ln in Path(f"/proc/{proc.pid}/maps").read_text().splitlines() if "rwx" in ln]
        assert wx_after == wx_before  # every page we mapped was unmapped again
        assert not (tmp_path / "never").exists()
    finally:
        proc.kill()
        proc.communicate(timeout=10)
