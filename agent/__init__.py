"""dyper's agent: samples this process and streams reports to a dyper monitor.

Usage from inside a program (or a container's entry point); ``dyper`` re-exports
these functions::

    import dyper
    dyper.start(monitor="tcp://127.0.0.1:7341", budget="1%")
    ...
    dyper.mark("cache warm")   # a labelled point on the timeline
    dyper.pause()              # no sampling, no detailing: costs nothing
    dyper.resume()
    dyper.reset()              # the whole-run profile starts afresh here
    dyper.boost("10%", 30)     # a higher budget for 30 s (never past start's ceiling)
    dyper.trigger("cpu > 80% for 10s")          # catch a transient: see dyper.agent.triggers
    dyper.trigger(lambda: queue.qsize() > 1000, name="backlog")

    @dyper.tag("checkout")     # samples taken inside carry the tag: profiles split by it
    def checkout(request): ...
    dyper.stop()               # leaves the process as it was

Each of these does nothing when no agent runs, so a program may call them
whether or not it is being profiled.

The same ``start`` is what ``dyper run``, ``dyper attach`` and the
``DYPER_MONITOR`` environment variable end in. Importing this package is cheap:
ZeroMQ, msgpack and the sampler load on ``start``.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from dyper.agent.core import Agent

__all__ = [
    "DEFAULT_MONITOR",
    "agent_id",
    "boost",
    "is_running",
    "mark",
    "pause",
    "reset",
    "resume",
    "set_budget",
    "start",
    "stop",
    "tag",
    "trigger",
]

#: Where agents look for a monitor when none is given: loopback only.
DEFAULT_MONITOR = "tcp://127.0.0.1:7341"

_lock = threading.Lock()
_agent: Agent | None = None
#: Paths a bootstrap added to sys.path so the agent could be imported; removed on stop.
_added_paths: list[str] = []


#: (monitor's public key, agent's public key, agent's secret key), z85-encoded
CurveKeys = tuple[bytes, bytes, bytes]


def check_endpoint(endpoint: str, *, curve: bool = False) -> str:
    """Refuse endpoints that would send profiles off this host unencrypted.

    ``curve``: CURVE keys are in use, so any host will do.
    """
    if endpoint.startswith(("ipc://", "inproc://")):
        return endpoint
    if not endpoint.startswith("tcp://"):
        raise ValueError(f"monitor endpoint {endpoint!r}: use tcp://HOST:PORT or ipc://PATH")
    if curve or is_loopback_endpoint(endpoint):
        return endpoint
    raise ValueError(
        f"monitor endpoint {endpoint!r} is not on loopback; profiles would cross the network "
        "unencrypted: use a loopback address, or CURVE keys made with `dyper keys` (the monitor's "
        "public key and this agent's secret key: --monitor-key and --key, $DYPER_MONITOR_KEY and "
        "$DYPER_KEY, or start(monitor_key=..., key=...))"
    )


def is_loopback_endpoint(endpoint: str) -> bool:
    """A ``tcp://`` endpoint on this host's loopback interface."""
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_keys(monitor_key: str | None, key: str | None) -> CurveKeys | None:
    """Read the CURVE certificates made by ``dyper keys``; None when neither is given.

    ``monitor_key``: the monitor's public certificate (``NAME.key``);
    ``key``: this agent's secret certificate (``NAME.key_secret``).
    Raises :class:`ValueError` with one line for the user.
    """
    if not monitor_key and not key:
        return None
    if not monitor_key or not key:
        raise ValueError(
            "CURVE needs both keys: the monitor's public key (--monitor-key, $DYPER_MONITOR_KEY) "
            "and this agent's secret key (--key, $DYPER_KEY); make them with `dyper keys`"
        )
    server, server_secret = _certificate(monitor_key, "monitor key")
    if server_secret is not None:
        raise ValueError(
            f"monitor key {monitor_key}: this is a secret certificate; give the monitor's public one "
            "(NAME.key): its secret stays on the monitor's host"
        )
    public, secret = _certificate(key, "agent key")
    if secret is None:
        raise ValueError(f"agent key {key}: no secret key in it; give the agent's NAME.key_secret made by `dyper keys`")
    return server, public, secret


