"""Services: the processes of one service, and one profile merging them.

A pre-fork server (gunicorn, uvicorn with workers, a multiprocessing pool) is
one service made of many processes: a master and its workers, each its own
session with its own agent. Looking at one worker shows a fraction of the
service and looking at the idle master shows nothing, so the monitor groups
sessions into services and merges their counts.

Grouping, from what each agent's hello says:

- an explicit name (``DYPER_SERVICE=checkout``) groups every process that
  gives it, on any host;
- otherwise a process belongs to the service of its parent when the parent is
  a session too (same host, its ``ppid``, started no later), so a master and
  every worker it forked, and their children, are one service named after the
  root process;
- a process with neither is a service of one.

Frames are interned monitor-wide (:class:`monitor.session.FrameTable`), so
the merged counts are simply the sum of the members' counts. Thread idents
are per process and a forked worker's main thread usually has its parent's
ident; the merged profile therefore adds up threads of the same ident across
processes, which is what a service-level view wants ("the main threads").
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dyper.monitor.session import Session, SessionKey

#: A parent chain longer than this is a bug or a loop of reused pids: stop walking.
MAX_DEPTH = 64


@dataclass
class Service:
    """The sessions of one service, the root (or first-seen) member first."""

    id: str
    name: str
    members: list[Session] = field(default_factory=list)
    #: the root process's session key; None for a named service (its first member leads)
    root_key: SessionKey | None = None

    @property
    def root(self) -> Session:
        return self.members[0]

    @property
    def pids(self) -> list[int]:
        return [s.pid for s in self.members]

    def info(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "root_pid": self.root.pid,
            "pids": self.pids,
            "processes": len(self.members),
            "connected": sum(1 for s in self.members if s.connected),
            "samples": sum(s.samples for s in self.members),
        }


def _parent(session: Session, by_pid: dict[tuple[str, int], list[Session]]) -> Session | None:
    ppid = session.hello.get("ppid")
    if not isinstance(ppid, int) or ppid <= 0:
        return None
    candidates = [
        p for p in by_pid.get((session.key[0], ppid), []) if p is not session and p.key[2] <= session.key[2] + 1e-3
    ]
    # A reused pid: the newest process with that pid that started before this one is the parent.
    return max(candidates, key=lambda p: p.key[2]) if candidates else None


def _label(session: Session) -> str:
    """``gunicorn app:app (pid 8981)``: the program and its last argument, not the interpreter's path."""
    words = [str(a) for a in session.hello.get("argv", [])]
    if words and os.path.basename(words[0]).startswith("python"):
        words = words[1:]
    if words and words[0] == "-m":
        words = words[1:]
    if not words:
        return f"python (pid {session.pid})"
    text = os.path.basename(words[0])
    if text == "__main__.py":  # `python -m gunicorn`: the package's name
        text = os.path.basename(os.path.dirname(words[0])) or text
    if len(words) > 1 and not words[-1].startswith("-"):
        text += " " + words[-1]
    return f"{text} (pid {session.pid})"


def group(sessions: Iterable[Session]) -> list[Service]:
    """The services the sessions make up, the largest first."""
    sessions = list(sessions)
    by_pid: dict[tuple[str, int], list[Session]] = {}
    for s in sessions:
        by_pid.setdefault((s.key[0], s.pid), []).append(s)
    services: dict[str, Service] = {}
    for s in sorted(sessions, key=lambda s: s.key[2]):
        name = s.hello.get("service")
        if isinstance(name, str) and name:
            sid = f"name:{name}"
            service = services.setdefault(sid, Service(sid, name))
        else:
            root, seen = s, {s.key}
            while (parent := _parent(root, by_pid)) is not None and parent.key not in seen and len(seen) < MAX_DEPTH:
                if isinstance(parent.hello.get("service"), str) and parent.hello.get("service"):
                    break  # a named parent: this process started its own, unnamed service
                seen.add(parent.key)
                root = parent
            sid = "root:{}:{}:{:.3f}".format(*root.key)
            service = services.setdefault(sid, Service(sid, _label(root), root_key=root.key))
        service.members.append(s)
    for service in services.values():
        # the root first, then the members by start time (already in that order)
        service.members.sort(key=lambda m, root=service.root_key: m.key != root)  # type: ignore[misc]
    return sorted(services.values(), key=lambda sv: (-len(sv.members), sv.root.key[2]))


def service_of(sessions: Iterable[Session], session: Session) -> Service:
    """The service ``session`` belongs to."""
    for service in group(sessions):
        if any(m is session for m in service.members):
            return service
    return Service("root:{}:{}:{:.3f}".format(*session.key), _label(session), [session], session.key)
