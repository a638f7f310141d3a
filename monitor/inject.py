"""Run Python source inside an already running CPython process (``dyper attach``).

Why not gdb: on the kernels we target, every gdb inferior call fails with
"Couldn't write extended state status: Bad address" (its PTRACE_SETREGSET
NT_X86_XSTATE write is rejected) and leaves the target half-restored; the
target then died with ``OSError: [Errno 514]`` (ERESTARTNOHAND leaked to user
space because the interrupted syscall was not restored).  So this module is a
small, self-contained ptrace(2) injector written with ctypes.

Design (CPython 3.11 - 3.13, Linux x86_64)
-----------------------------------------
Python code must never run on an arbitrary interrupted thread: it could be in
the middle of malloc, hold the GIL in an inconsistent state, etc.  Instead:

1. ``preflight`` checks, without touching the target, everything that can be
   checked (PID, CPython, version, permissions, architecture, tracer) and
   resolves the few symbols we need from the ELF ``.dynsym`` of the mapped
   libpython (or the python executable when statically linked) and libc.
2. One thread is stopped with PTRACE_SEIZE + PTRACE_INTERRUPT; the other
   threads keep running.  We only continue if the stop is at a *safe point*
   (see ``_unsafe_reason``): blocked in a syscall that does not hold libc
   locks, or executing code that is not libc / ld.so / an allocator.
3. Before changing anything, we write below the thread's red zone a kernel
   ``rt_sigframe`` describing its original context (registers with the
   kernel's syscall-restart fixup applied, full XSAVE image, signal mask).
4. On that thread we then call, one at a time, plain C functions that are
   safe there: ``mmap`` (our pages), ``__errno_location`` (errno is saved and
   restored), ``pthread_create(stub, source)`` and ``pthread_detach``,
   ``munmap``.  None of them takes a lock of the interpreter's (see
   ``_inject_on``), so the thread may be stopped anywhere in it.  Each
   is a hand-made x86-64 SysV call whose return address leads to an
   ``rt_sigreturn`` on that frame (libc's ``__restore_rt``, or a tiny
   trampoline in our page that first stores rax).  Resuming with
   PTRACE_SYSCALL, we catch that rt_sigreturn at its syscall-entry stop: the
   call has returned.  Finally the thread's registers, FPU/vector state and
   errno are restored and we PTRACE_DETACH; the stop lasts ~1-2 ms.

   Why not "return to address 0 and catch the SIGSEGV", the classic
   approach: if dyper dies (even SIGKILL) while the thread runs with our
   registers, the kernel detaches it and it would crash.  Here it just
   finishes the call and runs the rt_sigreturn itself: the target never
   crashes (measured: 0 deaths in hundreds of random SIGKILLs).  And the
   frame lets the kernel's XRSTOR restore AVX/AVX-512 state where
   PTRACE_SETREGSET(NT_X86_XSTATE) is broken (what killed gdb here).
5. The brand-new OS thread runs the stub: ``Py_IsInitialized`` ->
   ``PyGILState_Ensure`` -> ``PyRun_SimpleString(source)`` ->
   ``PyGILState_Release`` and finally tail-jumps into ``munmap`` of its own
   page, returning straight into libpthread: nothing is left in the target.
   ``PyGILState_Ensure`` takes the GIL the documented way, at the
   interpreter's own safe points, so this works even when the main thread is
   blocked in C for hours (sleep/select/join), unlike ``Py_AddPendingCall``.

Python >= 3.14 ships ``sys.remote_exec`` (PEP 768), which we use instead.

Public API: ``InjectError``, ``TargetInfo``, ``preflight``, ``run_in_target``.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import re
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import BinaryIO, Final

from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

__all__ = ["InjectError", "TargetInfo", "preflight", "run_in_target"]


# ---------------------------------------------------------------------------
# Public types
# ---------------------------------------------------------------------------


class InjectError(Exception):
    """Injection is impossible or failed; ``str()`` is one line: what + how to fix."""

    def __init__(self, message: str) -> None:
        # Collapse any whitespace/newlines so the CLI can always print one line.
        super().__init__(" ".join(message.split()))


@dataclass(frozen=True)
class TargetInfo:
    """What ``preflight`` learned about the target process."""

    pid: int
    exe: str  #: resolved /proc/PID/exe (as seen by the target)
    version: tuple[int, int, int]  #: (major, minor, micro) read from the target
    libpython: str  #: mapped libpython path, or ``exe`` when statically linked
    uid: int  #: effective uid of the target


# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------

_MIN_VERSION: Final = (3, 11)
_REMOTE_EXEC_VERSION: Final = (3, 14)  # sys.remote_exec (PEP 768)

_PTRACE_CONT: Final = 7
_PTRACE_SYSCALL: Final = 24
_PTRACE_GETREGS: Final = 12
_PTRACE_SETREGS: Final = 13
_PTRACE_GETFPREGS: Final = 14
_PTRACE_SETFPREGS: Final = 15
_PTRACE_DETACH: Final = 17
_PTRACE_GETSIGINFO: Final = 0x4202
_PTRACE_GETREGSET: Final = 0x4204
_PTRACE_SETREGSET: Final = 0x4205
_PTRACE_SEIZE: Final = 0x4206
_PTRACE_INTERRUPT: Final = 0x4207
_PTRACE_GET_SYSCALL_INFO: Final = 0x420E
_PTRACE_O_TRACESYSGOOD: Final = 1
_PTRACE_EVENT_STOP: Final = 128
_SYSCALL_STOP: Final = signal.SIGTRAP | 0x80  # WSTOPSIG of syscall stops (TRACESYSGOOD)
_SYSCALL_INFO_SIZE: Final = 88  # struct ptrace_syscall_info
_NT_X86_XSTATE: Final = 0x202
_WALL: Final = 0x40000000

# struct user_regs_struct (x86_64), 27 unsigned longs, in kernel order.
_REG_NAMES: Final = (
    *("r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8"),
    *("rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags"),
    *("rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs"),
)
_R: Final = {name: i for i, name in enumerate(_REG_NAMES)}
# struct sigcontext (x86_64) starts with these, in this order.
_SIGCONTEXT_REGS: Final = (
    *("r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rdi"),
    *("rsi", "rbp", "rbx", "rdx", "rax", "rcx", "rsp", "rip", "eflags"),
)
_REGS_FMT: Final = "<27Q"
_REGS_SIZE: Final = struct.calcsize(_REGS_FMT)
_FPREGS_SIZE: Final = 512  # struct user_fpregs_struct (FXSAVE image)
_XSTATE_MAX: Final = 1 << 16  # kernel trims iov_len to the real XSAVE size
_ARG_REGS: Final = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")
_U64: Final = (1 << 64) - 1
_EFLAGS_TF: Final = 1 << 8
_EFLAGS_DF: Final = 1 << 10

# Kernel-internal "restart me" errors seen in rax of an interrupted syscall.
_ERESTARTSYS: Final = 512
_ERESTARTNOINTR: Final = 513
_ERESTARTNOHAND: Final = 514
_ERESTART_RESTARTBLOCK: Final = 516
_NR_MMAP: Final = 9
_NR_RT_SIGRETURN: Final = 15
_NR_RESTART_SYSCALL: Final = 219

# Signal frame (struct rt_sigframe, x86_64) used as the rescue/restore frame.
_UC_SIZE: Final = 304  # struct ucontext: flags, link, stack_t, sigcontext, sigset
_SIGINFO_SIZE: Final = 128
_UC_FP_XSTATE: Final = 0x1
_UC_SIGCONTEXT_SS: Final = 0x2
_UC_STRICT_RESTORE_SS: Final = 0x4
_SS_INVALID: Final = 3  # neither 0, SS_ONSTACK nor SS_DISABLE
_FP_XSTATE_MAGIC1: Final = 0x46505853
_FP_XSTATE_MAGIC2: Final = 0x46505845
_XFEATURE_MASK_XTILE_DATA: Final = 1 << 18  # AMX tile data: the only dynamic feature
_XTILE_DATA_SIZE: Final = 8192
# Stack the called functions may need below the frame when the stack is not
# the auto-growing main stack (pthread_create uses well under 4 KiB).
_CALL_STACK_MIN: Final = 16 << 10

# libc's signal return trampoline __restore_rt is not exported; it is the
# only "mov rax, 15; syscall" (rt_sigreturn) in glibc and musl.
_RESTORE_RT_PATTERNS: Final = (
    b"\x48\xc7\xc0\x0f\x00\x00\x00\x0f\x05",  # mov rax, 15; syscall
    b"\xb8\x0f\x00\x00\x00\x0f\x05",  # mov eax, 15; syscall
)
_TRAMP_SIGRETURN_END: Final = 16  # offset just after the trampoline's syscall
_RESULT_OFFSET: Final = 64  # result slot in the trampoline page
_THREAD_T_OFFSET: Final = 128  # pthread_create's pthread_t out-parameter, same page

_PROT_RWX: Final = 0x7
_MAP_PRIVATE_ANON: Final = 0x02 | 0x20
_PAGE: Final = 4096
_MAX_SOURCE: Final = 16 << 20
_RED_ZONE_SKIP: Final = 1024  # > the 128-byte SysV red zone, generously

# x86_64 syscalls that libc issues while holding internal locks (malloc arena
# locks around mmap/brk/munmap/madvise, all malloc locks around fork/clone,
# the stack-cache lock around munmap at thread exit).  Calling malloc or
# pthread_create on a thread stopped in one of them could self-deadlock.
_UNSAFE_LIBC_SYSCALLS: Final = frozenset({9, 10, 11, 12, 25, 28, 56, 57, 58, 59, 60, 231, 322, 435})
_SYNC_FAULTS: Final = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP})
# Signals deferred (blocked in the calling thread) while the target thread
# runs with our registers, so Ctrl-C/SIGTERM don't interrupt an injection.
_DEFERRED_SIGNALS: Final = frozenset(
    {
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGTSTP,
        signal.SIGTTIN,
        signal.SIGTTOU,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGPIPE,
    }
)

_PY_SYMBOLS: Final = (
    "Py_Version",
    "Py_IsInitialized",
    "PyGILState_Ensure",
    "PyGILState_Release",
    "PyRun_SimpleString",
)
_LIBC_SYMBOLS: Final = ("mmap", "munmap", "__errno_location")
# In libc since glibc 2.34 and in musl; in libpthread before.
_THREAD_SYMBOLS: Final = ("pthread_create", "pthread_detach")
_WANTED_SYMBOLS: Final = frozenset(_PY_SYMBOLS + _LIBC_SYMBOLS + _THREAD_SYMBOLS)

_LIBPYTHON_RE: Final = re.compile(r"^libpython3\.(\d+)([a-z]*)\.so")
_EXE_VERSION_RE: Final = re.compile(r"python3\.(\d+)")
_LDSO_RE: Final = re.compile(r"^(ld-linux|ld64\.so|ld-2\.\d+\.so|ld\.so)")
# musl's ld-musl-x86_64.so.1 *is* its libc (and its dynamic linker).
_LIBC_RE: Final = re.compile(r"^(libc\.so|libc-2\.\d+\.so|libpthread[.-]|ld-musl)")
# Allocator replacements (LD_PRELOAD'ed jemalloc/tcmalloc/mimalloc, ...): their
# locks are taken by the malloc() our remote call makes.
_ALLOC_RE: Final = re.compile(r"malloc|libhoard")


# ---------------------------------------------------------------------------
# Small /proc helpers
# ---------------------------------------------------------------------------


def _read_text(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _status(path: str) -> dict[str, str]:
    """Parse a /proc/.../status file into {key: value}."""
    out: dict[str, str] = {}
    for line in _read_text(path).splitlines():
        key, sep, value = line.partition(":")
        if sep:
            out[key] = value.strip()
    return out


def _comm(pid: int) -> str:
    try:
        return _read_text(f"/proc/{pid}/comm").strip()
    except OSError:
        return "?"


@dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str  # "" for anonymous, "[vdso]" etc. for special mappings


def _read_maps(pid: int) -> list[_Mapping]:
    maps: list[_Mapping] = []
    for line in _read_text(f"/proc/{pid}/maps").splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        lo, _, hi = parts[0].partition("-")
        path = parts[5] if len(parts) > 5 else ""
        maps.append(_Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[2], 16), path))
    return maps


def _basename(path: str) -> str:
    return os.path.basename(path.removesuffix(" (deleted)"))


def _read_mem(pid: int, addr: int, size: int) -> bytes:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        data = os.pread(fd, size, addr)
    finally:
        os.close(fd)
    if len(data) != size:
        raise OSError(f"short read at {addr:#x}")
    return data


# ---------------------------------------------------------------------------
# ELF symbol resolution (pyelftools), cached per file identity
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _ElfInfo:
    e_type: str
    machine: str
    load_vaddr: int  # p_vaddr of the first PT_LOAD, page-aligned down
    load_offset: int  # p_offset of the first PT_LOAD, page-aligned down
    symbols: dict[str, int]  # defined dynamic symbols we care about -> st_value


# Keyed by (st_dev, st_ino, st_size, st_mtime_ns): the same libpython mapped
# into many targets is parsed once, and a replaced file is re-parsed.
_ELF_CACHE: dict[tuple[int, int, int, int], _ElfInfo] = {}
_ELF_CACHE_LOCK = threading.Lock()


def _parse_elf(f: BinaryIO) -> _ElfInfo:
    elf = ELFFile(f)
    loads = [seg for seg in elf.iter_segments() if seg["p_type"] == "PT_LOAD"]
    if not loads:
        raise OSError("ELF file has no PT_LOAD segment")
    mask = ~(_PAGE - 1)
    symbols: dict[str, int] = {}
    hashsec = elf.get_section_by_name(".gnu.hash") or elf.get_section_by_name(".hash")
    if hashsec is not None and hasattr(hashsec, "get_symbol"):
        # O(1) hash lookups instead of walking thousands of .dynsym entries.
        for name in _WANTED_SYMBOLS:
            sym = hashsec.get_symbol(name)
            if sym is not None and sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                symbols[name] = int(sym["st_value"])
    else:
        dynsym = elf.get_section_by_name(".dynsym")
        if isinstance(dynsym, SymbolTableSection):
            for sym in dynsym.iter_symbols():
                if sym.name in _WANTED_SYMBOLS and sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                    symbols.setdefault(sym.name, int(sym["st_value"]))
    return _ElfInfo(
        e_type=str(elf["e_type"]),
        machine=str(elf["e_machine"]),
        load_vaddr=int(loads[0]["p_vaddr"]) & mask,
        load_offset=int(loads[0]["p_offset"]) & mask,
        symbols=symbols,
    )


def _open_mapped_file(pid: int, mapping: _Mapping) -> BinaryIO:
    """Open the file behind a mapping, as the target sees it.

    Paths in /proc/PID/maps live in the target's mount namespace (containers),
    so go through /proc/PID/root; for a file replaced on disk since it was
    mapped ("(deleted)", e.g. after a package upgrade) use map_files.
    """
    candidates = []
    if not mapping.path.endswith(" (deleted)"):
        candidates.append(f"/proc/{pid}/root{mapping.path}")
    candidates.append(f"/proc/{pid}/map_files/{mapping.start:x}-{mapping.end:x}")
    if not mapping.path.endswith(" (deleted)"):
        candidates.append(mapping.path)
    err: OSError | None = None
    for path in candidates:
        try:
            return open(path, "rb")
        except OSError as e:
            err = e
    assert err is not None
    raise err


def _elf_for(pid: int, mapping: _Mapping) -> _ElfInfo:
    with _open_mapped_file(pid, mapping) as f:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        with _ELF_CACHE_LOCK:
            cached = _ELF_CACHE.get(key)
        if cached is not None:
            return cached
        info = _parse_elf(f)
    with _ELF_CACHE_LOCK:
        _ELF_CACHE[key] = info
    return info


def _load_bias(elf: _ElfInfo, path: str, maps: Sequence[_Mapping]) -> int:
    """Load bias = runtime address - link-time address (0 for ET_EXEC)."""
    if elf.e_type == "ET_EXEC":
        return 0
    mine = [m for m in maps if m.path == path]
    # The mapping of the first PT_LOAD: normally the lowest one, at file offset
    # p_offset (page-aligned); prefer an exact offset match if it exists.
    exact = [m for m in mine if m.offset == elf.load_offset]
    base = min(exact or mine, key=lambda m: m.start)
    return base.start - elf.load_vaddr


# ---------------------------------------------------------------------------
# Target description (internal, richer than TargetInfo)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Target:
    info: TargetInfo
    syms: dict[str, int]  # absolute addresses in the target
    maps: tuple[_Mapping, ...]
    libc_paths: frozenset[str]
    ldso_paths: frozenset[str]
    alloc_paths: frozenset[str]
    interp_paths: frozenset[str]  # exe + libpython: baseline-ISA interpreter code


def _have_cap_sys_ptrace() -> bool:
    try:
        cap_eff = int(_status("/proc/self/status").get("CapEff", "0"), 16)
    except (OSError, ValueError):
        return False
    return bool(cap_eff & (1 << 19))  # CAP_SYS_PTRACE


def _yama_scope() -> int:
    try:
        return int(_read_text("/proc/sys/kernel/yama/ptrace_scope").strip())
    except (OSError, ValueError):
        return 0  # no Yama LSM: classic rules only


def _is_descendant(pid: int, ancestor: int) -> bool:
    cur = pid
    for _ in range(4096):
        if cur == ancestor:
            return True
        if cur <= 1:
            return False
        try:
            cur = int(_status(f"/proc/{cur}/status").get("PPid", "0"))
        except (OSError, ValueError):
            return False
    return False


def _permission_error(pid: int, target_uid: int) -> InjectError:
    """Explain why we may not ptrace ``pid`` (one line, with the fix)."""
    me = os.geteuid()
    privileged = me == 0 or _have_cap_sys_ptrace()
    scope = _yama_scope()
    who = f"process {pid} ({_comm(pid)})"
    if scope >= 3:
        return InjectError(
            f"cannot ptrace {who}: kernel.yama.ptrace_scope=3 disables ptrace for everyone "
            "until reboot; reboot with kernel.yama.ptrace_scope<=1 to use dyper attach"
        )
    if not privileged and me != target_uid:
        return InjectError(
            f"cannot ptrace {who}: it runs as uid {target_uid} and you are uid {me}; "
            f"run dyper as uid {target_uid} (e.g. sudo -u '#{target_uid}') or with sudo"
        )
    if scope == 2 and not privileged:
        return InjectError(
            f"cannot ptrace {who}: kernel.yama.ptrace_scope=2 allows only CAP_SYS_PTRACE; "
            "run dyper with sudo, or set `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    if scope == 1 and not privileged and not _is_descendant(pid, os.getpid()):
        return InjectError(
            f"cannot ptrace {who}: kernel.yama.ptrace_scope=1 only allows tracing your own "
            "child processes; run dyper with sudo, or set `sudo sysctl kernel.yama.ptrace_scope=0`"
        )
    return InjectError(
        f"cannot ptrace {who}: permission denied (the target may be non-dumpable, e.g. "
        "setuid or prctl(PR_SET_DUMPABLE, 0), or an LSM such as AppArmor/SELinux or a "
        "container without CAP_SYS_PTRACE forbids it); run dyper with sudo in the same "
        "container/namespace as the target"
    )


def _check_host() -> None:
    if not sys.platform.startswith("linux"):
        raise InjectError(f"dyper attach only works on Linux (this is {sys.platform})")
    machine = platform.machine()
    if machine not in ("x86_64", "AMD64") or struct.calcsize("P") != 8:
        raise InjectError(
            f"dyper attach supports only x86_64 (this machine/interpreter is {machine}, "
            f"{struct.calcsize('P') * 8}-bit); run dyper with a 64-bit x86_64 Python"
        )


def _preflight(pid: int) -> _Target:
    """Full preflight; returns the internal target description."""
    _check_host()
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise InjectError(f"invalid PID {pid!r}: pass a positive process id")
    try:
        st = _status(f"/proc/{pid}/status")
    except FileNotFoundError:
        raise InjectError(f"no process with PID {pid}; check the PID with `ps` or `pgrep -f python`") from None
    except OSError as e:
        raise InjectError(f"cannot read /proc/{pid}/status ({e.strerror}); check the PID") from None
    if st.get("Tgid", str(pid)) != str(pid):
        raise InjectError(
            f"{pid} is a thread of process {st.get('Tgid')}; pass the process id {st.get('Tgid')} instead"
        )
    if pid == os.getpid():
        raise InjectError("cannot attach to dyper's own process; pass another PID")
    name = st.get("Name", "?")
    state = st.get("State", "?")
    if state[:1] in ("Z", "X"):
        raise InjectError(f"process {pid} ({name}) is exiting (state {state}); nothing to attach to")
    # Already traced (gdb, strace, py-spy --native, another dyper)?  Checked
    # before the state and permission checks: it is the real cause of both.
    for task in _list_tasks(pid):
        try:
            tracer = int(_status(f"/proc/{pid}/task/{task}/status").get("TracerPid", "0"))
        except (OSError, ValueError):
            continue
        if tracer:
            raise InjectError(
                f"process {pid} ({name}) is already being traced by PID {tracer} "
                f"({_comm(tracer)}); detach that debugger/tracer first (only one tracer "
                "is allowed at a time)"
            )
    if state[:1] in ("T", "t"):
        raise InjectError(f"process {pid} ({name}) is stopped (state {state}); resume it with `kill -CONT {pid}` first")

    try:
        target_uid = int(st.get("Uid", "0").split()[1])
    except (IndexError, ValueError):
        target_uid = -1

    # Opening /proc/PID/mem performs exactly the kernel's ptrace attach check
    # (uid, CAP_SYS_PTRACE, dumpable, Yama, LSMs) without touching the target.
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDONLY))
    except FileNotFoundError:
        raise InjectError(f"no process with PID {pid} (it just exited)") from None
    except PermissionError:
        raise _permission_error(pid, target_uid) from None

    try:
        exe = os.readlink(f"/proc/{pid}/exe").removesuffix(" (deleted)")
        maps = _read_maps(pid)
    except FileNotFoundError:
        raise InjectError(f"no process with PID {pid} (it just exited)") from None
    except OSError as e:
        raise InjectError(
            f"cannot inspect process {pid} ({name}): {e.strerror}; it may be a kernel thread, or run dyper with sudo"
        ) from None

    # Architecture of the target executable (e.g. an i386 python on x86_64).
    try:
        with open(f"/proc/{pid}/exe", "rb") as f:
            ident = f.read(20)
    except OSError as e:
        raise InjectError(f"cannot read the executable of process {pid}: {e.strerror}") from None
    if len(ident) < 20 or ident[:4] != b"\x7fELF":
        raise InjectError(f"process {pid} ({name}) does not run an ELF executable; not CPython")
    (e_machine,) = struct.unpack_from("<H", ident, 18)
    if ident[4] != 2 or e_machine != 62:  # ELFCLASS64, EM_X86_64
        arch = {3: "i386", 40: "arm", 183: "aarch64", 62: "x86_64 (32-bit x32)"}.get(
            e_machine, f"e_machine {e_machine}"
        )
        raise InjectError(
            f"process {pid} ({name}) is a {arch} binary; dyper attach supports only 64-bit x86_64 targets"
        )

    # Find the interpreter: a mapped libpython3.X.so, else the executable
    # itself when Python is statically linked (e.g. Debian's /usr/bin/python3).
    paths = []
    seen: set[str] = set()
    for m in maps:
        if m.path.startswith("/") and m.path not in seen:
            seen.add(m.path)
            paths.append(m.path)
    libpython_path = next((p for p in paths if _LIBPYTHON_RE.match(_basename(p))), None)
    py_path = libpython_path or next((p for p in paths if p.removesuffix(" (deleted)") == exe), None)
    not_python = InjectError(
        f"process {pid} ({name}, {exe}) is not a CPython process: no libpython3.X.so or "
        "python executable with Py_ symbols is mapped; pass the PID of the python process "
        "itself (not a shell, launcher or supervisor)"
    )
    if py_path is None:
        raise not_python
    py_map = min((m for m in maps if m.path == py_path), key=lambda m: m.start)
    try:
        py_elf = _elf_for(pid, py_map)
    except Exception as e:  # pyelftools raises its own error types on odd files
        raise InjectError(f"cannot parse {py_path} of process {pid}: {e}; not CPython?") from None
    if "PyRun_SimpleString" not in py_elf.symbols:
        raise not_python
    py_bias = _load_bias(py_elf, py_path, maps)

    # Version: Py_Version (3.11+) read from the target's memory is the truth;
    # older versions lack it, so fall back to the library/executable name.
    if "Py_Version" in py_elf.symbols:
        try:
            (hexversion,) = struct.unpack("<Q", _read_mem(pid, py_bias + py_elf.symbols["Py_Version"], 8))
        except OSError as e:
            raise InjectError(f"cannot read Py_Version of process {pid}: {e}") from None
        version = ((hexversion >> 24) & 0xFF, (hexversion >> 16) & 0xFF, (hexversion >> 8) & 0xFF)
    else:
        mm = _LIBPYTHON_RE.match(_basename(py_path)) or _EXE_VERSION_RE.search(_basename(py_path))
        minor = int(mm.group(1)) if mm else 0
        shown = f"3.{minor}" if mm else "older than 3.11"
        raise InjectError(
            f"process {pid} ({name}) runs Python {shown}; dyper attach needs CPython "
            f"{_MIN_VERSION[0]}.{_MIN_VERSION[1]} or newer: run the service under Python >= 3.11"
        )
    if version[0] != 3 or version[:2] < _MIN_VERSION:
        raise InjectError(
            f"process {pid} ({name}) runs Python {version[0]}.{version[1]}; dyper attach needs "
            f"CPython {_MIN_VERSION[0]}.{_MIN_VERSION[1]} or newer: run the service under "
            "Python >= 3.11"
        )
    libm = _LIBPYTHON_RE.match(_basename(py_path))
    if (libm and "t" in libm.group(2)) or re.fullmatch(r"python3\.\d+t", _basename(exe)):
        raise InjectError(
            f"process {pid} ({name}) runs a free-threaded (no-GIL) CPython build, which "
            "dyper attach does not support yet; use a default (GIL) build"
        )

    info = TargetInfo(
        pid=pid,
        exe=exe,
        version=version,
        libpython=py_path.removesuffix(" (deleted)"),
        uid=target_uid,
    )
    ldso = frozenset(p for p in paths if _LDSO_RE.match(_basename(p)))
    libc = frozenset(p for p in paths if _LIBC_RE.match(_basename(p)))
    alloc = frozenset(p for p in paths if _ALLOC_RE.search(_basename(p)))
    interp = frozenset(p for p in (py_path, exe) if p)
    syms = {name: py_bias + off for name, off in py_elf.symbols.items()}

    if version[:2] >= _REMOTE_EXEC_VERSION:
        # sys.remote_exec path: no ptrace, no symbols needed.
        return _Target(info, syms, tuple(maps), libc, ldso, alloc, interp)

    missing = [s for s in _PY_SYMBOLS if s not in syms]
    if missing:
        raise InjectError(
            f"{py_path} of process {pid} does not export {', '.join(missing)}; this CPython "
            "build is not supported by dyper attach"
        )
    libc_path = next((p for p in paths if p in libc and not _basename(p).startswith("libpthread")), None)
    if libc_path is None:
        raise InjectError(
            f"process {pid} ({name}) has no shared libc mapped (fully static binary?); "
            "dyper attach needs a dynamically linked glibc/musl process"
        )
    libc_syms = _exported(pid, libc_path, maps)
    for sname in _LIBC_SYMBOLS:
        if sname not in libc_syms:
            raise InjectError(f"{libc_path} of process {pid} does not export {sname}; unsupported libc")
        syms[sname] = libc_syms[sname]
    syms.update({s: libc_syms[s] for s in _THREAD_SYMBOLS if s in libc_syms})
    pthread_path = next((p for p in paths if _basename(p).startswith("libpthread")), None)
    if pthread_path is not None and any(s not in syms for s in _THREAD_SYMBOLS):
        # glibc before 2.34: the thread functions live in libpthread, which CPython links.
        pthread_syms = _exported(pid, pthread_path, maps)
        syms.update({s: pthread_syms[s] for s in _THREAD_SYMBOLS if s not in syms and s in pthread_syms})
    missing = [s for s in _THREAD_SYMBOLS if s not in syms]
    if missing:
        raise InjectError(
            f"process {pid} ({name}) exports no {', '.join(missing)} in its libc or libpthread; unsupported libc"
        )

    # CET user shadow stacks: the `ret` of a function we entered by setting
    # rip (no matching `call`) would be a control-protection fault.
    if "shstk" in st.get("x86_Thread_features", ""):
        raise InjectError(
            f"process {pid} ({name}) runs with x86 CET shadow stacks enabled, which dyper "
            "attach does not support; restart it with GLIBC_TUNABLES=glibc.cpu.x86_shstk=off"
        )
    restore_rt = _find_restore_rt(pid, maps, libc_path)
    if restore_rt is None:
        raise InjectError(f"cannot find the rt_sigreturn trampoline in {libc_path} of process {pid}; unsupported libc")
    syms["__restore_rt"], syms["__restore_rt_end"] = restore_rt
    return _Target(info, syms, tuple(maps), libc, ldso, alloc, interp)


_RESTORE_RT_CACHE: dict[tuple[int, int, int, int, int], tuple[int, int] | None] = {}


def _exported(pid: int, path: str, maps: Sequence[_Mapping]) -> dict[str, int]:
    """The wanted symbols a library mapped in process ``pid`` exports, at their addresses there."""
    first = min((m for m in maps if m.path == path), key=lambda m: m.start)
    try:
        elf = _elf_for(pid, first)
    except Exception as e:
        raise InjectError(f"cannot parse {path} of process {pid}: {e}") from None
    bias = _load_bias(elf, path, maps)
    return {name: bias + offset for name, offset in elf.symbols.items()}


def _find_restore_rt(pid: int, maps: Sequence[_Mapping], path: str) -> tuple[int, int] | None:
    """(address, address just after its syscall) of libc's __restore_rt."""
    for m in maps:
        if m.path != path or "x" not in m.perms:
            continue
        with _open_mapped_file(pid, m) as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, m.offset)
            if key not in _RESTORE_RT_CACHE:
                f.seek(m.offset)
                text = f.read(m.end - m.start)
                found: tuple[int, int] | None = None
                for pattern in _RESTORE_RT_PATTERNS:
                    idx = text.find(pattern)
                    if idx >= 0 and text.find(pattern, idx + 1) < 0:  # unique
                        found = (idx, idx + len(pattern))
                        break
                _RESTORE_RT_CACHE[key] = found
            rel = _RESTORE_RT_CACHE[key]
        if rel is not None:
            addr = m.start + rel[0]
            # Check the bytes really are mapped there in the target.
            try:
                if _read_mem(pid, addr, rel[1] - rel[0]) in _RESTORE_RT_PATTERNS:
                    return addr, m.start + rel[1]
            except OSError:
                pass
    return None


