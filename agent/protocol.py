"""The wire protocol between agents, the monitor and its clients.

This module is the only place that knows how messages look on the wire. Every
message is one ZeroMQ frame holding a msgpack array::

    ["dyper", PROTOCOL_VERSION, type, body]

``type`` is one of the constants below and ``body`` is a map with string keys.
Nothing received is ever unpickled or evaluated: msgpack decodes to plain
lists, maps, strings and numbers, and :func:`decode` then checks the envelope,
the size and the shape of the body. Anything wrong raises :class:`DecodeError`,
the single error type callers catch, count and drop.

The protocol version is separate from the package version: it changes only
when an old peer could misread a new message.

Message types
-------------
agent -> monitor
    ``hello``   identity of the process and the agent (first message, and again
                whenever the monitor asks for ``resync``)
    ``report``  deltas since the last report: new string-table and location
                entries, flat stack counts, costs spent
    ``bye``     the agent is stopping (detach, stop or exit)
    ``error``   something inside the target the user should hear about
monitor -> agent
    ``configure``  budget and other settings; pause, resume and reset
    ``detach``     stop the agent and remove every hook
    ``resync``     the monitor does not know this agent (it restarted): send
                   ``hello`` and the full string tables again
    ``detail``     run one detailing burst of a proflet (the monitor's queue
                   decides when; the agent still starts it only when its own
                   guard can pay for it)
client <-> monitor (the CLI talking to a standing monitor)
    ``ctl``        a request: ``{"id": int, "op": str, "args": map}``
    ``ctl_reply``  ``{"id": int, "ok": bool, "result": any, "error": str}``

Each type's body is the ``TypedDict`` named after it (:class:`Hello`,
:class:`Report`, ... :class:`CtlReply`); :func:`decode` checks a received one
against its type's schema.
"""

# No "from __future__ import annotations": with string annotations the TypedDicts
# below would see no NotRequired at run time (__required_keys__, which the test
# of their agreement with the schemas reads, would name every field).
import math
from collections.abc import Callable, Collection, Mapping
from itertools import chain
from typing import Any, Final, NotRequired, TypedDict, cast

import msgpack

MAGIC: Final = "dyper"
PROTOCOL_VERSION: Final = 1

HELLO: Final = "hello"
REPORT: Final = "report"
BYE: Final = "bye"
ERROR: Final = "error"
CONFIGURE: Final = "configure"
DETACH: Final = "detach"
RESYNC: Final = "resync"
DETAIL: Final = "detail"
CTL: Final = "ctl"
CTL_REPLY: Final = "ctl_reply"

#: Largest frame either side accepts. A report of a big service with a fresh
#: string table is a few MiB; anything far above that is an attack or a bug.
MAX_FRAME_BYTES: Final = 32 * 1024 * 1024
#: Largest frame the agent takes from the monitor. Its messages are a few
#: hundred bytes, and the agent decodes them inside someone's production process.
MAX_CONTROL_BYTES: Final = 64 * 1024
#: Arrays and maps one frame may decode to: at most one per two bytes of the
#: frame, and at most this many. An empty array is one byte on the wire and
#: some 70 bytes decoded, so this is what bounds the memory a frame can cost
#: (see :data:`MAX_EXPANSION`). The largest report an agent sends has some
#: 900,000: 200,000 locations (agent.tables.MAX_LOCATIONS), their strings,
#: 50,000 stacks (agent.core.MAX_PENDING_STACKS) of two each.
MAX_CONTAINERS: Final = 2_000_000
#: Bytes of decoded objects per byte of frame, at most: 41 measured for a report of empty
#: stacks, two arrays per four bytes (tests/unit/test_fuzz_intake.py); at most some 400 MB for
#: the largest frame, where MAX_CONTAINERS binds.
MAX_EXPANSION: Final = 48
#: Nesting inside the free-form parts of a message (a proflet's data, a
#: request's args, fields this version does not know): deeper would break the
#: msgpack (512) and JSON (~1000) encoders the monitor stores and serves it with.
MAX_NESTING: Final = 32
#: A budget (fraction of wall-clock time) the user or the monitor may set.
MIN_BUDGET: Final = 0.0001
MAX_BUDGET: Final = 0.5
#: Error texts are one line; a longer one is cut to this many characters.
MAX_ERROR_CHARS: Final = 2000