def _certificate(path: str, what: str) -> tuple[bytes, bytes | None]:
    from zmq.auth.certs import load_certificate  # only here: most agents use no keys
    from zmq.utils import z85

    path = os.path.expanduser(path)
    try:
        public, secret = load_certificate(path)
    except OSError as exc:
        reason = exc.strerror or "no such file"
        raise ValueError(f"{what} {path}: {reason}; make one with `dyper keys`") from None
    except ValueError:
        raise ValueError(f"{what} {path}: not a certificate made by `dyper keys` (no public key in it)") from None
    for k in (public, secret):
        try:
            ok = k is None or (len(k) == 40 and len(z85.decode(k)) == 32)
        except (ValueError, KeyError):
            ok = False
        if not ok:
            raise ValueError(
                f"{what} {path}: its key is damaged (not 40 Z85 characters); make a new one with `dyper keys`"
            )
    return public, secret


def start(
    monitor: str | None = None,
    budget: float | str | None = None,
    *,
    ceiling: float | str | None = None,
    attach_token: str | None = None,
    proflets: tuple[Any, ...] | None = None,
    monitor_key: str | None = None,
    key: str | None = None,
    triggers: tuple[Any, ...] | list[Any] | None = None,
    monitor_pid: int | None = None,
) -> str:
    """Start the agent and return its id; if it already runs, apply the budget.

    ``monitor`` defaults to ``$DYPER_MONITOR`` and then :data:`DEFAULT_MONITOR`;
    ``budget`` (``"1%"`` or ``0.01``) to ``$DYPER_BUDGET`` and then 1%.
    ``ceiling`` (default ``$DYPER_CEILING``) caps every later budget change and boost. ``proflets`` chooses the
    proflets whose collectors run, as ``--proflets`` does: names, ``all`` for
    every registered one, ``-NAME`` to leave one out of the default set (or
    of ``all``), ``+NAME`` to add one (:func:`proflets.parse_selection`; a
    :class:`agent.proflet.Collector` instance may stand for a name); default
    ``$DYPER_PROFLETS`` (the same, comma-separated; empty for sampling only),
    else the default set. Bad syntax raises ValueError here; an unknown name
    is reported as a proflet switched off.
    ``monitor_key`` (the monitor's public certificate) and ``key`` (this
    agent's secret certificate), paths made by ``dyper keys``, default to
    ``$DYPER_MONITOR_KEY`` and ``$DYPER_KEY``; given, the connection uses
    CURVE, which any endpoint off loopback requires. They are read here, once.
    ``triggers`` (text such as ``"cpu > 80% for 10s"``, or dicts as
    ``TriggerSpec.to_json`` makes them) default to ``$DYPER_TRIGGERS``, a JSON
    list of either; see :mod:`agent.triggers`. A bad one raises ValueError here.
    ``monitor_pid`` says the monitor is run-scoped, living in that process
    (``dyper run`` and ``dyper attach`` give theirs: the autostart reads it
    from ``$DYPER_MONITOR_PID``): when it ends, the agent detaches
    (:mod:`agent.lifeline`). Without it, the agent keeps reconnecting to a
    monitor that went away, as to a standing one.
    Thread-safe and idempotent.
    """
    from dyper.agent.protocol import parse_budget

    # In the caller's thread: a bad key file is an error from start(), not a crash later.
    curve = load_keys(
        monitor_key if monitor_key is not None else os.environ.get("DYPER_MONITOR_KEY"),
        key if key is not None else os.environ.get("DYPER_KEY"),
    )
    endpoint = check_endpoint(monitor or os.environ.get("DYPER_MONITOR") or DEFAULT_MONITOR, curve=curve is not None)
    fraction = parse_budget(budget if budget is not None else os.environ.get("DYPER_BUDGET", "1%"))
    if ceiling is None:
        ceiling = os.environ.get("DYPER_CEILING") or None
    cap = parse_budget(ceiling) if ceiling is not None else None
    return _start(endpoint, fraction, cap, attach_token, proflets, curve, _trigger_specs(triggers), monitor_pid)


def _trigger_specs(triggers: tuple[Any, ...] | list[Any] | None) -> tuple[Any, ...]:
    """Triggers as given, or from $DYPER_TRIGGERS (JSON), checked; raises ValueError."""
    from dyper.agent.triggers import TriggerSpec, parse_trigger

    if triggers is None:
        raw = os.environ.get("DYPER_TRIGGERS")
        if not raw:
            return ()
        import json

        try:
            triggers = json.loads(raw)
        except ValueError:
            raise ValueError('$DYPER_TRIGGERS is not JSON: give a list of conditions, e.g. ["cpu > 80%"]') from None
        if not isinstance(triggers, list):
            raise ValueError('$DYPER_TRIGGERS: give a JSON list of conditions, e.g. ["cpu > 80%"]')
    specs = []
    for t in triggers:
        if isinstance(t, TriggerSpec):
            specs.append(t.checked())
        elif isinstance(t, str):
            specs.append(parse_trigger(t))
        else:
            specs.append(TriggerSpec.from_json(t))
    return tuple(specs)