def _list_tasks(pid: int) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []


def preflight(pid: int) -> TargetInfo:
    """Check that ``pid`` can be attached to, without touching the process.

    Raises ``InjectError`` (one-line message with the fix) when: the PID does
    not exist; it is not a CPython process; its version is unsupported
    (< 3.11); we may not ptrace it (uid, CAP_SYS_PTRACE, Yama ptrace_scope,
    non-dumpable); it is not x86_64; or it is already being traced.
    """
    return _preflight(pid).info


# ---------------------------------------------------------------------------
# ptrace via ctypes
# ---------------------------------------------------------------------------

_libc_handle: ctypes.CDLL | None = None


def _ptrace_fn() -> ctypes._NamedFuncPointer:
    global _libc_handle
    if _libc_handle is None:
        _libc_handle = ctypes.CDLL(None, use_errno=True)
    fn = _libc_handle.ptrace
    # glibc's ptrace is variadic, but all its arguments are INTEGER class, so
    # the fixed-argument call below is ABI-identical on x86_64.
    fn.restype = ctypes.c_long
    fn.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    return fn


def _ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> int:
    ctypes.set_errno(0)
    res = int(_ptrace_fn()(request, tid, addr or None, data or None))
    if res == -1:
        err = ctypes.get_errno()
        if err:
            raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")
    return res


