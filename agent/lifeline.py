"""The agent's tie to a run-scoped monitor: the one ``dyper run`` or ``dyper attach`` hosts in its own process.

Such a monitor lives only as long as the command that started it. When that
process is gone (killed with SIGKILL, say, so it could not detach us), no
monitor will ever listen at its endpoint again, and an agent that kept
waiting and reconnecting would profile a process nobody watches for the rest
of its life. So an agent started by one (``$DYPER_MONITOR_PID``, or
``agent.start(monitor_pid=...)``) watches that process and detaches when it
ends. A standing monitor's agents have no such tie: they keep reconnecting,
since a standing monitor comes back.

On Linux 5.3+ the watch is a pidfd in the sampler's poll: no wake-up, no
cost, noticed at once. Where none can be opened (an older kernel, a seccomp
filter), :meth:`Lifeline.gone` is asked at each report instead.
"""

from __future__ import annotations

import contextlib
import os

#: The environment's form of ``agent.start(monitor_pid=...)``, set by ``dyper run``.
ENV: str = "DYPER_MONITOR_PID"


def monitor_pid_from_env() -> int | None:
    """``$DYPER_MONITOR_PID`` as a process id; None when unset or not a positive number."""
    raw = os.environ.get(ENV, "").strip()
    try:
        pid = int(raw)
    except ValueError:
        return None
    return pid if pid > 0 else None


class Lifeline:
    """Process ``pid``, the run-scoped monitor's, watched for its end."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        #: readable once the process has ended; None where pidfds are not available
        self.fd: int | None = None
        self._ended = False
        opener = getattr(os, "pidfd_open", None)
        if opener is not None:
            try:
                self.fd = opener(pid)
            except ProcessLookupError:
                self._ended = True  # gone before we started
            except OSError:
                self.fd = None  # no pidfds here: asked at each report

    def gone(self) -> bool:
        """Whether the process has ended (a cheap check: one system call)."""
        if self._ended:
            return True
        if self.fd is not None:
            import select

            try:
                ready, _, _ = select.select([self.fd], [], [], 0)
            except (OSError, ValueError):
                return False
            self._ended = bool(ready)
            return self._ended
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            self._ended = True
        except OSError:
            pass  # EPERM: it exists (another user's process by now would be a reused pid: rare, and harmless)
        return self._ended

    def close(self) -> None:
        """Close the pidfd (once: a number closed twice may by then be the application's)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
