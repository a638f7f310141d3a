"""CURVE for a monitor off loopback: its keys, the ZAP gate, the local control endpoint.

A monitor that listens off loopback is a CURVE server. An agent pins the
monitor's public key, so nobody else can pose as the monitor, and presents
its own key pair, whose public half must be in the monitor's authorized
directory, so nobody else can feed the monitor or send requests through it.
ZeroMQ encrypts the connection once both hold.

The ZAP handler (pyzmq's :class:`zmq.auth.Authenticator`, driven from the
monitor's event loop by :meth:`Gate.run`) decides on the agents' keys; a
socket monitor on the ROUTER socket counts the handshakes that fail.
Both run on the monitor's loop, the one thread that touches its counters.

The same ROUTER socket also binds a control endpoint without CURVE, on this
host only (an ipc socket in a directory only the monitor's user can enter,
or a loopback port), for the commands run next to the monitor (``dyper top``,
``ps``, ``budget``...) and for agents attached from here (the web UI).
Socket options apply to the endpoints bound after they are set, so one
socket serves both and nothing else in the monitor needs to tell them apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import zmq
import zmq.asyncio
import zmq.auth

#: The ZAP domain of the CURVE endpoint.
ZAP_DOMAIN: Final = "dyper"
#: Handshake failures the gate counts: "auth_rejected" (an agent key not
#: authorized) and "handshake_failed" (anything else: a wrong monitor key, a
#: peer without CURVE, garbage).
_FAILURES: Final = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
#: Peers whose rejection is logged (each once); past this, they are only counted.
MAX_LOGGED_PEERS: Final = 1000
#: Longest ipc path ZeroMQ takes (sun_path is 108 bytes on Linux, with the NUL).
_MAX_IPC_PATH: Final = 107

OnEvent = Callable[[str, dict[str, Any]], None]


class CurveError(ValueError):
    """A key file or directory the monitor cannot use; one line for the user."""


@dataclass
class ServerKeys:
    """The monitor's key pair and the agents it lets in."""

    public: bytes
    secret: bytes
    #: directory of the agents' public certificates (``NAME.key``)
    authorized: Path
    #: their public keys, z85
    keys: set[bytes] = field(default_factory=set)


def load_server_keys(secret_file: str, authorized: str) -> ServerKeys:
    """The monitor's secret certificate and its authorized directory, checked."""
    from zmq.auth.certs import load_certificate

    path = os.path.expanduser(secret_file)
    try:
        public, secret = load_certificate(path)
    except OSError as exc:
        raise CurveError(
            f"--curve-secret {path}: {exc.strerror or 'no such file'}; make one with `dyper keys`"
        ) from None
    except ValueError:
        raise CurveError(f"--curve-secret {path}: not a certificate made by `dyper keys`") from None
    if secret is None:
        raise CurveError(
            f"--curve-secret {path}: no secret key in it; give the monitor's NAME.key_secret, not NAME.key"
        )
    directory = Path(os.path.expanduser(authorized))
    if not directory.is_dir():
        raise CurveError(f"--authorized {directory}: not a directory; make one and copy each agent's NAME.key into it")
    keys, bad = read_authorized(directory)
    if bad:
        raise CurveError(f"--authorized {directory}: {bad[0]}")
    return ServerKeys(public, secret, directory, keys)


def read_authorized(directory: Path) -> tuple[set[bytes], list[str]]:
    """The public keys of the ``*.key`` certificates in ``directory``, and what was wrong with the others."""
    from zmq.auth.certs import load_certificate

    keys: set[bytes] = set()
    bad: list[str] = []
    try:
        files = sorted(directory.glob("*.key"))
    except OSError as exc:
        return keys, [f"cannot read the directory: {exc.strerror}"]
    for cert in files:
        try:
            public, secret = load_certificate(cert)
        except (OSError, ValueError):
            bad.append(f"{cert.name} is not a public certificate made by `dyper keys`")
            continue
        if secret is not None:
            # Nothing to do with authorization, but a secret has no business being here.
            bad.append(f"{cert.name} holds a secret key: put only public certificates (NAME.key) here")
            continue
        keys.add(public)
    return keys, bad


def default_control(port: int) -> str:
    """An ipc endpoint only this user can reach: ``$XDG_RUNTIME_DIR/dyper``, else ``/tmp/dyper-UID``."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    directory = Path(runtime) / "dyper" if runtime else Path(tempfile.gettempdir()) / f"dyper-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        directory.mkdir(mode=0o700, parents=True)
    st = directory.lstat()
    # In a shared /tmp someone else may have made it first, to listen in our place.
    if not directory.is_dir() or directory.is_symlink() or st.st_uid != os.geteuid():
        raise CurveError(f"{directory} is not a directory of this user's: give --control ENDPOINT")
    if st.st_mode & 0o077:
        directory.chmod(0o700)
    path = str(directory / f"monitor-{port}.sock")
    if len(path.encode()) > _MAX_IPC_PATH:
        raise CurveError(f"the control socket path {path} is too long for ipc: give --control ENDPOINT")
    return f"ipc://{path}"


class _Authenticator(zmq.auth.Authenticator):
    """pyzmq's ZAP handler, deciding CURVE keys through :meth:`Gate.callback` and telling it who asked."""

    def __init__(self, context: zmq.Context[Any], gate: Gate) -> None:
        super().__init__(context)
        self.gate = gate

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # The peer's address is in the request, not in what the key callback gets.
        self.gate.peer = msg[3].decode(errors="replace") if len(msg) > 3 else "?"
        await super().handle_zap_message(msg)