class _Gone(Exception):
    """The traced thread (or the whole target) exited."""


_sigchld = threading.local()  # .waiting: SIGCHLD blocked here; .consumed: count


def _wait_sigchld(timeout: float) -> None:
    """Sleep until a SIGCHLD arrives (or ``timeout``), if we may consume it."""
    if getattr(_sigchld, "waiting", False):
        if signal.sigtimedwait([signal.SIGCHLD], timeout) is not None:
            _sigchld.consumed = getattr(_sigchld, "consumed", 0) + 1
    else:
        time.sleep(min(timeout, 0.0002))


@contextmanager
def _deferred_signals() -> Iterator[None]:
    """Block termination-type signals and SIGCHLD in this thread while we
    hold a target thread.

    Termination signals: not needed for the target's safety (see
    ``_Tracee.write_rescue_frame``), but a Ctrl-C then can't leave a leaked
    page or a half-finished injection behind.  SIGKILL can't be blocked;
    everything else is delivered right after we detached.

    SIGCHLD: ``_Tracee._wait`` sleeps in sigtimedwait() for it.  If dyper has
    a SIGCHLD handler, one SIGCHLD is re-raised afterwards so it still runs.
    """
    blocked = set(_DEFERRED_SIGNALS) | {signal.SIGCHLD}
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
    except (AttributeError, OSError, ValueError):
        yield
        return
    was_waiting = getattr(_sigchld, "waiting", False)
    _sigchld.waiting = signal.SIGCHLD not in old
    _sigchld.consumed = 0
    try:
        yield
    finally:
        consumed = getattr(_sigchld, "consumed", 0)
        _sigchld.waiting = was_waiting
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
        handler = signal.getsignal(signal.SIGCHLD)
        if consumed and callable(handler):
            signal.raise_signal(signal.SIGCHLD)


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= (1 << 63) else value