def _start(
    endpoint: str,
    fraction: float,
    cap: float | None,
    attach_token: str | None,
    proflets: tuple[Any, ...] | None,
    curve: CurveKeys | None,
    triggers: tuple[Any, ...] = (),
    monitor_pid: int | None = None,
) -> str:
    global _agent
    with _lock:
        if _agent is not None and _agent.alive and _agent.pid == os.getpid():
            _agent.set_budget(fraction)
            return _agent.agent_id
        from dyper.agent.core import Agent

        if proflets is None and "DYPER_PROFLETS" in os.environ:
            # e.g. DYPER_PROFLETS="" for sampling only, "-heap" for the default set less heap
            from dyper.proflets import parse_selection

            proflets = parse_selection(os.environ["DYPER_PROFLETS"])
        kwargs: dict[str, Any] = {}
        if proflets is not None:
            kwargs["proflets"] = tuple(proflets)  # "all", "-heap" ...: resolved by the agent's thread
        if triggers:
            kwargs["triggers"] = triggers
        if monitor_pid is not None:
            kwargs["monitor_pid"] = monitor_pid
        new = Agent(endpoint, fraction, attach_token=attach_token, ceiling=cap, curve=curve, on_exit=_on_exit, **kwargs)
        _agent = new
        _install_fork_handler()
        atexit.unregister(_at_exit)
        atexit.register(_at_exit)
        new.start()
        return new.agent_id


def stop(timeout: float = 2.0) -> None:
    """Stop the agent: last report, bye, thread joined, socket closed, hooks removed."""
    global _agent
    with _lock:
        current, _agent = _agent, None
    if current is not None and current.pid == os.getpid():
        current.stop(timeout)
    _cleanup()


def is_running() -> bool:
    current = _agent
    return current is not None and current.alive and current.pid == os.getpid()


def agent_id() -> str | None:
    current = _agent
    return current.agent_id if current is not None and current.pid == os.getpid() else None


def set_budget(budget: float | str) -> None:
    """Change the budget live (bounded by the ceiling given at start)."""
    from dyper.agent.protocol import parse_budget

    current = _agent
    if current is not None:
        current.set_budget(parse_budget(budget))


def _running() -> Agent | None:
    current = _agent
    return current if current is not None and current.pid == os.getpid() else None


def pause() -> None:
    """Stop sampling and detailing, from the next wake-up of the agent's thread; the agent stays attached."""
    current = _running()
    if current is not None:
        current.pause()


def resume() -> None:
    """Sample and detail again after :func:`pause`."""
    current = _running()
    if current is not None:
        current.resume()


def reset() -> None:
    """Start the statistics afresh: the monitor's whole-run profile begins now; its history keeps what came before."""
    current = _running()
    if current is not None:
        current.reset()


#: The longest boost: a longer one is a budget change (set_budget), which the user sees as one.
MAX_BOOST_S = 3600.0


def boost(budget: float | str, seconds: float) -> None:
    """Raise the budget to ``budget`` for ``seconds``, then return to the one before.

    Never past the ceiling given to :func:`start` (``dyper attach --ceiling``,
    ``$DYPER_CEILING``). Raises ValueError for a budget out of range or
    seconds outside (0, 3600].
    """
    from dyper.agent.protocol import parse_budget

    fraction = parse_budget(budget)
    if not 0 < seconds <= MAX_BOOST_S:
        raise ValueError(f"boost for {seconds!r} s: give seconds from 0 to {MAX_BOOST_S:g}")
    current = _running()
    if current is not None:
        current.boost(fraction, float(seconds))


def trigger(
    condition: str | Callable[[], object],
    *,
    name: str | None = None,
    before: float | str | None = None,
    after: float | str | None = None,
    budget: float | str | None = None,
) -> None:
    """Catch a transient problem: when ``condition`` starts to hold, an event with a profile of its own.

    ``condition`` is text (``"cpu > 80% for 10s"``, ``"rss + 50MB/s"``,
    ``"blocked > 5s"``, ``"mark:NAME"``: see :mod:`agent.triggers`) or a
    callable the agent calls about once a second, holding the GIL: it must
    answer in microseconds (over 5 ms, or raising, switches it off, with an
    error in the report). ``before`` and ``after`` (seconds, or ``"30s"``)
    bound the event's window; ``budget`` is the budget while it lasts
    (default: the ceiling, else ten times the budget, at most 10%).
    Raises ValueError for a condition or option it cannot read.
    """
    import dataclasses

    from dyper.agent.triggers import TriggerSpec, parse_options, parse_trigger

    settings = {"before": before, "after": after, "budget": budget}
    if callable(condition):
        if not name:
            raise ValueError("a predicate trigger needs a name=, for its events")
        spec = TriggerSpec(kind="predicate", name=str(name)[:100], **parse_options(settings, f"trigger {name!r}"))
        spec = spec.checked()
        predicate: Callable[[], object] | None = condition
    else:
        spec = parse_trigger(str(condition), settings)
        if name:
            spec = dataclasses.replace(spec, name=str(name)[:100])
        predicate = None
    current = _running()
    if current is not None:
        current.add_trigger(spec, predicate)


