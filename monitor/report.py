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

A report is a pure function of a profile (:func:`report_of`): the one
profile builder (:func:`dyper.monitor.profile.build_profile`, with
``proflets=True``) puts what the analyzers answered for the window into the
profile, and ``dyper report --json``, the dashboard's summary and a saved
profile all read the same report from it: one number, one name.

The cpu section is always made here, from the profile's stacks
(:func:`dyper.monitor.model.profile.cpu_functions`), with the call rates cpu
detailing measured where the cpu analyzer gave them; the cpu light, where no
analyzer gave one (a saved or a tag's profile), is the same busy share the
analyzer's is (:func:`dyper.monitor.model.lights.cpu_light`).
"""

from __future__ import annotations

from typing import Any

from dyper.monitor.model.profile import FLOOR_PCT, Profile, cpu_functions, cpu_status, line_table


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
        "sampler": p.get("sampler"),
        "reset_t": p.get("reset_t"),
        "marks": [{"t": m[0], "name": m[1], "kind": m[2]} for m in p.get("marks") or ()],
        "triggers": list(p.get("triggers") or ()),
    }
    if p.get("tag") is not None:
        # Only the samples inside functions with this tag (agent.tag): the tables are over them.
        process.update(tag=p["tag"], tag_samples=p.get("tag_samples"))
    sections = profile.proflets or {}
    results = dict(sections.get("results") or {})
    results["cpu"] = cpu_section(profile, results.get("cpu"))
    status = dict(sections.get("status") or {})
    if "cpu" not in status and p.get("view") != "tasks":
        status["cpu"] = cpu_status(profile).to_json()
    return {
        "process": process,
        "status": status,
        "findings": list(sections.get("findings") or []),
        "proflets": results,
        "off": dict(sections.get("off") or {}),
    }


def cpu_section(profile: Profile, analyzer: Any = None) -> dict[str, Any]:
    """The cpu proflet's section: its tables from the profile's stacks, with what the cpu analyzer measured.

    ``analyzer``: the cpu analyzer's results (``call_rates``, ``native``), or
    None. A profile saved before the tables were made here carries them
    (``functions``): those are kept as they were written.
    """
    if isinstance(analyzer, dict) and "functions" in analyzer and "call_rates" not in analyzer:
        return dict(analyzer)
    rates: dict[tuple[str, str, int], tuple[float, float | None]] = {}
    native: list[Any] = []
    if isinstance(analyzer, dict):
        native = list(analyzer.get("native") or [])
        for row in analyzer.get("call_rates") or ():
            try:
                key = (str(row["file"]), str(row["name"]), int(row["line"]))
                counted = row.get("counted_s")
                rates[key] = (float(row["calls_per_s"]), float(counted) if counted is not None else None)
            except (KeyError, TypeError, ValueError):
                continue  # a malformed row (a damaged saved profile) adds nothing
    return {
        "functions": cpu_functions(profile, rates, thread_clocks(profile)),
        "lines": line_table(profile, floor_pct=FLOOR_PCT),
        "native": native,
    }


def thread_clocks(profile: Profile) -> dict[int, float]:
    """Each thread's CPU seconds over the profile's span, as the threads (or else the timing) proflet read its clock."""
    results = (profile.proflets or {}).get("results") or {}
    for name, column in (("threads", "run_s"), ("timing", "cpu_s")):
        section = results.get(name)
        rows = section.get("threads") if isinstance(section, dict) else None
        if not rows or (name == "threads" and any(r.get("gil_pct") is None for r in rows if isinstance(r, dict))):
            continue  # no clocks: the threads proflet ran in the monitor only
        clocks: dict[int, float] = {}
        for row in rows:
            try:
                clocks[int(row["ident"])] = float(row[column])
            except (KeyError, TypeError, ValueError):
                continue  # a malformed row (a damaged saved profile) adds nothing
        if clocks:
            return clocks
    return {}