@dataclass(frozen=True)
class _Restore:
    """How to put the thread back exactly where it was.

    ``regs`` are the saved registers with the kernel's syscall-restart fixup
    already applied (so they are valid at *any* stop and from a sigreturn):
    for a syscall interrupted with -ERESTARTSYS/-ERESTARTNOINTR/-ERESTARTNOHAND
    rax = syscall number and rip -= 2 (re-execute the `syscall` instruction);
    for -ERESTART_RESTARTBLOCK rax = __NR_restart_syscall.  orig_rax = -1 so
    the kernel does not apply the fixup a second time.  Without this, the
    -514 (ERESTARTNOHAND) in rax leaks to user space: the gdb failure.
    """

    regs: tuple[int, ...]
    restart_block: bool  # needs restart_syscall, which sigreturn would defeat


def _restore_state(saved: Sequence[int]) -> _Restore:
    regs = list(saved)
    restart_block = False
    if _signed(saved[_R["orig_rax"]]) >= 0:
        err = _signed(saved[_R["rax"]])
        if err in (-_ERESTARTSYS, -_ERESTARTNOINTR, -_ERESTARTNOHAND):
            regs[_R["rax"]] = saved[_R["orig_rax"]]
            regs[_R["rip"]] = saved[_R["rip"]] - 2
        elif err == -_ERESTART_RESTARTBLOCK:
            regs[_R["rax"]] = _NR_RESTART_SYSCALL
            regs[_R["rip"]] = saved[_R["rip"]] - 2
            restart_block = True
    regs[_R["orig_rax"]] = _U64
    return _Restore(tuple(regs), restart_block)


def _fpstate_image(xstate: bytes | None, fxsave: bytes | None) -> tuple[bytes, bool]:
    """The FPU image for our signal frame, and whether it is a full XSAVE image.

    A PTRACE_GETREGSET(NT_X86_XSTATE) image is the standard-format XSAVE area
    of fpu_user_cfg.max_size bytes; its sw_reserved area holds XCR0 (not the
    signal-frame bytes).  We turn it into what sigreturn expects: sw_reserved
    = {FP_XSTATE_MAGIC1, extended_size, xfeatures, xstate_size} and
    FP_XSTATE_MAGIC2 right after the state.  Where "after" is depends on the
    kernel (the frame's xstate_size, or since 6.x the task's user_size) and on
    whether the process enabled AMX (the only dynamic feature: TILEDATA, 8 KiB,
    last in the layout), so MAGIC2 is written at both candidate offsets; each
    lies outside what XRSTOR reads for the respective size.  Without such an
    image, fall back to the 512-byte FXSAVE image with sw_reserved cleared,
    which the kernel restores as x87/SSE only.
    """
    if xstate is not None and len(xstate) >= 576:
        (xcr0,) = struct.unpack_from("<Q", xstate, 464)
        if xcr0 & 3 == 3:
            max_size = len(xstate)
            default_size = max_size
            if xcr0 & _XFEATURE_MASK_XTILE_DATA and max_size - _XTILE_DATA_SIZE >= 576:
                default_size = max_size - _XTILE_DATA_SIZE
            img = bytearray(xstate) + bytes(4)
            img[464:512] = struct.pack("<IIQI", _FP_XSTATE_MAGIC1, default_size + 4, xcr0, default_size).ljust(
                48, b"\0"
            )
            struct.pack_into("<I", img, default_size, _FP_XSTATE_MAGIC2)
            struct.pack_into("<I", img, max_size, _FP_XSTATE_MAGIC2)
            return bytes(img), True
    if fxsave is not None:
        base = fxsave
    elif xstate is not None:
        base = xstate[:512]
    else:  # nothing saved: a default x87/SSE state (FCW 0x37f, MXCSR 0x1f80)
        base = struct.pack("<H", 0x37F).ljust(24, b"\0") + struct.pack("<I", 0x1F80)
    return base[:464].ljust(464, b"\0") + bytes(48), False


# Whether PTRACE_SETREGSET(NT_X86_XSTATE) works on this kernel (it is what
# broke gdb here).  None = not probed yet.  Probed once per dyper process by
# writing back, unchanged, the state just read (the kernel validates and
# copies the buffer before touching any state, so a failure is harmless).
_setregset_works: bool | None = None


