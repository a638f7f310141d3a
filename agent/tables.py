"""Interning of code locations to small integers (the agent's string tables).

A location is one (code object, instruction offset) pair; the monitor learns
what it means (file, qualified name, first line, line) once, when the id is
first sent. Afterwards a stack is a tuple of small integers, which is cheap to
hash, count and send.
"""

from __future__ import annotations

import bisect
import dis
import os
from collections.abc import Iterable
from types import CodeType
from typing import Final

from dyper.agent.protocol import LOC_AGENT, LOC_BLOCKING, LOC_IO, LOC_LOCK, LOC_SLEEP, LOC_WAIT

#: Directories of dyper's own packages: code there is the agent, not the application.
_OWN_DIRS: Final = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), pkg) + os.sep
    for pkg in ("agent", "proflets")
)

#: Past this many locations the tables restart under a new epoch. Holding
#: code objects alive keeps ``id(code)`` unique, but a service that keeps
#: compiling new code (templates, ``exec``) must not grow the agent forever.
MAX_LOCATIONS: Final = 200_000


#: Names of C-level routines whose call means the thread is waiting, not
#: running: the bottom of time.sleep, lock and condition waits, joins, select
#: and friends, socket and pipe reads, child waits. Python-level wrappers
#: (threading, queue, selectors, socket) all end in one of these.
BLOCKING_CALLS: Final = frozenset(
    {
        "sleep", "acquire", "wait", "join", "_wait_for_tstate_lock",
        "select", "poll", "epoll", "kqueue", "control",
        "recv", "recv_into", "recvfrom", "recvfrom_into", "recvmsg", "accept", "_accept",
        "connect", "sendall", "getaddrinfo", "gethostbyname",
        "read", "readinto", "readline", "waitpid", "wait4", "pause", "sigwait", "sigtimedwait",
        "input", "communicate", "lockf", "flock", "__enter__",
    }
)  # fmt: skip

#: What each blocking call waits for (see agent.protocol). ``acquire`` is a
#: lock unless it is the waiter inside Condition.wait (conditions, events,
#: queues, semaphores and barriers all wait there) or a join's.
_KIND_OF_CALL: Final = {
    **dict.fromkeys(("sleep", "pause", "sigwait", "sigtimedwait"), LOC_SLEEP),
    **dict.fromkeys(("acquire", "lockf", "flock", "__enter__"), LOC_LOCK),
    **dict.fromkeys(("wait", "join", "_wait_for_tstate_lock", "waitpid", "wait4", "communicate"), LOC_WAIT),
}
_WAITING_IN: Final = frozenset({"Condition.wait", "Thread._wait_for_tstate_lock", "Thread.join"})
#: Functions whose blocking calls wait for a child process: Popen's start
#: reads the pipe its child closes at exec (or writes an exec error into),
#: a wait for the child like Popen.wait, not I/O.
_CHILD_WAIT_IN: Final = frozenset({"Popen._execute_child"})
#: ``with lock:``: a leaf at the with-statement's entry is inside a C
#: ``__enter__``, which in practice is a lock's acquire (a Python __enter__
#: would be a frame of its own).
_WITH_ENTRY: Final = frozenset({"BEFORE_WITH"})

_CALLS = frozenset({"CALL", "CALL_FUNCTION_EX", "CALL_KW"})
#: What sits between a call's operands and the call itself: 3.11's PRECALL
#: (its stack effect is part of the call's), the keyword names, prefixes.
_CALL_PREFIX = frozenset({"PRECALL", "KW_NAMES", "EXTENDED_ARG", "NOP", "CACHE"})


#: One decoded instruction: (opname, arg, argval when it is a name (else None),
#: opcode). A plain tuple of strings and ints, not the dis.Instruction (and its
#: dis.Positions) it is read from: kept in the cache below, those showed in the
#: heap census as the application's growing types. The garbage collector stops
#: tracking an exact tuple of untracked values at its next pass, so a census
#: (gc.get_objects) does not see these at all: dyper stays out of what it measures.
Step = tuple[str, "int | None", "str | None", int]
OPNAME: Final = 0
ARG: Final = 1
ARGVAL: Final = 2


def _step(ins: dis.Instruction) -> Step:
    return (ins.opname, ins.arg, ins.argval if isinstance(ins.argval, str) else None, ins.opcode)


def _effect(ins: Step) -> int:
    opcode, arg = ins[3], ins[ARG]
    if opcode >= dis.HAVE_ARGUMENT:
        return dis.stack_effect(opcode, arg)
    return dis.stack_effect(opcode)


_LOADS = frozenset(
    {"LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_FAST", "LOAD_SUPER_ATTR"}
)


#: Decoded instructions of the code objects seen most recently: a function's
#: call sites are usually interned close together, and decoding is the cost.
_DECODED_CACHE_SIZE: Final = 256
_decoded: dict[int, tuple[CodeType, tuple[int, ...], tuple[Step, ...]]] = {}


