"""The CLI's side of a standing monitor: one request, one reply, with a timeout."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from typing import Any

import zmq

from dyper.agent import CurveKeys, is_loopback_endpoint, load_keys, protocol


class MonitorUnreachable(Exception):
    """No monitor answered at the endpoint."""


class MonitorRefused(Exception):
    """The monitor answered with an error (its text is for the user)."""


class MonitorClient:
    """``curve``: CURVE keys as :func:`agent.load_keys` reads them. Without
    them, a ``tcp://`` endpoint off loopback uses ``$DYPER_MONITOR_KEY`` and
    ``$DYPER_KEY`` if set (on this host, a CURVE monitor's commands go to its
    control endpoint, which has no CURVE)."""

    def __init__(self, endpoint: str, timeout: float = 3.0, *, curve: CurveKeys | None = None) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self._ids = itertools.count(1)
        #: what may be wrong with the keys, told if nobody answers
        self._key_problem = ""
        remote = endpoint.startswith("tcp://") and not is_loopback_endpoint(endpoint)
        if curve is None and remote:
            try:
                curve = load_keys(os.environ.get("DYPER_MONITOR_KEY"), os.environ.get("DYPER_KEY"))
            except ValueError as exc:
                self._key_problem = str(exc)
            if curve is None and not self._key_problem:
                self._key_problem = (
                    "a monitor off loopback needs CURVE keys: "
                    "set $DYPER_MONITOR_KEY and $DYPER_KEY, made with `dyper keys`"
                )
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.DEALER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # A send waits while no connection takes it (a CURVE monitor refusing our keys
        # drops each attempt): for the timeout, never for good.
        self._sock.setsockopt(zmq.SNDTIMEO, max(1, int(timeout * 1000)))
        if curve is not None:
            self._key_problem = (
                "or it refused these keys: check the monitor's public key "
                "and that ours is in its --authorized directory"
            )
            self._sock.curve_serverkey, self._sock.curve_publickey, self._sock.curve_secretkey = curve
        self._sock.connect(endpoint)

    def call(self, op: str, **args: Any) -> Any:
        rid = next(self._ids)
        try:
            self._sock.send(protocol.encode(protocol.CTL, {"id": rid, "op": op, "args": args}))
        except zmq.Again:
            raise self._unreachable() from None
        deadline_ms = int(self.timeout * 1000)
        while self._sock.poll(deadline_ms, zmq.POLLIN):
            try:
                # A whole-run profile of a big service may hold more arrays than an agent's report.
                _, body = protocol.decode(
                    self._sock.recv(), protocol.CLIENT_ACCEPTS, max_containers=protocol.MAX_FRAME_BYTES
                )
            except protocol.DecodeError:
                continue
            if body["id"] != rid:
                continue  # a late answer to an earlier request that timed out
            if not body["ok"]:
                raise MonitorRefused(body.get("error", "error"))
            return body.get("result")
        raise self._unreachable()

    def _unreachable(self) -> MonitorUnreachable:
        hint = f" ({self._key_problem})" if self._key_problem else ""
        return MonitorUnreachable(
            f"no dyper monitor answers at {self.endpoint}: start one with `dyper monitor` or give --monitor{hint}"
        )

    def close(self) -> None:
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> MonitorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_for_monitor(
    endpoint: str,
    timeout_s: float = 30.0,
    *,
    alive: Callable[[], bool] | None = None,
    curve: CurveKeys | None = None,
) -> Any:
    """Ping ``endpoint`` until a monitor answers (a monitor just started); its ping reply.

    ``alive`` tells whether the monitor's process still runs: once it is
    not, waiting on is pointless. Raises :class:`MonitorUnreachable` when no
    monitor answered within ``timeout_s`` or its process has gone.
    """
    deadline = time.monotonic() + timeout_s
    with MonitorClient(endpoint, timeout=0.5, curve=curve) as client:
        while True:
            try:
                return client.call("ping")
            except MonitorUnreachable:
                if time.monotonic() > deadline or (alive is not None and not alive()):
                    raise
                time.sleep(0.1)