class _Tracee:
    """One seized thread of the target.

    All ptrace requests must come from the OS thread that seized it, so an
    instance is used by one thread only.

    How a remote call works (x86_64 SysV, integer args)::

        stack (grows down)       | ...interrupted frames...  |  <- original rsp
                                 | 128-byte red zone, margin |
                                 | fpstate (XSAVE image)     |  64-aligned
                                 | siginfo (unused)          |
                         U  ->   | ucontext: original regs   |  16-aligned
                       U-8  ->   | return address            |
                                 | callee frames...          |

    The return address leads to ``mov rax, 15; syscall`` = rt_sigreturn on
    the frame at U-8: libc's own ``__restore_rt`` for calls whose result we
    don't need from rax, or a 4-instruction trampoline in our page that
    first stores rax into the page.  We resume with PTRACE_SYSCALL and catch
    that rt_sigreturn at its syscall-entry stop: the call is done, and we
    skip the sigreturn (orig_rax = -1).  After the last call we restore the
    registers with PTRACE_SETREGS/SETREGSET - or, on kernels where
    PTRACE_SETREGSET(NT_X86_XSTATE) fails (the gdb failure mode), we let the
    rt_sigreturn run: it restores every register, the full AVX/AVX-512 state
    (by XRSTOR) and the signal mask.

    The point: if dyper dies at *any* moment (even SIGKILL), the kernel
    detaches and the thread simply finishes the current call and runs that
    rt_sigreturn itself - the target never crashes.  The worst outcome is a
    leaked page (or the thread's pages if it was not started yet), a changed
    errno and, for an interrupted restart_syscall-type sleep, an EINTR
    (which CPython retries, PEP 475).
    """

    def __init__(self, target: _Target, tid: int) -> None:
        self.target = target
        self.pid = target.info.pid
        self.tid = tid
        self.attached = False  # we are its tracer
        self.stopped = False  # it is in a ptrace-stop (so regs may be accessed)
        self.status = 0  # wait status of the current stop
        self.in_syscall = False  # between a syscall-entry and its exit stop
        self.running_call = False  # it is executing one of our remote calls
        self.modified = False  # its registers are not the original ones
        self.at_sigreturn = False  # stopped at the entry of *our* rt_sigreturn
        self.saved_regs: list[int] | None = None
        self.restore: _Restore | None = None
        self.saved_fp: bytes | None = None
        self.saved_xstate: bytes | None = None
        self.full_vectors = False  # every vector register bit can be restored
        self.frame_u = 0  # U: address of the ucontext of our sigreturn frame
        self.errno_addr = 0
        self.saved_errno: bytes | None = None
        self.detach_sig = 0  # foreign signal to deliver when detaching
        self._memfd = -1
        self._have_syscall_info = True

    # -- low level --------------------------------------------------------

    def seize(self) -> None:
        # TRACESYSGOOD marks syscall stops (SIGTRAP|0x80).  Never EXITKILL.
        _ptrace(_PTRACE_SEIZE, self.tid, 0, _PTRACE_O_TRACESYSGOOD)
        self.attached = True

    def _wait(self, deadline: float) -> int | None:
        """Next wait status of the tracee, or None at the deadline.

        Every ptrace stop also sends SIGCHLD to the tracer, so we sleep in
        sigtimedwait(SIGCHLD) (blocked in this thread by ``_deferred_signals``)
        and wake up as soon as the tracee stops.  The short timeout is the
        safety net for a SIGCHLD taken by another thread of our process.
        (Polling instead costs a timer tick per stop, or with sched_yield()
        hands our CPU to a CPU-bound target for a whole time slice.)
        """
        while True:
            try:
                wpid, status = os.waitpid(self.tid, os.WNOHANG | _WALL)
            except ChildProcessError:
                self.attached = self.stopped = False
                raise _Gone(f"thread {self.tid} vanished") from None
            if wpid == self.tid:
                if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                    self.attached = self.stopped = False
                    raise _Gone(f"thread {self.tid} exited")
                self.stopped = True
                self.status = status
                if os.WSTOPSIG(status) == _SYSCALL_STOP:
                    self._track_syscall_stop()
                return status
            now = time.monotonic()
            if now >= deadline:
                return None
            _wait_sigchld(min(deadline - now, 0.002))

    def _track_syscall_stop(self) -> None:
        """Keep ``in_syscall`` right: entry and exit stops look alike."""
        if self._have_syscall_info:
            buf = ctypes.create_string_buffer(_SYSCALL_INFO_SIZE)
            try:
                _ptrace(_PTRACE_GET_SYSCALL_INFO, self.tid, _SYSCALL_INFO_SIZE, ctypes.addressof(buf))
                op = buf.raw[0]
                if op in (1, 2):  # PTRACE_SYSCALL_INFO_ENTRY / _EXIT
                    self.in_syscall = op == 1
                    return
            except OSError:
                self._have_syscall_info = False  # kernel < 5.3
        # ptrace(2): an entry stop is always followed by its exit stop.
        self.in_syscall = not self.in_syscall

    def _resume(self, request: int, sig: int = 0) -> None:
        _ptrace(request, self.tid, 0, sig)
        self.stopped = False

    def getregs(self) -> list[int]:
        buf = ctypes.create_string_buffer(_REGS_SIZE)
        _ptrace(_PTRACE_GETREGS, self.tid, 0, ctypes.addressof(buf))
        return list(struct.unpack(_REGS_FMT, buf.raw))

    def setregs(self, regs: Sequence[int]) -> None:
        buf = ctypes.create_string_buffer(struct.pack(_REGS_FMT, *regs), _REGS_SIZE)
        _ptrace(_PTRACE_SETREGS, self.tid, 0, ctypes.addressof(buf))

    def _siginfo_code(self) -> int:
        buf = ctypes.create_string_buffer(128)  # siginfo_t
        try:
            _ptrace(_PTRACE_GETSIGINFO, self.tid, 0, ctypes.addressof(buf))
        except OSError:
            return 0
        _signo, _errno, code = struct.unpack_from("<iii", buf.raw)
        return int(code)

    def _mem(self) -> int:
        if self._memfd < 0:
            # The per-thread mem file: with proc_mem.force_override=ptrace the
            # kernel grants the ptrace override only for the *traced* task.
            self._memfd = os.open(f"/proc/{self.pid}/task/{self.tid}/mem", os.O_RDWR)
        return self._memfd

    def mem_write(self, addr: int, data: bytes) -> None:
        if os.pwrite(self._mem(), data, addr) != len(data):
            raise OSError(f"short write into process {self.pid} at {addr:#x}")

    def mem_read(self, addr: int, size: int) -> bytes:
        data = os.pread(self._mem(), size, addr)
        if len(data) != size:
            raise OSError(f"short read from process {self.pid} at {addr:#x}")
        return data

    # -- stopping ---------------------------------------------------------

    def interrupt_and_wait(self, deadline: float) -> str | None:
        """PTRACE_INTERRUPT and wait for the resulting stop.

        Returns None when stopped by our interrupt, else a reason string (the
        thread is then left stopped or running; ``close`` copes with both).
        """
        _ptrace(_PTRACE_INTERRUPT, self.tid, 0, 0)
        deadline = min(deadline, time.monotonic() + 1.0)  # leave time for other threads
        while True:
            status = self._wait(deadline)
            if status is None:
                return "thread did not stop in time (uninterruptible sleep?)"
            sig = os.WSTOPSIG(status)
            if (status >> 16) == _PTRACE_EVENT_STOP:
                if sig == signal.SIGTRAP:
                    return None  # our PTRACE_INTERRUPT stop
                # Group-stop (SIGSTOP/SIGTSTP...): the process is being stopped.
                return f"process is being job-control stopped (signal {sig})"
            # A signal was about to be delivered to this thread: deliver it
            # unchanged; our interrupt stop stays pending.
            self._resume(_PTRACE_CONT, sig)

    # -- saving state -----------------------------------------------------

    def save_state(self) -> None:
        """Save GP registers, the FXSAVE image and, if the kernel gives it,
        the full XSAVE image (AVX/AVX-512 upper halves, opmasks, PKRU)."""
        self.saved_regs = self.getregs()
        self.restore = _restore_state(self.saved_regs)
        fp = ctypes.create_string_buffer(_FPREGS_SIZE)
        try:
            _ptrace(_PTRACE_GETFPREGS, self.tid, 0, ctypes.addressof(fp))
            self.saved_fp = fp.raw
        except OSError:
            self.saved_fp = None
        buf = ctypes.create_string_buffer(_XSTATE_MAX)
        iov = (ctypes.c_uint64 * 2)(ctypes.addressof(buf), _XSTATE_MAX)
        global _setregset_works
        try:
            _ptrace(_PTRACE_GETREGSET, self.tid, _NT_X86_XSTATE, ctypes.addressof(iov))
            self.saved_xstate = buf.raw[: int(iov[1])]
        except OSError:
            self.saved_xstate = None
        if self.saved_xstate is not None and _setregset_works is None:
            try:
                _ptrace(_PTRACE_SETREGSET, self.tid, _NT_X86_XSTATE, ctypes.addressof(iov))
                _setregset_works = True
            except OSError:
                _setregset_works = False
        # All vector registers come back either via PTRACE_SETREGSET or via
        # XRSTOR in the sigreturn of our frame (needs the XSAVE image).
        self.full_vectors = (
            bool(_setregset_works and self.saved_xstate is not None)
            or (_fpstate_image(self.saved_xstate, self.saved_fp)[1])
        )

    def write_rescue_frame(self, sigmask: int) -> None:
        """Write the rt_sigframe describing the original context (see class
        docstring) below the red zone.  Written once, before any register is
        changed, and never touched again: whatever happens to dyper later,
        an rt_sigreturn on it restores the thread."""
        assert self.saved_regs is not None and self.restore is not None
        fpimage, full = _fpstate_image(self.saved_xstate, self.saved_fp)
        rsp = self.saved_regs[_R["rsp"]]
        fp_addr = (rsp - _RED_ZONE_SKIP - len(fpimage)) & ~63
        u = (fp_addr - _UC_SIZE - _SIGINFO_SIZE) & ~15
        stack = next((m for m in self.target.maps if m.start <= rsp - 1 < m.end), None)
        # The main thread's "[stack]" grows on the callee's page faults; other
        # stacks are fixed-size mappings with a guard page below.
        room = 0 if stack is not None and stack.path == "[stack]" else _CALL_STACK_MIN
        if stack is None or u - 8 - room < stack.start:
            # /proc/PID/mem writes do not grow a stack mapping (Linux >= 6.5).
            raise _Unsafe("not enough mapped stack below rsp for the rescue frame")
        r = self.restore.regs
        mcontext = struct.pack(
            "<18Q4H4Q9Q",
            *(r[_R[n]] for n in _SIGCONTEXT_REGS),
            r[_R["cs"]] & 0xFFFF,
            0,  # gs: ignored on x86_64
            0,  # fs: ignored on x86_64 (fs_base is not touched by sigreturn)
            r[_R["ss"]] & 0xFFFF,
            0,  # err
            0,  # trapno
            0,  # oldmask
            0,  # cr2
            fp_addr,  # fpstate
            *([0] * 8),  # reserved1
        )
        uc = (
            struct.pack(
                "<QQQi4xQ",
                (_UC_FP_XSTATE if full else 0) | _UC_SIGCONTEXT_SS | _UC_STRICT_RESTORE_SS,
                0,  # uc_link
                0,  # uc_stack.ss_sp
                # uc_stack.ss_flags: an invalid mode, so restore_altstack() fails
                # with EINVAL, which sigreturn ignores: the thread's sigaltstack
                # (e.g. faulthandler's) is left exactly as it is.
                _SS_INVALID,
                0,  # uc_stack.ss_size
            )
            + mcontext
            + struct.pack("<Q", sigmask)
        )
        assert len(uc) == _UC_SIZE
        blob = bytearray(fp_addr + len(fpimage) - (u - 8))
        struct.pack_into("<Q", blob, 0, self.target.syms["__restore_rt"])  # pretcode / ret addr
        blob[8 : 8 + _UC_SIZE] = uc
        blob[fp_addr - (u - 8) :] = fpimage
        self.mem_write(u - 8, bytes(blob))
        self.frame_u = u

    # -- remote call --------------------------------------------------------

    def call(
        self,
        fn: int,
        args: Sequence[int],
        timeout: float,
        *,
        trampoline: int = 0,
        result_addr: int = 0,
        capture_syscall: int = -1,
    ) -> int | None:
        """Call ``fn(*args)`` on the stopped thread; see the class docstring.

        With ``trampoline``, the call goes through our page's trampoline and
        its result is read from ``result_addr``.  Otherwise it returns straight
        into libc's __restore_rt, and the only result available is the return
        value of the first ``capture_syscall`` syscall made by the call itself
        (seen at its syscall-exit stop), or None.
        """
        assert self.restore is not None and self.stopped and self.frame_u and len(args) <= 6
        u = self.frame_u
        regs = list(self.restore.regs)
        # orig_rax = -1 (from _restore_state): whatever stop we are at, the
        # kernel must not apply syscall-restart fixups to our registers, and a
        # pending syscall entry (our previous rt_sigreturn) is skipped.
        if trampoline:
            regs[_R["rip"]] = trampoline
            regs[_R["rax"]] = fn
            regs[_R["rsp"]] = u  # the trampoline's `call` pushes the ret addr
            site = trampoline + _TRAMP_SIGRETURN_END
        else:
            regs[_R["rip"]] = fn
            regs[_R["rax"]] = 0  # no vector args (varargs convention)
            regs[_R["rsp"]] = u - 8  # [u-8] = __restore_rt; rsp % 16 == 8
            site = self.target.syms["__restore_rt_end"]
            self.mem_write(u - 8, struct.pack("<Q", self.target.syms["__restore_rt"]))
        regs[_R["eflags"]] &= ~(_EFLAGS_DF | _EFLAGS_TF)  # ABI: DF clear at calls
        for reg, value in zip(_ARG_REGS, args, strict=False):
            regs[_R[reg]] = value & _U64
        self.modified = True
        self.at_sigreturn = False
        self.setregs(regs)
        self._resume(_PTRACE_SYSCALL)
        self.running_call = True
        captured: int | None = None
        deadline = time.monotonic() + timeout
        while True:
            status = self._wait(deadline)
            if status is None:
                raise InjectError(
                    f"a function called inside process {self.pid} did not return within "
                    f"{timeout:.1f}s; the call was abandoned and the thread restored "
                    "(retry; if it persists, report a dyper bug)"
                )
            sig = os.WSTOPSIG(status)
            if sig == _SYSCALL_STOP:
                now = self.getregs()
                if (
                    self.in_syscall
                    and now[_R["orig_rax"]] == _NR_RT_SIGRETURN
                    and now[_R["rip"]] == site
                    and now[_R["rsp"]] == u
                ):
                    # Our rt_sigreturn: the function has returned.
                    self.running_call = False
                    self.at_sigreturn = True
                    if trampoline:
                        (result,) = struct.unpack("<Q", self.mem_read(result_addr, 8))
                        return int(result)
                    return captured
                if (
                    not self.in_syscall
                    and captured is None
                    and now[_R["orig_rax"]] == capture_syscall
                    and u - 512 <= now[_R["rsp"]] <= u
                ):
                    captured = now[_R["rax"]]  # exit stop of the call's own syscall
                self._resume(_PTRACE_SYSCALL)
                continue
            if (status >> 16) != 0:
                # Group-stop (someone sent SIGSTOP) during our call: finish the
                # call anyway; on detach the kernel puts the thread back into
                # the group stop.
                self._resume(_PTRACE_SYSCALL)
                continue
            if sig in _SYNC_FAULTS and self._siginfo_code() > 0:
                # A genuine fault inside our call: never let the target see it.
                self.running_call = False
                raise InjectError(
                    f"a function called inside process {self.pid} faulted (signal {sig}); "
                    "the thread was restored; please report a dyper bug"
                )
            # Asynchronous signal (SIGCHLD, SIGALRM, kill()...) that happened to
            # pick this thread: deliver it now, as during any libc call.
            self._resume(_PTRACE_SYSCALL, sig)

    # -- teardown -----------------------------------------------------------

    def _settle(self) -> None:
        """Bring a running tracee into a ptrace-stop where it can be restored.

        If one of our calls is in flight, let it finish (never abandon e.g.
        pthread_create half-way, it may hold locks); only after a grace period
        force a stop with PTRACE_INTERRUPT.  A foreign signal met on the way is
        remembered and delivered by PTRACE_DETACH.
        """
        grace = time.monotonic() + (5.0 if self.running_call else 2.0)
        forced = False
        u = self.frame_u
        while self.attached and not self.stopped:
            status = self._wait(grace)
            if status is None:
                if forced:
                    # Still not stopped (uninterruptible sleep?).  If a call is
                    # in flight it restores itself via the rescue frame; a
                    # pending interrupt stop ends when dyper exits.
                    return
                with suppress(OSError):
                    _ptrace(_PTRACE_INTERRUPT, self.tid, 0, 0)
                forced = True
                grace = time.monotonic() + 5.0
                continue
            sig = os.WSTOPSIG(status)
            if sig == _SYSCALL_STOP:
                if self.running_call:
                    now = self.getregs()
                    if self.in_syscall and now[_R["orig_rax"]] == _NR_RT_SIGRETURN and now[_R["rsp"]] == u:
                        self.running_call = False
                        self.at_sigreturn = True
                        continue  # stopped at our rt_sigreturn: good place
                    if not forced:
                        self._resume(_PTRACE_SYSCALL)
                continue
            if (status >> 16) != 0:  # interrupt stop or group-stop
                if self.running_call and not forced and sig != signal.SIGTRAP:
                    self._resume(_PTRACE_SYSCALL)  # group-stop during our call
                continue
            if self.running_call and sig in _SYNC_FAULTS and self._siginfo_code() > 0:
                self.running_call = False  # our call faulted: restore, swallow
                continue
            if self.running_call and not forced:
                self._resume(_PTRACE_SYSCALL, sig)  # async signal: deliver now
                continue
            self.detach_sig = sig  # deliver it when we detach

    def _restore_fp(self) -> None:
        if self.saved_xstate is not None:
            buf = ctypes.create_string_buffer(self.saved_xstate, len(self.saved_xstate))
            iov = (ctypes.c_uint64 * 2)(ctypes.addressof(buf), len(self.saved_xstate))
            try:
                _ptrace(_PTRACE_SETREGSET, self.tid, _NT_X86_XSTATE, ctypes.addressof(iov))
                return
            except OSError:
                pass  # the gdb failure mode: fall back to the FXSAVE image
        if self.saved_fp is not None:
            fp = ctypes.create_string_buffer(self.saved_fp, _FPREGS_SIZE)
            _ptrace(_PTRACE_SETFPREGS, self.tid, 0, ctypes.addressof(fp))

    def _restore(self) -> None:
        """Put the original context back; the thread is stopped."""
        assert self.restore is not None
        if self.saved_errno is not None and self.errno_addr:
            with suppress(OSError):
                self.mem_write(self.errno_addr, self.saved_errno)
        if self.at_sigreturn and not self.restore.restart_block and not _setregset_works:
            # The kernel can't take the XSAVE state back via ptrace (the gdb
            # failure mode): let our rt_sigreturn run instead.  It restores all
            # GP registers (restart fixup included), the complete XSAVE state
            # by XRSTOR and the signal mask; we wait for its syscall-exit stop.
            self._resume(_PTRACE_SYSCALL)
            while True:
                status = self._wait(time.monotonic() + 5.0)
                if status is None:
                    return  # it is running the original code again: fine
                if os.WSTOPSIG(status) == _SYSCALL_STOP and not self.in_syscall:
                    break  # exit stop of the sigreturn: fully restored
                if os.WSTOPSIG(status) == _SYSCALL_STOP or (status >> 16) != 0:
                    self._resume(_PTRACE_SYSCALL)  # e.g. a group stop first
                    continue
                self.detach_sig = os.WSTOPSIG(status)  # signal delivery stop
                break
            self.modified = False
            return
        # Restore by hand (exact, and keeps a restart_syscall-type sleep
        # intact, which a sigreturn would turn into EINTR).  FP first, GP
        # last.  orig_rax = -1 in restore.regs also skips the pending
        # rt_sigreturn; if dyper dies before that, the rt_sigreturn runs
        # and restores everything anyway.
        with suppress(OSError):
            self._restore_fp()
        self.setregs(self.restore.regs)
        self.modified = False

    def close(self) -> None:
        """Restore registers, FPU state and errno, then detach; idempotent and
        safe to call in any state (also from ``finally`` after any error)."""
        try:
            if self.attached and not self.stopped:
                self._settle()
            if self.attached and self.stopped:
                if self.modified and self.restore is not None:
                    self._restore()
                if self.attached and not self.stopped:
                    # The sigreturn restore ran but its exit stop didn't show
                    # up: stop it again so that we can detach (a tracee left
                    # attached would block at its next syscall).
                    with suppress(OSError):
                        _ptrace(_PTRACE_INTERRUPT, self.tid, 0, 0)
                    self._wait(time.monotonic() + 5.0)
                if self.attached and self.stopped:
                    # Signal 0 unless a foreign signal is waiting to be delivered.
                    _ptrace(_PTRACE_DETACH, self.tid, 0, self.detach_sig)
                    self.attached = self.stopped = False
        except (_Gone, ProcessLookupError):
            self.attached = False
        finally:
            if self._memfd >= 0:
                os.close(self._memfd)
                self._memfd = -1