#: A body as :func:`decode` gives it, before the caller knows its type (then: the TypedDict below named after it).
Body = dict[str, Any]

#: Location flag: the instruction calls a routine that blocks (sleep, lock
#: acquire, select, socket receive...). A stack whose leaf has it is waiting,
#: not running, so the CPU view leaves it out and the wall view keeps it.
LOC_BLOCKING: Final = 1
#: The location is in dyper's own code (a detailing hook the sampler caught
#: running in an application thread): the monitor leaves such frames out of
#: the application's profile, their cost is in the agent's ledger.
LOC_AGENT: Final = 2
#: What a blocking leaf waits for (set with LOC_BLOCKING; the threads proflet
#: splits waiting time by them, as DYPER's thread table does): a lock held by
#: another thread ("block"), a condition, event, queue or join ("wait"),
#: I/O (sockets, files, select), or sleep.
LOC_LOCK: Final = 4
LOC_WAIT: Final = 8
LOC_IO: Final = 16
LOC_SLEEP: Final = 32
#: The thread was ready to run but did not (set with LOC_BLOCKING, on the
#: native sampler's state frames below, whose samples are wall time only):
#: waiting for the GIL, or runnable in the kernel's run queue.
LOC_GIL: Final = 64
LOC_RUNQ: Final = 128

#: The native sampler's leaf frames that say what a thread was doing when
#: its Python leaf does not (agent/native.py): file and names.
STATE_FILE: Final = "<dyper state>"
GIL_WAIT: Final = "<waiting for the GIL>"
RUN_QUEUE: Final = "<run queue>"

#: The file of the frame ``agent.tag`` puts under a tagged function: its name is TAG_PREFIX + the tag,
#: so every sample taken inside carries the tag as a frame, whichever sampler took it.
TAG_FILE: Final = "<dyper tag>"
#: Characters of a mark's name (agent.mark) and kind that either side keeps.
MAX_MARK_CHARS: Final = 200
TAG_PREFIX: Final = "tag:"


# --- message bodies ----------------------------------------------------------
# Each message type's body is the TypedDict named after it: code that builds or
# reads one uses it. The schemas further down are the check at run time, and
# tests/unit/test_protocol.py keeps both naming the same fields. A NotRequired
# field may come as null from a peer (the schemas let it), so it is typed
# "| None" and read with .get(). Fields a newer version adds pass as plain data.
# msgpack has no tuples: a row (a string-table entry, a stack) is a list.

#: [id, text]: a string-table entry
StringRow = list[Any]
#: [id, file string id, qualname string id, first line, line, flags]: a location-table entry;
#: a line may be -1 (none known). Flags: LOC_BLOCKING when the instruction calls a blocking routine
#: (with one of LOC_LOCK, LOC_WAIT, LOC_IO, LOC_SLEEP saying what it waits for), LOC_AGENT for dyper's own code.
LocRow = list[int]
#: [thread ident, count, location ids leaf first]; decoded with ``raw_stacks``, the ids are
#: their msgpack bytes (see :func:`decode`)
StackRow = list[Any]
#: [thread ident, name]
ThreadRow = list[Any]
#: [wall time, name, kind]: agent.mark, and pause, resume and reset (which starts the statistics afresh)
MarkRow = list[Any]
#: A detailing burst finished in the window: ``{proflet, t, length_s, fixed_s, slowdown_s, ...}``
#: and what the proflet found; only ``proflet`` (a string) is checked, the rest is plain data.
Burst = dict[str, Any]


class ProfletState(TypedDict, total=False):
    """A proflet's calibrated costs as the planner takes them, or ``{"off": reason}`` alone."""

    ovhd_ms: float
    slow: float
    itvl_ms: float
    prty: float
    allows: list[str]  # proflets whose bursts may run beside its own
    detailing: bool  # a burst of it is running
    off: str  # why it is off (unavailable here, or its collector raised)


class TriggerEvent(TypedDict):
    """A trigger event fired in the window (agent.triggers)."""

    t: float
    name: str
    kind: str
    why: str
    before_s: float
    after_s: float
    budget: float  # the raised budget of its "after"


