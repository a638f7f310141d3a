"""The profile builder: the one place a session's (or a service's) profile is made.

The control path (``dyper profile``/``top``/``report``/``export``), the live
views, ``dyper run`` and the dashboard all ask :func:`build_profile` (or
:func:`profile_job`, which splits the work into what reads the live session
now and what reads history later, off the receive loop). The analyzers make
no profile of their own: the cpu tables are made by the report from the
profile built here, with what the cpu analyzer measured. One builder, so two
views of the same window see the same numbers:

    session (+ history) --window, view, proflets?--> Profile --monitor.report.report_of--> report

A profile's type and its pure analyses live in :mod:`dyper.monitor.model.profile`.
Views: ``threads`` (the sampled stacks; the default) and ``tasks`` (asyncio
tasks' await chains, from the tasks proflet) of one process; given a
:class:`~dyper.monitor.services.Service` instead of a session, the service
view (its processes' stacks added up).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from dyper.agent.budget import slowdown
from dyper.monitor.model.frames import StackKey
from dyper.monitor.model.profile import Profile
from dyper.monitor.services import Service
from dyper.monitor.session import Session, Slice, merge_counts
from dyper.monitor.windows import WindowSpec
from dyper.proflets.tasks.analyzer import TasksAnalyzer

if TYPE_CHECKING:
    from dyper.monitor.history import History

View = Literal["threads", "tasks"]
#: the work that builds a profile, and whether it reads history (then run it off the receive loop)
ProfileJob = tuple[Callable[[], Profile], bool]


def build_profile(
    session: Session | Service,
    spec: WindowSpec | None = None,
    *,
    view: View = "threads",
    proflets: bool = False,
    history: History | None = None,
) -> Profile:
    """The profile of ``session`` over ``spec`` (None: the whole run); blocking (see :func:`profile_job`)."""
    build, _ = profile_job(session, spec, view=view, proflets=proflets, history=history)
    return build()


def profile_job(
    session: Session | Service,
    spec: WindowSpec | None = None,
    *,
    view: View = "threads",
    proflets: bool = False,
    history: History | None = None,
) -> ProfileJob:
    """The profile of ``session`` over ``spec``, as work to run, and whether that work reads history.

    What reads the session (its windows, its analyzers) runs now, on the
    caller's thread (the monitor's receive loop: sessions are not locked);
    the returned callable only reads ``history`` and the append-only frame
    table, so it may run on another thread. The whole run comes from the
    session's running totals, which already hold what history restored;
    a window older than the reports kept in memory is read from ``history``.

    ``proflets``: carry every analyzer's status, results and findings over
    the same window (:func:`proflet_sections`), as ``dyper report`` and the
    dashboard show them. ``view="tasks"`` raises ValueError when the process
    has shown no asyncio task. A :class:`~dyper.monitor.services.Service`
    gives the service view, from memory: its members' counts over the
    window added up, without the proflets' sections (they are per process).
    """
    spec = spec if spec is not None else WindowSpec()
    if isinstance(session, Service):
        if view != "threads":
            raise ValueError(f"a service has the thread view only, not {view!r}")
        merged = _service_profile(session, spec)
        return (lambda: merged), False
    start, end = spec.resolve(session.first_report_t, session.last_report_t or None)
    sections = proflet_sections(session, start, end) if proflets else {}
    if view == "tasks":
        profile = task_profile(session, start, end)
        profile.proflets = sections
        return (lambda: profile), False
    process = process_info(session)
    paths = session.paths
    threads = dict(session.threads)
    table = session.frames.frames
    if spec.whole:
        # Not slow: runs at once, on this thread, so the live totals need no copy.
        counts = session.counts
        process.update(duration_s=session.duration_s(), samples=session.samples, window_s=None)

        def whole() -> Profile:
            return Profile.from_counts(table, counts, threads, process, paths, sections)

        return whole, False
    memory = session.slice(start, end)
    oldest = session.oldest_in_memory
    older = (
        history is not None and oldest > 1 and (start is None or not session.windows or start < session.windows[0].t)
    )
    key = session.key

    def build() -> Profile:
        got = Slice()
        if older and history is not None:
            got = history.slice(key, start, end, before_n=oldest)
        got.merge(memory)
        info = dict(process)
        info.update(
            duration_s=got.seconds,
            samples=got.samples,
            window_s=got.seconds,
            window={
                "spec": spec.to_json(),
                "description": spec.describe(),
                "start": start,
                "end": end,
                "reports": got.reports,
                "first_report_t": got.first_t,
                "last_report_t": got.last_t,
            },
        )
        return Profile.from_counts(table, got.counts, threads, info, paths, sections)

    return build, older


def proflet_sections(session: Session, start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Status, findings and results of every analyzer of ``session``, for reports ending in (start, end].

    Where a proflet is not there, ``off`` says why, and it has no results,
    light or findings (off or not yet run is said, never shown as zeros): its
    collector does not run in the target ("not running": not among the
    proflets asked for, or switched off, with the reason), it has measured
    nothing yet ("no data yet, N s of M": N seconds into the run, M the delay
    the plan gives before its detailing), or its analyzer failed to load, to
    start or to answer (one broken analyzer must not take the report with it).
    A proflet with a basic analysis from the samples alone
    (``Analyzer.FROM_SAMPLES``) keeps its results with its collector off.
    """
    status: dict[str, Any] = {}
    results: dict[str, Any] = {}
    findings: list[str] = []
    off = proflets_off(session)
    for name, analyzer in session.analyzers.items():
        if name in off and not (analyzer.FROM_SAMPLES and off[name].startswith("not running")):
            continue
        try:
            results[name] = analyzer.results(start, end)
            status[name] = analyzer.status().to_json()
            findings.extend(analyzer.findings())
        except Exception as exc:
            off[name] = f"analyzer failed: {type(exc).__name__}: {exc}"
            results.pop(name, None)
            status.pop(name, None)
    return {"status": status, "results": results, "findings": findings, "off": off}