class _Unsafe(Exception):
    """This stop is not usable for injection (not an error: try again)."""


# ---------------------------------------------------------------------------
# Safe points
# ---------------------------------------------------------------------------


def _region(target: _Target, rip: int) -> str:
    for m in target.maps:
        if m.start <= rip < m.end:
            if m.path in target.ldso_paths:
                return "ld.so"
            if m.path in target.libc_paths:
                return "libc"
            if m.path in target.alloc_paths:
                return "allocator"
            if m.path in target.interp_paths:
                return "interpreter"
            if m.path == "[vdso]":
                return "vdso"
            return m.path or "anonymous"
    return "unknown"


def _unsafe_reason(target: _Target, regs: Sequence[int], full_vectors: bool) -> str | None:
    """None if calling mmap/pthread_create on this stopped thread is safe.

    (a) In a syscall (orig_rax >= 0): the thread is at a call boundary into
        the kernel and holds no libc lock - unless it is one of the syscalls
        libc makes *while* holding one (malloc's mmap/brk/munmap/madvise,
        fork/clone, thread exit), or the dynamic linker is working (dlopen
        holds the loader lock that pthread_create's TLS setup needs).
    (b) In user space: not inside libc, ld.so or a malloc replacement, so no
        libc-internal lock (e.g. malloc's arena lock) can be held by it.  We
        additionally need every vector register back: if the kernel gave us
        no XSAVE image, only interpreter code (compiled for baseline x86-64:
        x87/SSE only, fully covered by the FXSAVE image) and the vDSO
        qualify, not e.g. an AVX loop in numpy whose upper ymm halves our
        call would clobber.
    """
    rip = regs[_R["rip"]]
    where = _region(target, rip)
    orig_rax = regs[_R["orig_rax"]]
    if _signed(orig_rax) >= 0:  # stopped in a syscall
        if where in ("ld.so", "allocator"):
            return f"in syscall {orig_rax} inside {where}"
        if where == "libc" and orig_rax in _UNSAFE_LIBC_SYSCALLS:
            return f"in syscall {orig_rax} that libc may issue while holding a lock"
        return None
    if where in ("libc", "ld.so", "allocator", "unknown"):
        return f"running inside {where}"
    if not full_vectors and where not in ("interpreter", "vdso"):
        return f"running in {where} and the full vector state cannot be saved"
    return None


