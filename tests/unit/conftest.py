"""Unit tests open no sockets and start no processes (those belong in tests/integration).

While a unit test is set up, runs and is torn down, creating an inet socket or a new unix
socket, a ZeroMQ socket, a subprocess or a fork raises; the attempt is also recorded and
fails the test, even when the code under test catches the error. The pair of unix sockets an
asyncio event loop makes for its own wake-ups is allowed: it never leaves the process.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable, Generator

import pytest
import zmq


class IsolationError(RuntimeError):
    """What a unit test that reaches for a socket or a process gets."""


_attempts: list[str] = []


def _refuse(what: str) -> IsolationError:
    _attempts.append(what)
    return IsolationError(f"unit tests may not use {what}: move the test to tests/integration")


def _refusing(what: str) -> Callable[..., object]:
    def refuse(*args: object, **kwargs: object) -> object:
        raise _refuse(what)

    return refuse


def _socket_init(original: Callable[..., None]) -> Callable[..., None]:
    def __init__(
        self: socket.socket, family: int = -1, type: int = -1, proto: int = -1, fileno: int | None = None
    ) -> None:
        # socket.socketpair() wraps the descriptors it made (fileno given): an event loop's self-pipe.
        if fileno is None or family != socket.AF_UNIX:
            raise _refuse(f"a socket (family {family})")
        original(self, family, type, proto, fileno)

    return __init__


def _isolated(item: pytest.Item) -> Generator[None, object, object]:
    patches: list[tuple[object, str, object]] = [
        (socket.socket, "__init__", _socket_init(socket.socket.__init__)),
        (zmq.Context, "socket", _refusing("a ZeroMQ socket")),
        (zmq.Socket, "__init__", _refusing("a ZeroMQ socket")),
        (subprocess.Popen, "__init__", _refusing("a subprocess")),
        (os, "fork", _refusing("os.fork")),
        (os, "posix_spawn", _refusing("os.posix_spawn")),
        (os, "posix_spawnp", _refusing("os.posix_spawnp")),
        (os, "system", _refusing("os.system")),
    ]
    del _attempts[:]
    try:
        with pytest.MonkeyPatch.context() as mp:
            for target, name, replacement in patches:
                mp.setattr(target, name, replacement)
            return (yield)
    finally:
        if _attempts:
            used = ", ".join(sorted(set(_attempts)))
            del _attempts[:]
            pytest.fail(f"{item.nodeid} used {used}: unit tests open no sockets and start no processes")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _isolated(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _isolated(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, object, object]:
    return (yield from _isolated(item))
