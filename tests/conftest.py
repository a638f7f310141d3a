"""Shared fixtures. The autouse check fails any test that leaves dyper's agent,
a profile/trace hook, tracemalloc or a sys.monitoring tool id behind in the
test process itself (pyinstrument's conftest does the same for its sampler)."""

from __future__ import annotations

import sys
import threading
import tracemalloc
from collections.abc import Iterator

import pytest


class _NoCheckoutNames:
    """Refuse the pre-namespace top-level names: pytest puts the checkout on sys.path,
    where agent/, monitor/ and proflets/ would import by accident; dyper installs
    them only as dyper.agent, dyper.monitor and dyper.proflets."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name in ("agent", "monitor", "proflets"):
            raise ModuleNotFoundError(f"no top-level {name!r}: dyper's is dyper.{name}", name=name)
        return None


sys.meta_path.insert(0, _NoCheckoutNames())


def _state() -> dict[str, object]:
    tools = []
    if hasattr(sys, "monitoring"):
        tools = [i for i in range(6) if sys.monitoring.get_tool(i) is not None]
    return {
        "sampler": [t.name for t in threading.enumerate() if t.name == "dyper-sampler"],
        "profile": sys.getprofile(),
        "trace": sys.gettrace(),
        "tracemalloc": tracemalloc.is_tracing(),
        "monitoring": tools,
    }


@pytest.fixture(autouse=True)
def check_left_behind() -> Iterator[None]:
    before = _state()
    yield
    from dyper import agent

    if agent.is_running():
        agent.stop()
        pytest.fail("test left dyper's agent running")
    after = _state()
    assert after == before, f"test left state behind: {before} -> {after}"