# ---------------------------------------------------------------------------
# Payload: trampoline, stub, source
# ---------------------------------------------------------------------------


def _wrap_source(source: str) -> bytes:
    """Turn ``source`` into the NUL-terminated text handed to PyRun_SimpleString.

    PyRun_SimpleString runs in ``__main__``'s namespace and calls PyErr_Print
    on failure, which *exits the process* on SystemExit.  So we run the source
    in its own namespace via exec() and print (never propagate) any exception.
    Only dunder names are used to reach builtins, so a target whose __main__
    shadows e.g. ``exec`` or ``compile`` is unaffected, and nothing is bound
    in __main__.  repr() makes any str (NULs, lone surrogates...) a valid
    literal.
    """
    text = (
        "try:\n"
        "    __import__('builtins').exec(__import__('builtins').compile("
        f"{source!r}, '<dyper-inject>', 'exec', dont_inherit=True), "
        "{'__name__': '__dyper_inject__'})\n"
        "except:\n"
        "    try:\n"
        "        __import__('traceback').print_exc()\n"
        "    except:\n"
        "        pass\n"
    )
    data = text.encode("utf-8", "backslashreplace")
    assert b"\0" not in data
    return data + b"\0"


def _build_trampoline(result_addr: int, at: int) -> bytes:
    """Call trampoline living at ``at`` in the first page (see ``_Tracee``).

    Entered with rsp = U (16-aligned), rax = function, args in registers.
    """
    code = b"\xff\xd0"  # call rax                 ; rsp%16 == 0 before call
    disp = result_addr - (at + len(code) + 7)
    code += b"\x48\x89\x05" + struct.pack("<i", disp)  # mov [rip+disp], rax
    code += b"\xb8\x0f\x00\x00\x00"  # mov eax, 15 (__NR_rt_sigreturn)
    code += b"\x0f\x05"  # syscall          ; rt_sigreturn on the frame at rsp-8
    assert len(code) == _TRAMP_SIGRETURN_END
    return code + b"\x0f\x0b"  # ud2 (unreachable: sigreturn does not return)


def _build_stub(*, page: int, size: int, syms: dict[str, int]) -> bytes:
    """Hand-assembled x86-64 thread body: ``void stub(const char *source)``.

    A pthread start routine, entered by libc's `call`, so rsp % 16 == 8 on entry; the
    alignment before every `call` is annotated below (must be 0).
    """

    def movabs_rax(value: int) -> bytes:
        return b"\x48\xb8" + struct.pack("<Q", value)  # movabs rax, imm64

    call_rax = b"\xff\xd0"  # call rax
    ensure_block = (
        movabs_rax(syms["PyGILState_Ensure"])
        + call_rax  # rsp%16 == 0; eax = PyGILState_STATE
        + b"\x50"  # push rax           ; save the state (the 16-byte pair keeps
        + b"\x50"  # push rax           ;   the alignment: rsp%16 stays 0)
        + b"\x48\x89\xdf"  # mov rdi, rbx ; arg = source
        + movabs_rax(syms["PyRun_SimpleString"])
        + call_rax  # rsp%16 == 0; runs the source with the GIL held
        + b"\x5f"  # pop rdi            ; rdi = saved PyGILState_STATE
        + b"\x5f"  # pop rdi            ;   (both copies are equal)
        + movabs_rax(syms["PyGILState_Release"])
        + call_rax  # rsp%16 == 0; drops the GIL and our thread state
    )
    assert len(ensure_block) < 128
    return (
        b"\x53"  # push rbx                 ; callee-saved; rsp%16: 8 -> 0
        + b"\x48\x89\xfb"  # mov rbx, rdi   ; rbx = source (survives calls)
        + movabs_rax(syms["Py_IsInitialized"])
        + call_rax  # rsp%16 == 0; never touch an uninitialized/finalizing runtime
        + b"\x85\xc0"  # test eax, eax
        + b"\x74"
        + bytes([len(ensure_block)])  # jz done
        + ensure_block
        # done:
        + b"\x5b"  # pop rbx                ; rsp%16 == 8 again, as at entry
        + b"\x48\xbf"
        + struct.pack("<Q", page)  # movabs rdi, PAGE
        + b"\xbe"
        + struct.pack("<I", size)  # mov esi, SIZE
        + movabs_rax(syms["munmap"])
        + b"\xff\xe0"  # jmp rax  ; tail call: munmap(PAGE, SIZE) unmaps this very
        #                code and returns straight into libc's thread start,
        #                which ends the (detached) thread.
    )


_STUB_LEN: Final = len(_build_stub(page=0, size=0, syms=dict.fromkeys(_WANTED_SYMBOLS, 0)))
_SRC_OFFSET: Final = (_STUB_LEN + 15) & ~15


# ---------------------------------------------------------------------------
# Injection
# ---------------------------------------------------------------------------


def _candidate_threads(pid: int) -> list[int]:
    """Threads worth interrupting: main thread first, then the others.

    Skipped: threads already traced, in uninterruptible sleep (they would not
    stop promptly), or stopped/dying.
    """
    out: list[int] = []
    for tid in _list_tasks(pid):
        try:
            st = _status(f"/proc/{pid}/task/{tid}/status")
        except OSError:
            continue
        if st.get("TracerPid", "0") != "0" or st.get("State", "?")[:1] in "DZXTt":
            continue
        out.append(tid)
    out.sort(key=lambda t: (t != pid, t))
    return out


