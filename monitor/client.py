"""The CLI's side of a standing monitor: one request, one reply, with a timeout."""

from __future__ import annotations

import itertools
from typing import Any

import zmq

from agent import protocol


class MonitorUnreachable(Exception):
    """No monitor answered at the endpoint."""


class MonitorRefused(Exception):
    """The monitor answered with an error (its text is for the user)."""


class MonitorClient:
    def __init__(self, endpoint: str, timeout: float = 3.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(endpoint)

    def call(self, op: str, **args: Any) -> Any:
        rid = next(self._ids)
        self._sock.send(protocol.encode(protocol.CTL, {"id": rid, "op": op, "args": args}))
        deadline_ms = int(self.timeout * 1000)
        while self._sock.poll(deadline_ms, zmq.POLLIN):
            try:
                _, body = protocol.decode(self._sock.recv(), protocol.CLIENT_ACCEPTS)
            except protocol.DecodeError:
                continue
            if body["id"] != rid:
                continue  # a late answer to an earlier request that timed out
            if not body["ok"]:
                raise MonitorRefused(body.get("error", "error"))
            return body.get("result")
        raise MonitorUnreachable(
            f"no dyper monitor answers at {self.endpoint}: start one with `dyper monitor` or give --monitor"
        )

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> MonitorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
