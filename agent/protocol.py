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
    ``configure``  budget and other settings
    ``detach``     stop the agent and remove every hook
    ``resync``     the monitor does not know this agent (it restarted): send
                   ``hello`` and the full string tables again
    ``detail``     run one detailing burst of a proflet (the monitor's queue
                   decides when; the agent still starts it only when its own
                   guard can pay for it)
client <-> monitor (the CLI talking to a standing monitor)
    ``ctl``        a request: ``{"id": int, "op": str, "args": map}``
    ``ctl_reply``  ``{"id": int, "ok": bool, "result": any, "error": str}``
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

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


class DecodeError(ValueError):
    """A frame that is not a valid dyper message. Count it and drop it."""


def encode(msg_type: str, body: Body) -> bytes:
    """Encode one message. Raises :class:`ValueError` if it would exceed the size limit."""
    data: bytes = msgpack.packb([MAGIC, PROTOCOL_VERSION, msg_type, body], use_bin_type=True)
    if len(data) > MAX_FRAME_BYTES:
        raise ValueError(f"{msg_type} message of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    return data


def decode(data: bytes, accept: frozenset[str] | None = None) -> tuple[str, Body]:
    """Decode and validate one frame; return ``(type, body)``.

    ``accept`` restricts the message types this receiver takes. The body's
    fields are checked against the schema of its type, so callers can index
    the required fields without further checks.
    """
    if len(data) > MAX_FRAME_BYTES:
        raise DecodeError(f"frame of {len(data)} bytes exceeds {MAX_FRAME_BYTES}")
    try:
        # Limits are derived from the frame length by msgpack itself, so a
        # short frame cannot claim a huge array and make us allocate it.
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True)
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(f"not msgpack: {type(exc).__name__}") from None
    if not isinstance(obj, list) or len(obj) != 4 or obj[0] != MAGIC:
        raise DecodeError("not a dyper envelope")
    version, msg_type, body = obj[1], obj[2], obj[3]
    if version != PROTOCOL_VERSION:
        raise DecodeError(f"protocol version {version!r}, expected {PROTOCOL_VERSION}")
    if not isinstance(msg_type, str) or msg_type not in _SCHEMAS:
        raise DecodeError(f"unknown message type {msg_type!r}")
    if accept is not None and msg_type not in accept:
        raise DecodeError(f"unexpected message type {msg_type!r}")
    if not isinstance(body, dict):
        raise DecodeError(f"{msg_type}: body is not a map")
    _SCHEMAS[msg_type](body)
    return msg_type, body


# --- validation --------------------------------------------------------------

_Check = Callable[[Any], bool]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _list_of(check: _Check) -> _Check:
    return lambda v: isinstance(v, list) and all(check(x) for x in v)


def _tuple_of(*checks: _Check) -> _Check:
    return lambda v: isinstance(v, list) and len(v) == len(checks) and all(c(x) for c, x in zip(checks, v, strict=True))


def _map_of(check: _Check) -> _Check:
    return lambda v: isinstance(v, dict) and all(check(x) for x in v.values())


def _any(v: Any) -> bool:
    return True


def _fields(required: dict[str, _Check], optional: dict[str, _Check] | None = None) -> Callable[[Body], None]:
    optional = optional or {}

    def check(body: Body) -> None:
        for key, ok in required.items():
            if key not in body:
                raise DecodeError(f"missing field {key!r}")
            if not ok(body[key]):
                raise DecodeError(f"bad field {key!r}")
        for key, ok in optional.items():
            if key in body and body[key] is not None and not ok(body[key]):
                raise DecodeError(f"bad field {key!r}")

    return check


_COSTS = _map_of(_is_num)

_SCHEMAS: dict[str, Callable[[Body], None]] = {
    HELLO: _fields(
        {
            "agent": _is_str,  # agent incarnation id, also the ZeroMQ routing id
            "host": _is_str,
            "pid": _is_int,
            "start_time": _is_num,  # process creation time, seconds since the epoch
            "argv": _list_of(_is_str),
            "python": _is_str,
            "budget": _is_num,
        },
        {
            "executable": _is_str,
            "paths": _map_of(_is_str),
            "cpus": _is_int,
            "attach_token": _is_str,
            "agent_version": _is_str,
            "capabilities": _list_of(_is_str),
            "ceiling": _is_num,
        },
    ),
    REPORT: _fields(
        {
            "agent": _is_str,
            "seq": _is_int,
            "epoch": _is_int,  # string tables restart when the epoch changes
            "t": _is_num,  # wall clock (seconds since the epoch) at the end of the window
            "window_s": _is_num,  # length of the window this report covers
            # string table additions: [id, text]
            "strings": _list_of(_tuple_of(_is_int, _is_str)),
            # location additions: [id, file string id, qualname string id, first line, line, flags]
            # flags: LOC_BLOCKING when the instruction is a call to a blocking routine (with one of
            # LOC_LOCK, LOC_WAIT, LOC_IO, LOC_SLEEP saying what it waits for), LOC_AGENT for dyper's own code
            "locs": _list_of(_tuple_of(_is_int, _is_int, _is_int, _is_int, _is_int, _is_int)),
            # [thread ident, count, [location ids, leaf first]]
            "stacks": _list_of(_tuple_of(_is_int, _is_int, _list_of(_is_int))),
            "samples": _is_int,  # sampling passes in the window
        },
        {
            "threads": _list_of(_tuple_of(_is_int, _is_str)),
            "costs": _COSTS,  # seconds spent in the window: sample, report, detail
            "unit_costs": _COSTS,  # the agent's estimates of one sample and one report, in seconds
            "spent_s": _is_num,  # total seconds spent since start
            "startup_s": _is_num,  # one-time start-up work (loading proflets), not in spent_s
            "elapsed_s": _is_num,  # wall seconds since start
            "budget": _is_num,
            "delays": _COSTS,  # current mean delays in seconds
            "dropped": _map_of(_is_int),  # what was dropped and how often
            "errors": _list_of(_is_str),
            "mode": _is_str,  # "monitor": following the monitor's timings; "local": its own
            # per proflet: calibrated costs {ovhd_ms, slow, itvl_ms, prty, allows, detailing} or {off: reason}
            "proflets": _map_of(lambda v: isinstance(v, dict)),
            # bursts finished in the window: {proflet, t, length_s, fixed_s, slowdown_s, ...results}
            "details": _list_of(lambda v: isinstance(v, dict) and isinstance(v.get("proflet"), str)),
            # per proflet: what its collector's report hook returned for the window (plain data)
            "data": _map_of(lambda v: isinstance(v, dict)),
        },
    ),
    BYE: _fields({"agent": _is_str}, {"reason": _is_str}),
    ERROR: _fields({"agent": _is_str, "message": _is_str}),
    # plan: {sample_delay_s, report_delay_s, detail_delay_s: {proflet: s}}
    CONFIGURE: _fields(
        {}, {"budget": _is_num, "monitor": _is_str, "ceiling": _is_num, "plan": lambda v: isinstance(v, dict)}
    ),
    DETAIL: _fields({"proflet": _is_str}),
    DETACH: _fields({}),
    RESYNC: _fields({}),
    CTL: _fields({"id": _is_int, "op": _is_str}, {"args": lambda v: isinstance(v, dict)}),
    CTL_REPLY: _fields({"id": _is_int, "ok": lambda v: isinstance(v, bool)}, {"result": _any, "error": _is_str}),
}

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
    if not (value == value) or value <= 0.0 or value > 0.5:
        raise ValueError(f"budget {text!r} is out of range: give a value from 0.01% to 50%, e.g. 1%")
    return value