def _instructions(code: CodeType) -> tuple[tuple[int, ...], tuple[Step, ...]]:
    entry = _decoded.get(id(code))
    if entry is None or entry[0] is not code:
        # Every instruction stays, with its real stack effect: an argument's own
        # calls (PUSH_NULL, PRECALL, CALL) must add up to the one value they leave.
        instructions = list(dis.get_instructions(code))
        entry = (code, tuple(ins.offset for ins in instructions), tuple(_step(ins) for ins in instructions))
        if len(_decoded) >= _DECODED_CACHE_SIZE:
            # pop, not del: a stopping agent may clear the cache meanwhile (forget_decoded)
            _decoded.pop(next(iter(_decoded), 0), None)
        _decoded[id(code)] = entry
    return entry[1], entry[2]


def forget_decoded() -> None:
    """Drop the decoded instructions: the agent has stopped and leaves nothing behind.

    Kept, they would hold up to _DECODED_CACHE_SIZE code objects alive (each
    attach's bootstrap among them) and several MB of instructions.
    """
    _decoded.clear()


def callee_name(code: CodeType, lasti: int) -> str | None:
    """Best guess at the name of what the call instruction at ``lasti`` calls.

    Walks back from the call, adding up stack effects, to the instruction
    that pushed the callable (past the arguments): for ``time.sleep(1)`` or
    ``self._selector.poll(t, n)`` that is the load of ``sleep`` or ``poll``.
    Runs once per location, never on the sampler's fast path.
    """
    try:
        offsets, steps = _instructions(code)
        at = bisect.bisect_left(offsets, lasti)
        if at >= len(offsets) or offsets[at] != lasti:
            return None
        # 3.11's specialised PRECALL makes the C call itself, so a thread
        # blocked in C can sit there rather than at the CALL that follows.
        if steps[at][OPNAME] == "PRECALL" and at + 1 < len(steps):
            at += 1
        call = steps[at]
        if call[OPNAME] not in _CALLS:
            return None
        # The call pops its operands and pushes one result; on 3.11 the
        # PRECALL before it pops its share. Two operands are the callable and
        # the NULL or ``self`` beside it, whatever the order (3.13 swapped it);
        # the rest are arguments (with 3.13's keyword-names tuple, or
        # CALL_FUNCTION_EX's tuple and dict).
        effect = _effect(call)
        i = at - 1
        while i >= 0 and steps[i][OPNAME] in _CALL_PREFIX:
            effect += _effect(steps[i])
            i -= 1
        args = -effect - 1
        # Backwards, adding up each instruction's stack effect (a nested call
        # in an argument, ``sleep(float(x))``, adds up to its one result): the
        # first instruction that takes the depth past the arguments pushed the
        # callable, or the NULL after it on 3.13 ...
        end = i + 1
        depth = 0
        while i >= 0:
            depth += _effect(steps[i])
            if depth > args:
                break
            i -= 1
        else:
            return None
        if steps[i][OPNAME] == "PUSH_NULL" and i > 0:
            i -= 1
        name = steps[i][ARGVAL] if steps[i][OPNAME] in _LOADS else None
        # ... forwards: attribute loads applied to it at the same depth
        # (``(a.b)(x)`` without a method load) refine it into the callable.
        depth = 0
        for ins in steps[i + 1 : end]:
            if depth == 0 and ins[OPNAME] in ("LOAD_ATTR", "LOAD_METHOD"):
                name = ins[ARGVAL]
            depth += _effect(ins)
        return name if isinstance(name, str) else None
    except Exception:  # odd code objects must never break sampling
        return None


def wait_kind(code: CodeType, lasti: int) -> int:
    """What a thread whose leaf is at ``lasti`` in ``code`` waits for: one of
    the LOC_LOCK, LOC_WAIT, LOC_IO, LOC_SLEEP flags, or 0 (it is running or
    ready to run)."""
    name = callee_name(code, lasti)
    if name is None:
        return LOC_LOCK if _opname_at(code, lasti) in _WITH_ENTRY else 0
    if name not in BLOCKING_CALLS:
        return 0
    if code.co_qualname in _CHILD_WAIT_IN:
        return LOC_WAIT
    kind = _KIND_OF_CALL.get(name, LOC_IO)
    if kind == LOC_LOCK and name == "acquire" and code.co_qualname in _WAITING_IN:
        return LOC_WAIT
    return kind


def _opname_at(code: CodeType, lasti: int) -> str | None:
    try:
        offsets, steps = _instructions(code)
        at = bisect.bisect_left(offsets, lasti)
        return steps[at][OPNAME] if at < len(offsets) and offsets[at] == lasti else None
    except Exception:  # as in callee_name: never break the agent on odd code
        return None


#: bytes of Tables.waiting (the C walker reads them too)
UNDECIDED: Final = 0
RUNS: Final = 1
WAITS: Final = 2