class Plan(TypedDict, total=False):
    """The monitor's timings for an agent (the agent still clamps them to its own plan)."""

    sample_delay_s: float
    report_delay_s: float
    detail_delay_s: dict[str, float]  # per proflet
    fract: float
    budget: float  # the budget it was made for: the agent takes it only at that budget


class Hello(TypedDict):
    """``hello``: who the process and the agent are."""

    agent: str  # agent incarnation id, also the ZeroMQ routing id
    host: str
    pid: int
    start_time: float  # process creation time, seconds since the epoch
    argv: list[str]
    python: str
    budget: float
    executable: NotRequired[str | None]
    paths: NotRequired[dict[str, str] | None]  # sysconfig's install paths
    cpus: NotRequired[int | None]
    attach_token: NotRequired[str | None]
    agent_version: NotRequired[str | None]
    capabilities: NotRequired[list[str] | None]
    ceiling: NotRequired[float | None]
    ppid: NotRequired[int | None]  # the parent process: a master and its forked workers make one service
    service: NotRequired[str | None]  # $DYPER_SERVICE: processes giving the same name make one service
    sampler: NotRequired[dict[str, str] | None]  # which stack sampler runs ({name, why}), as in a report


class Report(TypedDict):
    """``report``: what an agent counted and spent in a window, and the table entries it needs."""

    agent: str
    seq: int
    epoch: int  # string tables restart when the epoch changes
    t: float  # wall clock (seconds since the epoch) at the end of the window
    window_s: float  # length of the window this report covers
    strings: list[StringRow]  # string-table additions
    locs: list[LocRow]  # location-table additions
    stacks: list[StackRow]
    samples: int  # sampling passes in the window
    threads: NotRequired[list[ThreadRow] | None]
    costs: NotRequired[dict[str, float] | None]  # seconds spent in the window: sample, report, detail...
    unit_costs: NotRequired[dict[str, float] | None]  # the agent's estimates of one sample and one report, seconds
    spent_s: NotRequired[float | None]  # total seconds spent since start
    allowed_s: NotRequired[float | None]  # what the budgets in force allowed since start (boosts and events raise it)
    startup_s: NotRequired[float | None]  # one-time start-up work (loading proflets), not in spent_s
    elapsed_s: NotRequired[float | None]  # wall seconds since start
    budget: NotRequired[float | None]
    delays: NotRequired[dict[str, float] | None]  # current mean delays, seconds
    dropped: NotRequired[dict[str, int] | None]  # what was dropped and how often
    errors: NotRequired[list[str] | None]
    mode: NotRequired[str | None]  # "monitor": following the monitor's timings; "local": its own
    proflets: NotRequired[dict[str, ProfletState] | None]
    details: NotRequired[list[Burst] | None]
    data: NotRequired[dict[str, dict[str, Any]] | None]  # per proflet: what its collector's report hook returned
    paused: NotRequired[bool | None]  # sampling and detailing are paused (dyper pause, agent.pause)
    marks: NotRequired[list[MarkRow] | None]
    triggers: NotRequired[list[TriggerEvent] | None]
    # which sampler took the stacks and why: {name: "native" (no GIL, agent/_native.c) or "gil", why}
    sampler: NotRequired[dict[str, str] | None]


class Bye(TypedDict):
    """``bye``: the agent is stopping."""

    agent: str
    reason: NotRequired[str | None]  # "stop", "detach", ...


class Error(TypedDict):
    """``error``: something inside the target the user should hear about."""

    agent: str
    message: str


class Configure(TypedDict, total=False):
    """``configure``: settings from the monitor, each optional."""

    budget: float | None
    monitor: str | None
    ceiling: float | None  # not taken from the monitor: only whoever started the agent sets it
    plan: Plan | None
    paused: bool | None  # pause (true) or resume (false)
    reset: bool | None  # start the statistics afresh


class Detail(TypedDict):
    """``detail``: run one detailing burst of a proflet."""

    proflet: str
    #: an analysis asked for it ahead of the plan (Analyzer.wants_detail, the search): it goes to the queue's head
    first: NotRequired[bool | None]


class Detach(TypedDict):
    """``detach``: stop the agent and remove every hook."""