class Gate:
    """The CURVE side of the monitor's socket: its ZAP handler and its failed handshakes.

    :meth:`install` before the CURVE endpoint is bound (without a ZAP
    handler, libzmq would let any client key in), :meth:`run` on the
    monitor's loop, :meth:`close` after the socket is closed.
    """

    def __init__(self, keys: ServerKeys, counters: dict[str, int], on_event: OnEvent) -> None:
        self.keys = keys
        self.counters = counters
        self.counters.setdefault("auth_rejected", 0)
        self.counters.setdefault("handshake_failed", 0)
        self._on_event = on_event
        self._auth: _Authenticator | None = None
        self._events: zmq.Socket[Any] | None = None
        self._mtime = self._dir_mtime()
        #: the peer of the ZAP request being decided
        self.peer = "?"
        self._logged: set[tuple[str, bytes]] = set()
        self._logged_failures: set[int] = set()

    def install(self, ctx: zmq.asyncio.Context, sock: zmq.asyncio.Socket) -> None:
        """Start the ZAP handler and the socket monitor; make ``sock`` a CURVE server for its next bind."""
        auth = _Authenticator(ctx, self)
        auth.start()
        auth.configure_curve_callback(ZAP_DOMAIN, self)
        self._auth = auth
        address = f"inproc://dyper-gate-{id(self)}"
        sock.monitor(address, _FAILURES)
        # A plain socket: polled by the loop, read without blocking (as pyzmq's asyncio ZAP handler does).
        events: zmq.Socket[Any] = zmq.Socket(ctx, zmq.PAIR)
        events.setsockopt(zmq.LINGER, 0)
        events.connect(address)
        self._events = events
        sock.curve_server = True
        sock.curve_secretkey = self.keys.secret
        sock.zap_domain = ZAP_DOMAIN.encode()

    def close(self) -> None:
        if self._events is not None:
            self._events.close(linger=0)
            self._events = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None

    async def run(self) -> None:
        """Answer ZAP requests and count failed handshakes until cancelled."""
        assert self._auth is not None and self._events is not None, "install() first"
        zap, events = self._auth.zap_socket, self._events
        poller = zmq.asyncio.Poller()
        poller.register(zap, zmq.POLLIN)
        poller.register(events, zmq.POLLIN)
        while True:
            try:
                ready = dict(await poller.poll())
                for _ in range(100):  # bounded, so the receive loop gets its turn
                    if zap not in ready:
                        break
                    try:
                        msg = zap.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    await self._answer(msg)
                for _ in range(100):
                    if events not in ready:
                        break
                    try:
                        event = events.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._count(event)
            except Exception as exc:  # without this task no agent gets in: it must go on
                self._event("internal_error", {"message": f"CURVE gate: {type(exc).__name__}: {exc}"})
                await asyncio.sleep(0.1)

    async def _answer(self, msg: list[bytes]) -> None:
        assert self._auth is not None
        try:
            await self._auth.handle_zap_message(msg)
        except Exception as exc:  # a bug must refuse one handshake, not stop the gate
            self._event("internal_error", {"message": f"ZAP: {type(exc).__name__}: {exc}"})
            if len(msg) > 1:
                # The REP socket still owes this request its answer; a refusal.
                with contextlib.suppress(zmq.ZMQError):
                    self._auth.zap_socket.send_multipart([b"1.0", msg[1], b"500", b"internal error", b"", b""])

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP's question for a CURVE client: is ``key`` (z85) authorized?"""
        self._reload()
        if key in self.keys.keys:
            return True
        peer = self.peer
        if (peer, key) not in self._logged and len(self._logged) < MAX_LOGGED_PEERS:
            self._logged.add((peer, key))
            self._event(
                "auth_rejected",
                {
                    "peer": peer,
                    "key": key.decode(errors="replace"),
                    "message": f"refused agent key {key.decode(errors='replace')} from {peer}: "
                    f"not in {self.keys.authorized} (copy the agent's NAME.key there to let it in)",
                },
            )
        return False

    def _count(self, frames: list[bytes]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        try:
            event = parse_monitor_message(frames)
        except Exception:  # not from libzmq's monitor: nothing to count
            return
        if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.counters["auth_rejected"] += 1
            return
        self.counters["handshake_failed"] += 1
        code = int(event["value"])
        if event["event"] != zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL or code in self._logged_failures:
            return  # (without detail, the value is an errno: the peer left, nothing to tell)
        # The event names our endpoint, not the peer: logged once per kind of failure.
        self._logged_failures.add(code)
        if code == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
            why = "its CURVE handshake did not decrypt (an agent with the wrong --monitor-key?)"
        elif code == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
            why = "it does not use CURVE (an agent or client without --monitor-key and --key?)"
        else:
            why = f"protocol error {code:#x}"
        where = event["endpoint"].decode(errors="replace")
        message = f"a peer failed the handshake on {where}: {why}; more of these are only counted (handshake_failed)"
        self._event("handshake_failed", {"message": message})

    def _dir_mtime(self) -> int:
        try:
            return self.keys.authorized.stat().st_mtime_ns
        except OSError:
            return -1

    def _reload(self) -> None:
        """Follow the authorized directory: keys added or removed count for the next handshakes."""
        mtime = self._dir_mtime()
        if mtime == self._mtime:
            return
        self._mtime = mtime
        if mtime < 0:
            # Gone: nobody is authorized any more, rather than whoever was.
            self.keys.keys = set()
            self._event("auth_error", {"message": f"{self.keys.authorized} is gone: every agent key is refused"})
            return
        self.keys.keys, bad = read_authorized(self.keys.authorized)
        for problem in bad:
            self._event("auth_error", {"message": f"{self.keys.authorized}: {problem}; ignored"})

    def _event(self, kind: str, data: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # a broken printer must not refuse handshakes
            self._on_event(kind, data)