class Tables:
    """String and location tables with a record of what the monitor already has."""

    def __init__(self) -> None:
        self.epoch = 0
        self._reset()

    def _reset(self) -> None:
        self.strings: dict[str, int] = {}
        self.string_rows: list[list[int | str]] = []
        #: (f_lasti << 48) | id(code) -> location id; the sampler's hot lookup
        self.locs: dict[int, int] = {}
        self.loc_rows: list[list[int]] = []
        # Strong references so that id(code) is never reused by a new object
        # while it is a key above.
        self._codes: list[CodeType] = []
        #: each location's instruction offset, to decide its flag when it is first a leaf
        self._lasti: list[int] = []
        #: one byte per location id: UNDECIDED until the location is first
        #: seen as a leaf, then RUNS or WAITS. The C walker's activity count
        #: reads it (see agent._fastsample.sample).
        self.waiting = bytearray()
        #: rows already sent whose flags changed since (sent again)
        self._reflagged: list[list[int]] = []
        self._upto = (0, 0, 0)
        self.sent_strings = 0
        self.sent_locs = 0

    def string(self, text: str) -> int:
        sid = self.strings.get(text)
        if sid is None:
            sid = len(self.string_rows)
            self.strings[text] = sid
            self.string_rows.append([sid, text])
        return sid

    def new_loc(self, key: int, code: CodeType, lasti: int, lineno: int | None) -> int:
        """Intern a location seen for the first time (the sampler's slow path).

        ``key`` is ``(lasti << 48) | id(code)``, built the same way by the
        Python and the C walker. The blocking flag is left for
        :meth:`flag_leaves`, off the sampling path.
        """
        loc = len(self.loc_rows)
        self.locs[key] = loc
        self._codes.append(code)
        self.loc_rows.append(
            [
                loc,
                self.string(code.co_filename),
                self.string(code.co_qualname),
                code.co_firstlineno,
                lineno if lineno is not None else code.co_firstlineno,
                LOC_AGENT if code.co_filename.startswith(_OWN_DIRS) else 0,
            ]
        )
        self._lasti.append(lasti)
        return loc

    def code_of(self, loc: int) -> CodeType:
        """The code object of a location (locations are numbered in the order they were interned)."""
        return self._codes[loc]

    def location(self, loc: int) -> tuple[CodeType, int] | None:
        """A location's code object and instruction offset (None for an id never given out)."""
        if 0 <= loc < len(self._lasti):
            return self._codes[loc], self._lasti[loc]
        return None

    def flag_leaves(self, leaves: Iterable[int]) -> None:
        """Decide the blocking flag of locations seen as a stack's leaf, once each.

        Only a leaf's instruction tells what the thread is doing; an inner
        frame is by definition calling Python. Decoding bytecode is the
        costly part of interning, so it is done here, off the sampling path,
        for the few leaves rather than for every new frame. A location first
        seen inside a stack and later as a leaf is decided then; if the
        monitor already has its row, the row is sent again with its flags.
        """
        rows = self.loc_rows
        waiting = self.waiting
        if len(waiting) < len(rows):
            waiting.extend(bytes(len(rows) - len(waiting)))
        for loc in leaves:
            if waiting[loc] != UNDECIDED:
                continue
            kind = wait_kind(self._codes[loc], self._lasti[loc])
            if kind:
                rows[loc][5] |= LOC_BLOCKING | kind
                waiting[loc] = WAITS
                if loc < self.sent_locs:
                    self._reflagged.append(rows[loc])
            else:
                waiting[loc] = RUNS

    def undecided(self, leaves: Iterable[int]) -> bool:
        """Some of ``leaves`` still wait for :meth:`flag_leaves`."""
        waiting = self.waiting
        n = len(waiting)
        return any(loc >= n or waiting[loc] == UNDECIDED for loc in leaves)

    def waits(self, loc: int) -> bool:
        """A decided leaf location that waits (see :meth:`flag_leaves`)."""
        return loc < len(self.waiting) and self.waiting[loc] == WAITS

    def full(self) -> bool:
        return len(self.loc_rows) >= MAX_LOCATIONS

    def restart(self) -> None:
        """Forget everything and start a new epoch (the monitor is told by the epoch)."""
        self.epoch += 1
        self._reset()

    def unsent(self) -> tuple[list[list[int | str]], list[list[int]]]:
        """Rows the monitor does not have yet: new ones, and sent ones whose flags changed.

        :meth:`mark_sent` then records exactly these as delivered.
        """
        self._upto = (len(self.string_rows), len(self.loc_rows), len(self._reflagged))
        return self.string_rows[self.sent_strings :], self._reflagged + self.loc_rows[self.sent_locs :]

    def mark_sent(self) -> None:
        """The rows the last :meth:`unsent` returned reached the monitor."""
        self.sent_strings, self.sent_locs, n_reflagged = self._upto
        del self._reflagged[:n_reflagged]

    def resend_all(self) -> None:
        """The monitor lost our tables (it restarted): send them again in full."""
        self.sent_strings = 0
        self.sent_locs = 0
        self._reflagged = []
