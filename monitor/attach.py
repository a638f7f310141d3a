"""Attach to and detach from a running process.

The injector (:mod:`monitor.inject`) gets a few lines of Python run inside
the target, on a fresh thread that takes the GIL the ordinary way. Those
lines (:func:`bootstrap_source`) make the agent importable if needed, call
``agent.start`` and write what happened to a side-channel file the CLI
waits for, so an error inside the target (dyper not installed there, a
failed start) comes back to the user instead of vanishing into the target's
stderr. The side channel is a private temporary directory, removed after.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dyper.monitor import inject

#: How long the target has to run the bootstrap and report back.
DEFAULT_TIMEOUT_S = 20.0


class AttachError(Exception):
    """One line for the user: what went wrong and what to do."""


@dataclass(frozen=True)
class Attached:
    pid: int
    agent_id: str
    python: str
    token: str


_BOOTSTRAP = r"""
import json as _json, os as _os, sys as _sys

def _dyper_bootstrap(action, params, result_path):
    import threading as _threading
    me = _threading.get_ident()
    had_entry = me in _threading._active
    added = []
    result = {"ok": False}
    try:
        mod = _sys.modules.get("dyper.agent")
        if action == "start":
            if "dyper.agent.core" not in _sys.modules:
                # dyper.agent.core brings in msgpack and pyzmq: the real test of importability.
                try:
                    import dyper.agent.core
                except ImportError:
                    for path in params["paths"]:
                        if path not in _sys.path:
                            _sys.path.append(path)
                            added.append(path)
                    try:
                        import dyper.agent.core
                    except ImportError as exc:
                        raise RuntimeError(
                            "dyper's agent cannot be imported in the target (%s): install dyper in the "
                            "target's environment (%s -m pip install dyper)" % (exc, _sys.executable)
                        )
            mod = _sys.modules["dyper.agent"]
            mod._added_paths.extend(added)
            added = []
            names = params.get("proflets")
            # Only when given: an older agent in the target may not take them.
            keys = {k: params[k] for k in ("monitor_key", "key", "triggers", "monitor_pid") if params.get(k)}
            agent_id = mod.start(params["monitor"], params["budget"], attach_token=params["token"],
                                 ceiling=params["ceiling"],
                                 proflets=tuple(names) if names is not None else None, **keys)
            result = {"ok": True, "agent": agent_id, "python": _sys.version.split()[0]}
        elif action == "budget":
            running = mod is not None and mod.is_running()
            if running:
                mod.set_budget(params["budget"])
            result = {"ok": True, "was_running": bool(running)}
        elif action in ("pause", "resume", "reset"):
            running = mod is not None and mod.is_running()
            if running:
                getattr(mod, action)()
            result = {"ok": True, "was_running": bool(running)}
        elif action == "stop":
            running = mod is not None and mod.is_running()
            if running:
                mod.stop()
            result = {"ok": True, "was_running": bool(running)}
    except BaseException as exc:
        for path in added:
            while path in _sys.path:
                _sys.path.remove(path)
        text = str(exc) if isinstance(exc, RuntimeError) else "%s: %s" % (type(exc).__name__, exc)
        result = {"ok": False, "error": text}
    if not had_entry:
        # This thread is foreign to threading; if anything called
        # current_thread() here, a _DummyThread entry would outlive us.
        _threading._active.pop(me, None)
    tmp = result_path + ".tmp"
    with open(tmp, "w") as f:
        _json.dump(result, f)
    _os.replace(tmp, result_path)
