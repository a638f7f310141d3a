"""Which stack sampler ran, and why, reaches dyper report (text and JSON), dyper top and the dashboard's data."""

from __future__ import annotations

import io

from rich.console import Console

from dyper.monitor.commands.report import render
from dyper.monitor.profile import build_profile
from dyper.monitor.report import report_of
from dyper.monitor.views import render_top, session_info, top_view
from tests.factories import make_report, session_with

NATIVE = {"name": "native", "why": "DYPER_SAMPLER=native"}


def _text(renderable: object) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(renderable)
    return out.getvalue()


def test_the_reported_sampler_is_in_the_report_top_and_the_dashboards_session() -> None:
    session = session_with(dict(make_report([(7, 3, [1, 0])]), sampler=NATIVE))
    report = report_of(build_profile(session, proflets=True))
    assert report["process"]["sampler"] == NATIVE
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    assert "stacks sampled by the native sampler (DYPER_SAMPLER=native)" in out.getvalue()
    assert session_info(session)["sampler"] == NATIVE  # what the dashboard's summary reads
    assert "sampler native" in _text(render_top(top_view(session)))


def test_an_agent_that_does_not_say_is_shown_as_unknown_not_as_one_sampler() -> None:
    session = session_with(make_report([(7, 3, [1, 0])]))
    report = report_of(build_profile(session, proflets=True))
    assert report["process"]["sampler"] is None
    out = io.StringIO()
    render(report, Console(file=out, width=200, color_system=None))
    assert "stacks sampled by the unknown sampler" in out.getvalue()
    assert "sampler unknown" in _text(render_top(top_view(session)))


def test_the_newest_report_says_which_sampler_runs() -> None:
    gil = {"name": "gil", "why": "no native sampler for this interpreter"}
    session = session_with(
        dict(make_report([(7, 3, [1, 0])]), sampler=gil), dict(make_report([(7, 3, [1, 0])], seq=1), sampler=NATIVE)
    )
    assert session.sampler() == NATIVE


def test_dyper_run_s_closing_summary_names_the_sampler_from_the_profile() -> None:
    from dyper.monitor.embedded import Options, summary_view

    session = session_with(dict(make_report([(7, 3, [1, 0])]), sampler=NATIVE))
    view = summary_view(build_profile(session), Options())
    assert "sampler native" in _text(render_top(view))  # it said "sampler unknown" whatever ran