def proflets_off(session: Session) -> dict[str, str]:
    """Why each proflet of ``session`` that is not there is not: "not running: ...", "no data yet, N s of M", or
    its analyzer's failure (see :func:`proflet_sections`). Cheap: no analysis is run."""
    off: dict[str, str] = {}
    switched_off: dict[str, str] = {}
    running: set[str] = set()
    told = False  # an agent has said which proflets it runs
    elapsed_s = 0.0
    delays: dict[str, float] = {}
    for agent in session.agents.values():
        told = told or bool(agent.proflets)
        elapsed_s = max(elapsed_s, agent.elapsed_s)
        for name, state in agent.proflets.items():
            if isinstance(state, dict) and "off" in state:
                switched_off[name] = str(state["off"])
            else:
                running.add(name)
        for key, delay in agent.delays.items():
            if key.startswith("detail.") and isinstance(delay, int | float):
                delays[key[len("detail.") :]] = float(delay)
    for name, analyzer in session.analyzers.items():
        if name not in running and name in switched_off:
            off[name] = f"not running: {switched_off[name]}"
            continue
        try:
            if analyzer.has_data():
                continue
        except Exception as exc:
            off[name] = f"analyzer failed: {type(exc).__name__}: {exc}"
            continue
        # The agent lists the proflets that detail; one that only reports is
        # known to run by what it sent.
        if name not in running and told and not analyzer.FROM_SAMPLES:
            off[name] = "not running: not among the proflets asked for (--proflets, DYPER_PROFLETS)"
        else:
            off[name] = no_data_yet(elapsed_s, delays.get(name))
    for name, why in session.analyzers_off.items():
        off.setdefault(name, why)
    return off


def no_data_yet(elapsed_s: float, delay_s: float | None) -> str:
    """What a running proflet with nothing measured yet says: "no data yet, N s of M"."""
    if delay_s is None or delay_s <= 0:
        return f"no data yet, {elapsed_s:.0f} s into the run"
    late = " (waiting in the queue for the budget)" if elapsed_s > delay_s else ""
    return f"no data yet, {elapsed_s:.0f} s of {delay_s:.0f} before its first detailing{late}"