def _inject_on(tr: _Tracee, target: _Target, payload: bytes, deadline: float) -> None:
    """Steps 3-5 of the design on a thread stopped at a safe point.

    Memory layout of the mapping we create::

        page 0       trampoline + result slot      (unmapped by us at the end)
        page 1...    thread stub + source text     (unmapped by the new thread)

    Two parts because the new thread may finish and unmap its part before
    pthread_create has even returned into our trampoline.
    """
    syms = target.syms

    def call_timeout() -> float:
        # mmap, the thread start and munmap take microseconds; on a machine loaded
        # ten times over its cores they were seen to take over 5 s (the attach then
        # failed). Each may take what is left of the attach's own deadline, 15 s at most.
        return max(1.0, min(15.0, deadline - time.monotonic()))

    thread_size = (_SRC_OFFSET + len(payload) + _PAGE - 1) & ~(_PAGE - 1)
    size = _PAGE + thread_size
    # mmap returns into __restore_rt, which overwrites rax: we take the result
    # from the syscall-exit stop of mmap's own mmap(2) instead.
    page = tr.call(
        syms["mmap"],
        (0, size, _PROT_RWX, _MAP_PRIVATE_ANON, _U64, 0),
        call_timeout(),
        capture_syscall=_NR_MMAP,
    )
    if page is None or _signed(page) < 0 or page & (_PAGE - 1) or page == 0:
        raise InjectError(
            f"mmap of {size} bytes failed inside process {target.info.pid} (out of memory, "
            "or W+X pages forbidden by SELinux execmem/seccomp); cannot inject"
        )
    mapped = size  # bytes from `page` on that are still ours to unmap
    try:
        result_addr = page + _RESULT_OFFSET
        tramp = _build_trampoline(result_addr, page)
        tr.mem_write(page, tramp)
        thread_page = page + _PAGE
        stub = _build_stub(page=thread_page, size=thread_size, syms=syms)
        tr.mem_write(thread_page, stub.ljust(_SRC_OFFSET, b"\xcc") + payload)

        def via_tramp(fn: int, *args: int) -> int:
            res = tr.call(fn, args, call_timeout(), trampoline=page, result_addr=result_addr)
            assert res is not None
            return res

        # errno lives in the thread's TLS; pthread_create & co. may change it,
        # and the interrupted code may be between a failing call and errno.
        tr.errno_addr = via_tramp(syms["__errno_location"])
        tr.saved_errno = tr.mem_read(tr.errno_addr, 4)
        # If this call fails half-way we can't know whether the thread runs:
        # from here on, only the trampoline page is surely ours.
        mapped = _PAGE
        # pthread_create, not PyThread_start_new_thread: the latter allocates
        # through PyMem_RawMalloc, which under tracemalloc (a memory burst)
        # takes the GIL on this thread. A thread stopped inside the
        # interpreter holding one of its locks (the pending-calls lock in
        # Py_AddPendingCall, say) then waits for the GIL while the GIL's
        # holder waits for that lock: both hung, seen on 3.12 in CI. libc's
        # own locks are safe here (_unsafe_reason), the interpreter's are not.
        thread_t = page + _THREAD_T_OFFSET
        err = via_tramp(syms["pthread_create"], thread_t, 0, thread_page, thread_page + _SRC_OFFSET) & 0xFFFFFFFF
        if err:
            mapped = size  # no thread: its pages are ours to free as well
            raise InjectError(
                f"pthread_create failed inside process {target.info.pid} ({os.strerror(err)}); "
                "check `ulimit -u` and the target's memory"
            )
        # The thread may have ended already: detaching then frees what it left.
        (handle,) = struct.unpack("<Q", tr.mem_read(thread_t, 8))
        via_tramp(syms["pthread_detach"], handle)
        # Page 1... belongs to the new thread now; page 0 is done with.
        mapped = 0
        tr.call(syms["munmap"], (page, _PAGE), call_timeout())
    finally:
        if mapped and tr.stopped and tr.attached and not tr.running_call:
            with suppress(OSError, InjectError, _Gone):  # leaking a page is the lesser evil
                tr.call(syms["munmap"], (page, mapped), call_timeout())


def _try_thread(target: _Target, tid: int, payload: bytes, deadline: float) -> str | None:
    """Try to inject via thread ``tid``; None on success, else why not."""
    pid = target.info.pid
    tr = _Tracee(target, tid)
    injecting = False
    # One window from seize to detach in which SIGCHLD (see _Tracee._wait)
    # and termination signals are deferred in this thread.
    with _deferred_signals():
        try:
            try:
                tr.seize()
            except OSError as e:
                return f"cannot seize thread {tid}: {e.strerror}"
            why = tr.interrupt_and_wait(deadline)
            if why is not None:
                return why
            tr.save_state()
            assert tr.saved_regs is not None
            why = _unsafe_reason(target, tr.saved_regs, tr.full_vectors)
            if why is not None:
                return why
            try:
                sigblk = int(_status(f"/proc/{pid}/task/{tid}/status").get("SigBlk", "0"), 16)
            except (OSError, ValueError):
                return "cannot read the thread's signal mask"
            try:
                tr.write_rescue_frame(sigblk)
            except _Unsafe as e:
                return str(e)
            injecting = True
            _inject_on(tr, target, payload, deadline)
            tr.close()
            return None
        except (_Gone, ProcessLookupError) as e:
            if not os.path.exists(f"/proc/{pid}"):
                raise InjectError(f"process {pid} exited during injection") from None
            if injecting:
                raise InjectError(f"thread {tid} of process {pid} exited during injection; retry") from None
            return f"thread went away ({e})"
        except OSError as e:
            if not os.path.exists(f"/proc/{pid}"):
                raise InjectError(f"process {pid} exited during injection") from None
            if injecting:
                raise InjectError(
                    f"injection into process {pid} failed: {e}; the thread was restored and "
                    "detached; retry, or report a dyper bug"
                ) from None
            return f"error while inspecting the thread: {e}"
        finally:
            tr.close()  # restore + detach (no-op if already done)


def _inject_native(target: _Target, source: str, timeout: float) -> None:
    payload = _wrap_source(source)
    if len(payload) > _MAX_SOURCE:
        raise InjectError(f"source is {len(payload)} bytes; the limit is {_MAX_SOURCE} bytes")
    deadline = time.monotonic() + timeout
    attempts = 0
    last = "no candidate thread"
    rounds = 0
    while True:
        if rounds:
            # Threads and libraries may have appeared since preflight.
            with suppress(OSError):
                target = dataclasses.replace(target, maps=tuple(_read_maps(target.info.pid)))
        for tid in _candidate_threads(target.info.pid):
            if time.monotonic() >= deadline:
                break
            why = _try_thread(target, tid, payload, deadline)
            if why is None:
                return
            attempts += 1
            last = f"thread {tid}: {why}"
        if not os.path.exists(f"/proc/{target.info.pid}"):
            raise InjectError(f"process {target.info.pid} exited during injection")
        if time.monotonic() >= deadline:
            raise InjectError(
                f"target {target.info.pid} never reached a safe point within {timeout:g}s "
                f"({attempts} attempts; last: {last}); retry, or pass a longer timeout"
            )
        rounds += 1
        # A few ms lets a thread leave libc (e.g. a malloc-heavy loop) before
        # we look again.
        time.sleep(min(0.001 * rounds, 0.02))


def _inject_remote_exec(target: _Target, source: str, timeout: float) -> None:
    """Python >= 3.14: sys.remote_exec (PEP 768).  Not testable here; kept small.

    The script is written into the target's own filesystem view
    (/proc/PID/root/tmp, so containers and PrivateTmp work) and deletes itself
    when it runs.  sys.remote_exec must run on the same X.Y as the target, so
    we use our own interpreter if it matches, else the target's executable.
    """
    pid = target.info.pid
    root_tmp = f"/proc/{pid}/root/tmp"
    fd, host_path = tempfile.mkstemp(prefix="dyper-inject-", suffix=".py", dir=root_tmp)
    target_path = "/tmp/" + os.path.basename(host_path)
    body = _wrap_source(source)[:-1].decode("utf-8")
    script = f"try:\n    __import__('os').unlink({target_path!r})\nexcept OSError:\n    pass\n{body}"
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(host_path, stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
        if os.geteuid() == 0 and target.info.uid >= 0:
            os.chown(host_path, target.info.uid, -1)
        if sys.version_info[:2] == target.info.version[:2] and hasattr(sys, "remote_exec"):
            sys.remote_exec(pid, target_path)
        else:
            proc = subprocess.run(
                [
                    f"/proc/{pid}/exe",
                    "-c",
                    "import sys; sys.remote_exec(int(sys.argv[1]), sys.argv[2])",
                    str(pid),
                    target_path,
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
                raise InjectError(
                    f"sys.remote_exec into process {pid} failed: {err}; check that remote "
                    "debugging is not disabled (PYTHON_DISABLE_REMOTE_DEBUG, -X "
                    "disable_remote_debugging)"
                )
    except BaseException:
        with suppress(OSError):
            os.unlink(host_path)
        raise


def run_in_target(pid: int, source: str, *, timeout: float = 10.0) -> TargetInfo:
    """Run Python ``source`` inside the running CPython process ``pid``.

    Runs ``preflight`` first.  Returns as soon as a new thread has been
    started in the target to execute ``source`` (it does not wait for the
    source to finish).  The source runs in its own globals dict (``__name__ ==
    "__dyper_inject__"``) on a fresh OS thread holding the GIL; exceptions are
    printed to the target's stderr and never propagate (SystemExit included).

    ``timeout`` bounds the search for a safe point.  Raises ``InjectError``
    with a one-line explanation on any failure; the target is always restored
    and detached.
    """
    if not isinstance(source, str):
        raise InjectError(f"source must be str, not {type(source).__name__}")
    if timeout <= 0:
        raise InjectError(f"timeout must be positive, got {timeout!r}")
    target = _preflight(pid)
    if target.info.version[:2] >= _REMOTE_EXEC_VERSION:
        _inject_remote_exec(target, source, timeout)
    else:
        _inject_native(target, source, timeout)
    return target.info
