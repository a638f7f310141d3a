"""``dyper report``'s content: every proflet's results for a process, as data.

The report (its JSON form is documented in the README, "dyper report"):

    {"process": {"pid", "host", "argv", "python", "cpus", "budget", "overhead", "allowed", "duration_s", "samples",
                 "paused", "reset_t", "marks": [{"t", "name", "kind"}],
                 "triggers": [{"id", "t", "name", "kind", "why", "before_s", "after_s", "budget", "window", "normal"}]},
     "status": {"<proflet>": {"problem", "confidence"}},
     "findings": ["...plain words..."],
     "proflets": {"<proflet>": {...its results...}},
     "off": {"<proflet>": "why it did not run"}}

Percentages are 0-100 (``budget`` and ``overhead`` too); shares of
confidence and problem are 0-1, as DYPER's lights.

From a live session the analyzers answer; a saved profile carries what they
answered when it was written (:attr:`monitor.profile.Profile.proflets`),
and the cpu section is recomputed from its stacks where it has none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dyper.proflets.cpu import FLOOR_PCT, function_table, line_table

if TYPE_CHECKING:
    from dyper.monitor.profile import Profile
    from dyper.monitor.session import Session


def proflet_sections(session: Session, start: float | None = None, end: float | None = None) -> dict[str, Any]:
    """Status, findings and results of every analyzer of ``session``, for reports ending in (start, end]."""
    status: dict[str, Any] = {}
    results: dict[str, Any] = {}
    findings: list[str] = []
    errors: dict[str, str] = {}
    for name, analyzer in session.analyzers.items():
        try:
            results[name] = analyzer.results(start, end)
            status[name] = analyzer.status().to_json()
            findings.extend(analyzer.findings())
        except Exception as exc:  # one broken analyzer must not take the report with it
            errors[name] = f"analyzer failed: {type(exc).__name__}: {exc}"
    off: dict[str, str] = {}
    for agent in session.agents.values():
        for name, state in agent.proflets.items():
            if isinstance(state, dict) and "off" in state:
                off[name] = str(state["off"])
    from dyper.monitor.session import ANALYZERS_OFF

    off.update(ANALYZERS_OFF)
    off.update(errors)
    return {"status": status, "results": results, "findings": findings, "off": off}


def build_report(session: Session, window_s: float | None = None) -> dict[str, Any]:
    """The report of a live (or remembered) session: the whole run, or its last ``window_s`` seconds."""
    from dyper.monitor.profile import Profile

    profile = Profile.from_session(session, window_s)
    return report_of(profile)


def report_of(profile: Profile) -> dict[str, Any]:
    """The report a profile carries (or, for the cpu section, implies)."""
    p = profile.process
    process = {
        "pid": p.get("pid"),
        "host": p.get("host"),
        "argv": p.get("argv", []),
        "python": p.get("python", ""),
        "cpus": p.get("cpus"),
        "budget": 100.0 * float(p.get("budget") or 0.0),
        "overhead": 100.0 * float(p.get("overhead") or 0.0),
        "allowed": 100.0 * float(p["allowed"]) if p.get("allowed") is not None else None,
        "duration_s": p.get("duration_s"),
        "samples": p.get("samples"),
        "paused": bool(p.get("paused")),
        "reset_t": p.get("reset_t"),
        "marks": [{"t": m[0], "name": m[1], "kind": m[2]} for m in p.get("marks") or ()],
        "triggers": list(p.get("triggers") or ()),
    }
    if p.get("tag") is not None:
        # Only the samples inside functions with this tag (agent.tag): the tables are over them.
        process.update(tag=p["tag"], tag_samples=p.get("tag_samples"))
    sections = profile.proflets or {}
    results = dict(sections.get("results") or {})
    if "cpu" not in results:
        results["cpu"] = {
            "functions": [
                dict(row, calls=None, calls_per_s=None) for row in function_table(profile, floor_pct=FLOOR_PCT)
            ],
            "lines": line_table(profile, floor_pct=FLOOR_PCT),
        }
    return {
        "process": process,
        "status": dict(sections.get("status") or {}),
        "findings": list(sections.get("findings") or []),
        "proflets": results,
        "off": dict(sections.get("off") or {}),
    }