_F = TypeVar("_F", bound=Callable[..., Any])
#: Characters of a tag that are kept.
MAX_TAG_CHARS = 100


def tag(name: str) -> Callable[[_F], _F]:
    """Decorate a function so that every sample taken while it runs carries the tag ``name``.

    The wrapper's own frame is the tag: a frame named ``tag:NAME`` in the file
    ``<dyper tag>`` under the function, so the samplers need nothing new,
    it costs one extra call per call and nothing while no agent runs, and
    every profile, export and flame graph shows it. ``dyper report --tag NAME``
    and ``dyper export --tag NAME`` keep only the samples inside it. For
    ``async def`` functions the wrapper is a coroutine that awaits the
    function, so the tag stays on the stack across its awaits.
    """
    import functools
    import inspect

    from dyper.agent.protocol import TAG_FILE, TAG_PREFIX

    label = TAG_PREFIX + str(name)[:MAX_TAG_CHARS]

    def decorate(fn: _F) -> _F:
        if inspect.iscoroutinefunction(fn):

            async def wrapper(*args: Any, **kwargs: Any) -> Any:
                return await fn(*args, **kwargs)

        else:

            def wrapper(*args: Any, **kwargs: Any) -> Any:  # type: ignore[misc]
                return fn(*args, **kwargs)

        # The same code with the tag's name and file: what the samplers see.
        wrapper.__code__ = wrapper.__code__.replace(co_name=label, co_qualname=label, co_filename=TAG_FILE)
        return functools.update_wrapper(wrapper, fn)  # type: ignore[return-value]

    return decorate


def mark(name: str) -> None:
    """Put a point labelled ``name`` on the timeline (``dyper report`` lists the marks, with their times)."""
    current = _running()
    if current is not None:
        current.mark(name)


def _on_exit(which: Agent) -> None:
    # Called by the sampler thread as it ends (stop, detach from the monitor,
    # or a fatal error). No lock here: stop() may hold it while joining us.
    global _agent
    if _agent is which:
        _agent = None
    _cleanup()


def _cleanup() -> None:
    if _agent is None:
        atexit.unregister(_at_exit)
        import sys

        for path in _added_paths:
            while path in sys.path:
                sys.path.remove(path)
        _added_paths.clear()


def _at_exit() -> None:
    # Interpreter shutdown: send what we have. Daemon threads still run here.
    stop(timeout=1.0)


_fork_handler_installed = False


def _install_fork_handler() -> None:
    # os.register_at_fork cannot be undone, so it is installed once per process
    # and does nothing unless an agent was running when the process forked.
    global _fork_handler_installed
    if not _fork_handler_installed:
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_installed = True


def _after_fork_in_child() -> None:
    global _agent, _lock
    parent = _agent
    # The parent's lock may have been held by another thread at fork time,
    # and its thread and ZeroMQ context do not exist here: start afresh.
    _lock = threading.Lock()
    _agent = None
    if parent is not None:
        fast = sys.modules.get("dyper.agent._fastsample")
        if fast is not None and hasattr(fast, "frame_hook_stop"):
            # 3.11: a cpu burst the parent was in when it forked; its counts are the parent's.
            with contextlib.suppress(Exception):
                fast.frame_hook_stop()
        for fd in (parent._wake_r, parent._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if parent._lifeline is not None:
            parent._lifeline.close()
        with contextlib.suppress(Exception):  # never break the child over profiling
            # The parent's keys, not the files again: a worker may have dropped
            # the privileges that could read them.
            # The configured triggers; predicates added from inside are for the child's code to add again.
            kept = tuple(st.spec for st in parent.triggers.states if st.predicate is None) if parent.triggers else ()
            # The parent's choice of proflets, when made of names (an instance given in the parent is not ours).
            names = parent._proflet_names
            chosen = names if names is not None and all(isinstance(n, str) for n in names) else None
            _start(parent.endpoint, parent.budget, parent.ceiling, None, chosen, parent.curve, kept, parent.monitor_pid)