"""


def bootstrap_source(action: str, params: dict[str, Any], result_path: str) -> str:
    """The Python run in the target: one ``exec`` in a private namespace.

    ``PyRun_SimpleString`` runs in ``__main__``; wrapping everything in
    ``exec(..., {})`` leaves no name behind there.
    """
    body = _BOOTSTRAP + f"\n_dyper_bootstrap({action!r}, {params!r}, {result_path!r})\n"
    return f"exec(compile({body!r}, '<dyper-bootstrap>', 'exec'), {{'__name__': '__dyper_bootstrap__'}})"


def _import_paths(target_version: tuple[int, ...]) -> list[str]:
    """Where the target may find dyper if its own environment lacks it.

    dyper's own directory always (pure Python); our site-packages only if
    the target runs the same Python minor version, since msgpack and pyzmq
    there are compiled for ours.
    """
    import msgpack
    import zmq

    import dyper

    # The folder that holds dyper/: site-packages for a wheel, the source tree for an editable install.
    paths = [str(Path(dyper.__file__).resolve().parent.parent)]
    if tuple(target_version[:2]) == sys.version_info[:2]:
        for mod in (msgpack, zmq):
            site = str(Path(mod.__file__ or "").resolve().parent.parent)
            if site not in paths:
                paths.append(site)
    return paths


def _side_channel(uid: int) -> Path:
    side = Path(tempfile.mkdtemp(prefix="dyper-attach-"))
    if uid != os.geteuid() and os.geteuid() == 0:
        # The target writes its answer here; as root we hand the directory to it.
        os.chown(side, uid, -1)
    return side


def _run(pid: int, action: str, params: dict[str, Any], timeout: float) -> tuple[inject.TargetInfo, dict[str, Any]]:
    try:
        info = inject.preflight(pid)
    except inject.InjectError as exc:
        raise AttachError(str(exc)) from None
    side = _side_channel(info.uid)
    result_path = side / "result.json"
    try:
        if action == "start":
            params = dict(params, paths=_import_paths(info.version))
        source = bootstrap_source(action, params, str(result_path))
        try:
            inject.run_in_target(pid, source, timeout=timeout)
        except inject.InjectError as exc:
            raise AttachError(str(exc)) from None
        deadline = time.monotonic() + timeout
        while not result_path.exists():
            if time.monotonic() > deadline:
                raise AttachError(
                    f"process {pid} did not run dyper's bootstrap within {timeout:.0f}s "
                    "(is it stopped, or stuck holding the GIL in C code?); try again later"
                )
            if not os.path.exists(f"/proc/{pid}"):
                raise AttachError(f"process {pid} exited during attach")
            time.sleep(0.02)
        result: dict[str, Any] = json.loads(result_path.read_text())
    finally:
        shutil.rmtree(side, ignore_errors=True)
    if not result.get("ok"):
        raise AttachError(f"inside process {pid}: {result.get('error', 'unknown error')}")
    return info, result


def attach(
    pid: int,
    monitor: str,
    budget: float,
    *,
    ceiling: float | None = None,
    proflets: tuple[str, ...] | None = None,
    monitor_key: str | None = None,
    key: str | None = None,
    triggers: list[dict[str, Any]] | None = None,
    monitor_pid: int | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> Attached:
    """Start dyper's agent inside process ``pid``, streaming to ``monitor``.

    ``proflets``: the proflets to run (as ``$DYPER_PROFLETS`` names them); None: the agent's default.
    ``triggers``: as ``TriggerSpec.to_json`` makes them (see :mod:`agent.triggers`).
    ``monitor_pid``: the process hosting a run-scoped monitor (see :mod:`agent.lifeline`).
    ``monitor_key``, ``key``: CURVE certificates (see :func:`agent.start`). The
    target opens them itself: they must be readable by its user at these
    paths (made absolute here) in its filesystem. The secret never passes
    through the bootstrap.
    """
    token = uuid.uuid4().hex
    params: dict[str, Any] = {"monitor": monitor, "budget": budget, "token": token, "ceiling": ceiling}
    if proflets is not None:
        params["proflets"] = list(proflets)
    if triggers:
        params["triggers"] = triggers
    if monitor_pid is not None:
        params["monitor_pid"] = monitor_pid
    if monitor_key and key:
        params["monitor_key"] = os.path.abspath(os.path.expanduser(monitor_key))
        params["key"] = os.path.abspath(os.path.expanduser(key))
    _, result = _run(pid, "start", params, timeout)
    return Attached(pid, str(result["agent"]), str(result.get("python", "")), token)


def set_budget(pid: int, budget: float, *, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Change the budget of the agent inside ``pid`` directly. True if one was running."""
    _, result = _run(pid, "budget", {"budget": budget}, timeout)
    return bool(result.get("was_running"))


def control(pid: int, op: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Pause, resume or reset the agent inside ``pid`` directly. True if one was running."""
    if op not in ("pause", "resume", "reset"):
        raise ValueError(f"unknown control {op!r}")
    _, result = _run(pid, op, {}, timeout)
    return bool(result.get("was_running"))


def detach(pid: int, *, timeout: float = DEFAULT_TIMEOUT_S) -> bool:
    """Stop the agent inside ``pid`` directly (no monitor needed). True if one was running."""
    _, result = _run(pid, "stop", {}, timeout)
    return bool(result.get("was_running"))