def _service_profile(service: Service, window: WindowSpec | None = None) -> Profile:
    """The service view: the members' counts over ``window`` (None: whole run) added up.

    A window is resolved against each member's own reports and read from
    memory (the last :data:`monitor.session.WINDOW_RETENTION_S`); older slices
    of single processes come from history through the per-process views.
    ``process`` describes the root process and adds ``service`` (the name),
    ``pids`` and ``processes`` (one row per member: pid, argv, samples,
    connected, overhead); ``samples`` covers all members.
    """
    counts: dict[StackKey, list[int]] = {}
    samples = 0
    seconds = 0.0
    threads: dict[int, str] = {}
    rows = []
    for m in service.members:
        if window is None or window.whole:
            c, n = m.counts, m.samples
            seconds = max(seconds, m.duration_s())
        else:
            got = m.slice(*window.resolve(m.first_report_t, m.last_report_t or None))
            c, n = got.counts, got.samples
            seconds = max(seconds, got.seconds)
        merge_counts(counts, c)  # new lists in ``counts``: the members' own are never aliased
        samples += n
        threads.update(m.threads)
        rows.append(
            {
                "pid": m.pid,
                "argv": list(m.hello.get("argv", [])),
                "samples": n,
                "connected": m.connected,
                "overhead": m.overhead(),
            }
        )
    root = service.root
    process = process_info(root)
    whole = window is None or window.whole
    process.update(
        service=service.name,
        pids=service.pids,
        processes=rows,
        samples=samples,
        duration_s=seconds,
        window_s=None if whole else seconds,
        # the members' overheads weighted by how long each ran
        overhead=_weighted_overhead(service.members),
    )
    if not whole and window is not None:
        process["window"] = {"spec": window.to_json(), "description": window.describe()}
    return Profile.from_counts(root.frames.frames, counts, threads, process, root.paths)


def task_profile(session: Session, start: float | None = None, end: float | None = None) -> Profile:
    """The task view of ``session`` for reports ending in (start, end]: asyncio tasks' await chains as stacks.

    Its "threads" are task names (numbered ones without their number), its
    counts milliseconds of task wall time (``cpu``: of running), so every
    export and the bottleneck search read it as they read the thread view.
    Raises ValueError when the process has shown no asyncio task.
    """
    analyzer = session.analyzers.get("tasks")
    if not isinstance(analyzer, TasksAnalyzer) or not analyzer.frames:
        raise ValueError(
            f"process {session.pid} has no task view: no asyncio tasks seen "
            "(the tasks proflet runs by default; was it left out of --proflets?)"
        )
    profile = analyzer.profile(start, end)
    process = process_info(session)
    process.update(
        view="tasks",
        unit="ms",
        duration_s=session.duration_s() if start is None and end is None else None,
        window={"start": start, "end": end},
    )
    profile.process = process
    profile.paths = session.paths
    return profile


#: Marks a profile carries (the newest).
MARKS_SHOWN = 200


def process_info(session: Session) -> dict[str, Any]:
    """What a profile says about its process (``duration_s``, ``samples`` and ``window_s`` are the caller's)."""
    hello = session.hello
    return {
        "pid": session.pid,
        "host": session.key[0],
        "start_time": session.key[2],
        "argv": list(hello.get("argv", [])),
        "python": hello.get("python", ""),
        "executable": hello.get("executable", ""),
        "cpus": hello.get("cpus"),
        "budget": session.budget(),
        "overhead": session.overhead(),
        # what the budgets in force allowed over the run (boosts and trigger events raise it); None: unknown
        "allowed": session.allowed(),
        # one-time start-up CPU seconds (loading the proflets), outside the budget
        "startup_s": sum(a.startup_s for a in session.agents.values()),
        # seconds spent per category over the run: sample, wake, report, detail
        "costs": dict(session.costs),
        "dropped": _sum_dropped(session),
        "paused": session.paused,
        # which stack sampler ran and why ({name, why}; None: the agent did not say)
        "sampler": session.sampler(),
        # the whole-run statistics start here (dyper reset, agent.reset); None: never reset
        "reset_t": session.reset_t,
        # [wall time, name, kind] of the newest marks (agent.mark, pause, resume, reset)
        "marks": [list(m) for m in list(session.marks)[-MARKS_SHOWN:]],
        # the newest trigger events (agent.triggers), each with its window and a normal one before it
        "triggers": list(session.triggers)[-MARKS_SHOWN:],
    }


def _sum_dropped(session: Session) -> dict[str, int]:
    total: dict[str, int] = {}
    for a in session.agents.values():
        for k, v in a.dropped.items():
            total[k] = total.get(k, 0) + v
    return total


def _weighted_overhead(members: list[Session]) -> float:
    spent = sum(a.spent_s for m in members for a in m.agents.values())
    elapsed = sum(a.elapsed_s for m in members for a in m.agents.values())
    return slowdown(spent, elapsed)