class Resync(TypedDict):
    """``resync``: send ``hello`` and the full string tables again."""


class Ctl(TypedDict):
    """``ctl``: a client's request to the monitor."""

    id: int
    op: str
    args: NotRequired[dict[str, Any] | None]


class CtlReply(TypedDict):
    """``ctl_reply``: the monitor's answer to the request of the same ``id``."""

    id: int
    ok: bool
    result: NotRequired[Any]
    error: NotRequired[str | None]


#: Every byte but those a msgpack array or map header starts with (fixmap, fixarray, array 16/32, map 16/32).
_NOT_HEADERS: Final = bytes(b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF))
#: The bytes a msgpack array header starts with (fixarray, array 16, array 32).
_ARRAY_HEADERS: Final = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])


class DecodeError(ValueError):
    """A frame that is not a valid dyper message. Count it and drop it."""


def encode(msg_type: str, body: Mapping[str, Any]) -> bytes:
    """Encode one message (``body``: the TypedDict named after ``msg_type``).

    Raises :class:`ValueError` if it would exceed the size limit.
    """
    data: bytes = msgpack.packb([MAGIC, PROTOCOL_VERSION, msg_type, body], use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise ValueError(f"{msg_type} message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


def decode(
    data: bytes,
    accept: frozenset[str] | None = None,
    max_bytes: int = MAX_FRAME_BYTES,
    max_containers: int = MAX_CONTAINERS,
    *,
    raw_stacks: bool = False,
) -> tuple[str, Body]:
    """Decode and validate one frame; return ``(type, body)``.

    ``accept`` restricts the message types this receiver takes, ``max_bytes``
    the frame's size, ``max_containers`` its arrays and maps (a client reading
    a whole profile from its own monitor may take more). The body's fields
    are checked against the schema of its type (types, ranges, finite
    numbers, nesting), so callers can index and use the required fields
    without further checks.

    With ``raw_stacks`` a report's stacks come as ``[thread, count, ids]``
    where ``ids`` is the location-id array as it was on the wire (msgpack
    bytes), checked to be an array but not what it holds: the caller passes
    each through :func:`stack_ids` before using it, or knows it from an earlier
    call (the same bytes are the same ids). This is for the monitor, where
    most stacks of a report came before: a few hundred thousand integers a
    second need not be decoded and checked again, and their bytes are a
    cheap key.
    """
    if len(data) > max_bytes:
        raise DecodeError(f"frame of {len(data)} bytes exceeds {max_bytes}")
    try:
        if raw_stacks:
            obj = _unpack_raw(data, min(max_containers, len(data) // 2 + 16))
        else:
            obj = _unpack(data, min(max_containers, len(data) // 2 + 16))
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not msgpack: {type(exc).__name__}") from None
    if type(obj) is not list or len(obj) != 4 or obj[0] != MAGIC:
        raise DecodeError("not a dyper envelope")
    version, msg_type, body = obj[1], obj[2], obj[3]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise DecodeError(f"protocol version {_brief(version)}, expected {PROTOCOL_VERSION}")
    if type(msg_type) is not str or msg_type not in _SCHEMAS:
        raise DecodeError(f"unknown message type {_brief(msg_type)}")
    if accept is not None and msg_type not in accept:
        raise DecodeError(f"unexpected message type {_brief(msg_type)}")
    if type(body) is not dict:
        raise DecodeError(f"{msg_type}: body is not a map")
    if raw_stacks and msg_type == REPORT:
        _RAW_REPORT(body)
    else:
        _SCHEMAS[msg_type](body)
    return msg_type, body


def stack_ids(ids: bytes) -> list[int]:
    """One stack's location ids from the bytes :func:`decode` gave with ``raw_stacks``, checked."""
    return stacks_ids([ids])[0]


def stacks_ids(many: list[bytes]) -> list[list[int]]:
    """:func:`stack_ids` of each of ``many``, in one go (one msgpack call, the checks in C)."""
    if not many:
        return []
    if not all(many):
        raise DecodeError("bad field 'stacks'")
    # Each is one whole msgpack object (decode cut them so): together, an array of them.
    data = b"\xdd" + len(many).to_bytes(4, "big") + b"".join(many)
    try:
        got = _unpack(data, len(data) // 2 + 16)
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"bad field 'stacks': not msgpack: {type(exc).__name__}") from None
    if len(got) != len(many) or not _id_lists(got):
        raise DecodeError("bad field 'stacks'")
    return cast("list[list[int]]", got)


def _counter(limit: int, size: int) -> Callable[[Any], Any]:
    """A msgpack hook that fails past ``limit`` arrays and maps (in a frame of ``size`` bytes)."""
    containers = 0

    def count(obj: Any) -> Any:
        nonlocal containers
        containers += 1
        if containers > limit:
            raise DecodeError(f"more than {limit} arrays and maps in a frame of {size} bytes")
        return obj

    return count


def _hooks(data: bytes, limit: int) -> dict[str, Callable[[Any], Any]]:
    # Every array or map starts with one of the header bytes, so a frame with no
    # more of them than the limit cannot exceed it: it is decoded without counting
    # (a Python call per container). Most frames are far below; one made of empty
    # arrays is not.
    if len(data.translate(None, _NOT_HEADERS)) <= limit:
        return {}
    count = _counter(limit, len(data))
    return {"list_hook": count, "object_hook": count}


def _unpack(data: bytes, limit: int) -> Any:
    # Lengths are limited by msgpack to the frame's size, so a short frame
    # cannot claim a huge array; the hooks stop a frame of empty arrays from
    # decoding to 70 times its size. Extension types are not plain data;
    # timestamps (which bypass ext_hook) come out as floats.
    return msgpack.unpackb(
        data, raw=False, strict_map_key=True, use_list=True, ext_hook=_no_ext, timestamp=1, **_hooks(data, limit)
    )


def _unpack_raw(data: bytes, limit: int) -> Any:
    """What :func:`_unpack` gives, but a report's stacks' ids left as bytes (see :func:`decode`)."""
    hooks = _hooks(data, limit)
    count = hooks.get("list_hook")
    # max_buffer_size: the same bounds on lengths as unpackb gives a frame of this size
    u = msgpack.Unpacker(
        None,
        max_buffer_size=max(len(data), 1),
        raw=False,
        strict_map_key=True,
        use_list=True,
        ext_hook=_no_ext,
        timestamp=1,
        **hooks,
    )
    u.feed(data)
    if u.read_array_header() != 4:
        raise DecodeError("not a dyper envelope")
    head = [u.unpack() for _ in range(3)]
    body: Any
    if type(head[2]) is str and head[2] == REPORT:
        body = {}
        for _ in range(u.read_map_header()):
            key = u.unpack()
            if type(key) is str and key == "stacks":
                body[key] = _raw_stacks(u, data, count)
            else:
                body[key] = u.unpack()
        if count is not None:
            count(body)
    else:
        body = u.unpack()
    if u.tell() != len(data):
        raise DecodeError("not msgpack: extra data after the message")
    if count is not None:
        count(head)  # the envelope, as unpackb's hook would
    return [*head, body]


def _raw_stacks(u: msgpack.Unpacker, data: bytes, count: Callable[[Any], Any] | None) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for _ in range(u.read_array_header()):
        if u.read_array_header() != 3:
            raise DecodeError("bad field 'stacks'")
        tid = u.unpack()
        n = u.unpack()
        start = u.tell()
        if data[start] not in _ARRAY_HEADERS:
            raise DecodeError("bad field 'stacks'")
        u.skip()
        row = [tid, n, data[start : u.tell()]]
        if count is not None:
            count(row)
            count(row)  # and its ids
        rows.append(row)
    if count is not None:
        count(rows)
    return rows


def _brief(v: Any) -> str:
    """What was sent, for an error message: short, however large it was."""
    if type(v) in (str, bytes):
        return repr(v[:40]) + ("..." if len(v) > 40 else "")
    if type(v) in (int, float, bool) or v is None:
        return repr(v)
    return type(v).__name__


def _no_ext(code: int, data: bytes) -> Any:
    raise DecodeError(f"msgpack extension type {code} is not part of the protocol")


# --- validation --------------------------------------------------------------

_Check = Callable[[Any], bool]

#: Integers travel as int64 at most: SQLite (history) and C (the ticker) take no more.
_INT64 = 2**63
#: Ids (strings, locations), line numbers, flags: what the agent's tables can hold.
_INT32 = 2**31
#: Samples of one stack in one report: at 2,000 samples a second, weeks without a monitor.
#: Summed over reports, history's int64 totals would need two billion such reports to overflow.
MAX_COUNT: Final = 2**32 - 1
#: Times are seconds since the epoch that datetime can show (up to the year 9999).
_MAX_TIME = 253402300800.0
#: Costs (ms, factors) a proflet may declare: finite, and small enough that the planner's sums stay finite.
_MAX_COST = 1e12


def _is_int(v: Any) -> bool:
    return type(v) is int and -_INT64 <= v < _INT64


def _is_num(v: Any) -> bool:
    """A finite number: NaN and infinities break every comparison the planner and the views make."""
    t = type(v)
    if t is float:
        return math.isfinite(v)
    return t is int and -_INT64 <= v < _INT64


def _is_str(v: Any) -> bool:
    return type(v) is str


def _is_bool(v: Any) -> bool:
    return type(v) is bool


def _int_in(low: int, high: int) -> _Check:
    """An integer in [low, high)."""
    return lambda v: type(v) is int and low <= v < high


def _num_in(low: float, high: float, *, open_low: bool = False) -> _Check:
    """A finite number in [low, high] (or (low, high])."""
    if open_low:
        return lambda v: _is_num(v) and low < v <= high
    return lambda v: _is_num(v) and low <= v <= high


_is_id = _int_in(0, _INT32)
_is_count = _int_in(0, MAX_COUNT + 1)
_is_nat = _int_in(0, _INT64)
_is_time = _num_in(0.0, _MAX_TIME)
_is_fraction = _num_in(0.0, 1.0, open_low=True)  # a budget as agents report it
_is_budget = _num_in(MIN_BUDGET, MAX_BUDGET)  # a budget someone asks for
_is_nonneg = _num_in(0.0, float("inf"))


def _list_of(check: _Check) -> _Check:
    return lambda v: type(v) is list and all(check(x) for x in v)


def _tuple_of(*checks: _Check) -> _Check:
    n = len(checks)
    return lambda v: type(v) is list and len(v) == n and all(c(x) for c, x in zip(checks, v, strict=True))


def _map_of(check: _Check) -> _Check:
    return lambda v: type(v) is dict and all(type(k) is str and check(x) for k, x in v.items())


# The hot parts of a report (every stack's location ids, the tables' rows) are
# checked with type sets and min/max, which run in C: a report of a big service
# holds a few hundred thousand integers.


def _ints(v: Collection[Any], low: int, high: int) -> bool:
    return not v or (set(map(type, v)) == {int} and min(v) >= low and max(v) < high)


def _stacks(v: Any) -> bool:
    """[[thread ident, count, [location ids]], ...]"""
    if type(v) is not list:
        return False
    if not v:
        return True
    # Column by column, so that the loops run in C.
    if set(map(type, v)) != {list} or set(map(len, v)) != {3}:
        return False
    tids, counts, stacks = zip(*v, strict=True)
    if not _ints(tids, -_INT64, _INT64) or not _ints(counts, 0, MAX_COUNT + 1):
        return False
    return _id_lists(stacks)


def _id_lists(stacks: Collection[Any]) -> bool:
    """Lists of location ids."""
    if not stacks:
        return True
    if set(map(type, stacks)) != {list} or not set(map(type, chain.from_iterable(stacks))) <= {int}:
        return False
    # Only ints now, so a set of them holds each value once (no True or 1.0 passing as 1).
    ids = set().union(*stacks)
    return not ids or (min(ids) >= 0 and max(ids) < _INT32)


def _stack_rows(v: list[list[Any]]) -> bool:
    """The stacks of a report decoded with raw_stacks: [[thread ident, count, ids as bytes], ...]"""
    if not v:
        return True
    tids, counts, _ = zip(*v, strict=True)
    return _ints(tids, -_INT64, _INT64) and _ints(counts, 0, MAX_COUNT + 1)


def _locs(v: Any) -> bool:
    """[[id, file string id, qualname string id, first line, line, flags], ...]; a line may be -1 (none known)"""
    if type(v) is not list:
        return False
    if not v:
        return True
    # Column by column, as the stacks (a new agent sends a few thousand rows).
    if set(map(type, v)) != {list} or set(map(len, v)) != {6}:
        return False
    ids, files, names, firsts, lines, flags = zip(*v, strict=True)
    return all(_ints(c, 0, _INT32) for c in (ids, files, names, flags)) and all(
        _ints(c, -_INT32, _INT32) for c in (firsts, lines)
    )


def _strings(v: Any) -> bool:
    """[[id, text], ...]"""
    if type(v) is not list:
        return False
    if not v:
        return True
    if set(map(type, v)) != {list} or set(map(len, v)) != {2}:
        return False
    ids, texts = zip(*v, strict=True)
    return _ints(ids, 0, _INT32) and set(map(type, texts)) == {str}


def _shallow(v: Any, depth: int = MAX_NESTING) -> bool:
    """Plain data nested at most ``depth`` arrays and maps deep, with string keys (JSON can show it)."""
    level = [v]
    for _ in range(depth + 1):
        deeper: list[Any] = []
        for x in level:
            if type(x) is list:
                deeper += [y for y in x if type(y) in (list, dict)]
            elif type(x) is dict:
                if not all(type(k) is str for k in x):
                    return False
                deeper += [y for y in x.values() if type(y) in (list, dict)]
        if not deeper:
            return True
        level = deeper
    return False


def _is_map(v: Any) -> bool:
    return type(v) is dict and _shallow(v)


def _any(v: Any) -> bool:
    return True


class _Fields:
    """A body's schema: its required and optional fields, each with its check; called on a body, checks it."""

    def __init__(self, required: dict[str, _Check], optional: dict[str, _Check] | None = None) -> None:
        self.required = required
        self.optional = optional or {}
        self._known = set(required) | set(self.optional)

    def __call__(self, body: Body) -> None:
        for key, ok in self.required.items():
            if key not in body:
                raise DecodeError(f"missing field {key!r}")
            if not ok(body[key]):
                raise DecodeError(f"bad field {key!r}")
        for key, ok in self.optional.items():
            if key in body and body[key] is not None and not ok(body[key]):
                raise DecodeError(f"bad field {key!r}")
        # Fields of a newer version pass, as plain data the monitor can keep and show.
        known = self._known
        for key, value in body.items():
            if type(key) is not str or (key not in known and not _shallow(value)):
                raise DecodeError(f"bad field {_brief(key)}")


def _proflet_state(v: Any) -> bool:
    """A :class:`ProfletState`: costs the planner can add up, or ``{"off": reason}``."""
    if type(v) is not dict or not _shallow(v):
        return False
    if "off" in v:
        return _is_str(v["off"])
    cost_ok = _num_in(0.0, _MAX_COST)
    return (
        all(cost_ok(v[k]) for k in ("ovhd_ms", "slow", "itvl_ms", "prty") if k in v)
        and ("allows" not in v or _list_of(_is_str)(v["allows"]))
        and ("detailing" not in v or _is_bool(v["detailing"]))
    )


def _plan(v: Any) -> bool:
    """A :class:`Plan`: finite, non-negative delays, a budget someone may ask for."""
    if type(v) is not dict or not _shallow(v):
        return False
    return (
        all(_is_nonneg(v[k]) for k in ("sample_delay_s", "report_delay_s") if k in v)
        and ("detail_delay_s" not in v or _map_of(_is_nonneg)(v["detail_delay_s"]))
        and ("fract" not in v or _is_num(v["fract"]))
        and ("budget" not in v or _is_budget(v["budget"]))
    )


_COSTS = _map_of(_is_num)


def _trigger_event(v: Any) -> bool:
    """A :class:`TriggerEvent`."""
    return (
        _is_map(v)
        and _is_time(v.get("t"))
        and all(_is_str(v.get(k)) for k in ("name", "kind", "why"))
        and all(_is_nonneg(v.get(k)) for k in ("before_s", "after_s"))
        and _is_fraction(v.get("budget"))
    )


# The schemas: each type's fields as the TypedDict named after it has them (what
# each field means is said there), and what values are accepted.

_REPORT_REQUIRED: dict[str, _Check] = {
    "agent": _is_str,
    "seq": _is_nat,
    "epoch": _is_nat,
    "t": _is_time,
    "window_s": _is_nonneg,
    "strings": _strings,
    "locs": _locs,
    "stacks": _stacks,
    "samples": _is_count,
}
_REPORT_OPTIONAL: dict[str, _Check] = {
    "threads": _list_of(_tuple_of(_is_int, _is_str)),
    "costs": _COSTS,
    "unit_costs": _COSTS,
    "spent_s": _is_num,
    "allowed_s": _is_num,
    "startup_s": _is_num,
    "elapsed_s": _is_num,
    "budget": _is_fraction,
    "delays": _COSTS,
    "dropped": _map_of(_is_nat),
    "errors": _list_of(_is_str),
    "mode": _is_str,
    "proflets": _map_of(_proflet_state),
    "details": _list_of(lambda v: _is_map(v) and _is_str(v.get("proflet"))),
    "data": _map_of(_is_map),
    "paused": _is_bool,
    "marks": _list_of(_tuple_of(_is_time, _is_str, _is_str)),
    "triggers": _list_of(_trigger_event),
    # which sampler took the stacks and why: {name: "native" (no GIL, agent/_native.c) or "gil", why}
    "sampler": _map_of(_is_str),
}

_SCHEMAS: dict[str, _Fields] = {
    HELLO: _Fields(
        {
            "agent": _is_str,
            "host": _is_str,
            "pid": _int_in(1, _INT32),
            "start_time": _is_time,
            "argv": _list_of(_is_str),
            "python": _is_str,
            "budget": _is_fraction,
        },
        {
            "executable": _is_str,
            "paths": _map_of(_is_str),
            "cpus": _int_in(1, _INT32),
            "attach_token": _is_str,
            "agent_version": _is_str,
            "capabilities": _list_of(_is_str),
            "ceiling": _is_fraction,
            "ppid": _is_int,
            "service": _is_str,
            "sampler": _map_of(_is_str),
        },
    ),
    REPORT: _Fields(_REPORT_REQUIRED, _REPORT_OPTIONAL),
    BYE: _Fields({"agent": _is_str}, {"reason": _is_str}),
    ERROR: _Fields({"agent": _is_str, "message": _is_str}),
    CONFIGURE: _Fields(
        {},
        {
            "budget": _is_budget,
            "monitor": _is_str,
            "ceiling": _is_budget,
            "plan": _plan,
            "paused": _is_bool,
            "reset": _is_bool,
        },
    ),
    DETAIL: _Fields({"proflet": _is_str}, {"first": _is_bool}),
    DETACH: _Fields({}),
    RESYNC: _Fields({}),
    CTL: _Fields({"id": _is_int, "op": _is_str}, {"args": _is_map}),
    # Replies come from our own monitor and hold whole profiles: not walked for nesting.
    CTL_REPLY: _Fields({"id": _is_int, "ok": _is_bool}, {"result": _any, "error": _is_str}),
}

#: A report decoded with raw_stacks: every check the same but for the stacks' ids (see stack_ids).
_RAW_REPORT = _Fields(dict(_REPORT_REQUIRED, stacks=_stack_rows), _REPORT_OPTIONAL)

AGENT_ACCEPTS: Final = frozenset({CONFIGURE, DETACH, RESYNC, DETAIL})
MONITOR_ACCEPTS: Final = frozenset({HELLO, REPORT, BYE, ERROR, CTL})
CLIENT_ACCEPTS: Final = frozenset({CTL_REPLY})


def parse_budget(text: str | float) -> float:
    """Parse a budget such as ``"1%"``, ``"0.5%"`` or ``0.01`` into a fraction.

    Raises :class:`ValueError` with a message fit for the user.
    """
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        raw = str(text).strip()
        try:
            value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
        except ValueError:
            raise ValueError(f"budget {text!r} is not a number: write it like 1% or 0.01") from None
    if not MIN_BUDGET <= value <= MAX_BUDGET:  # NaN fails this too
        low, high = f"{100 * MIN_BUDGET:g}%", f"{100 * MAX_BUDGET:g}%"
        raise ValueError(f"budget {text!r} is out of range: give a value from {low} to {high}, e.g. 1%")
    return value
