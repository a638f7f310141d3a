"""The BOTTLENECKS search tool (seed 000, section 2.3) on the paper's Figure 2 tree.

a,1
+-- b,2
|   +-- c,5
|       +-- d,30
|       +-- e,52
+-- c,10
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from dyper.monitor.cli import main
from dyper.monitor.search import CallTreeProfile, ComparativeProfile
from dyper.monitor.search.repl import SearchSession, prompt_loop, render, short_name, split_script

FIGURE_2 = "a 1\na;b 2\na;b;c 5\na;b;c;d 30\na;b;c;e 52\na;c 10\n"


@pytest.fixture
def session() -> SearchSession[Any]:
    return SearchSession(CallTreeProfile.from_collapsed(FIGURE_2), {"source": "fig2"})


def run(s: SearchSession[Any], command: str) -> dict[str, Any]:
    result = s.execute(command)
    assert result["ok"], result
    render(result)  # every result renders
    return result


def nearby(result: dict[str, Any]) -> list[tuple[str, str, int]]:
    return [(r["relation"], ";".join(r["path"]), r["cum"]) for r in result["nearby"]]


def test_suggest_numbers_the_suggestions(session: SearchSession[Any]) -> None:
    r = run(session, "suggest")
    assert r["kind"] == "suggestions" and r["suggester"] == "highcum" and r["total"] == 100
    assert [(x["n"], x["path"], x["cum"]) for x in r["summaries"]] == [
        (0, ["a"], 100),
        (1, ["c"], 97),
        (2, ["b"], 89),
        (3, ["e"], 52),
        (4, ["d"], 30),
    ]
    run(session, "suggester highbase")
    r = run(session, "suggest 3")
    assert [(x["path"], x["base"], x["base_pct"]) for x in r["summaries"]] == [
        (["e"], 52, 52.0),
        (["d"], 30, 30.0),
        (["c"], 15, 15.0),
    ]
    assert run(session, "set suggester spread")["settings"]["suggester"] == "spread"
    assert session.execute("suggester fastest") == {
        "command": "suggester fastest",
        "ok": False,
        "error": "no suggester 'fastest': choose highcum, highbase, spread",
    }


def test_select_describes_the_summary_and_numbers_its_neighbours(session: SearchSession[Any]) -> None:
    run(session, "suggest")
    r = run(session, "select 1")
    assert r["kind"] == "summary"
    assert r["current"] == {
        "path": ["c"],
        "base": 15,
        "cum": 97,
        "base_pct": 15.0,
        "cum_pct": 97.0,
        "labels": [],
    }
    assert r["overlaps"] == []
    # Zoomed (the default): both callers are needed to reach 95% of 97; no prefix of the
    # callees does (10 of c's cost has no callee), so all are listed.
    assert nearby(r) == [("top", "b;c", 89), ("top", "a;c", 11), ("bottom", "c;e", 57), ("bottom", "c;d", 35)]
    assert [x["n"] for x in r["nearby"]] == [0, 1, 2, 3]
    # select N now refers to this listing
    r = run(session, "select 3")
    assert r["current"]["path"] == ["c", "d"]
    # The paper's worked example: from [c; d] zooming goes to [a; b; c; d], not [b; c; d].
    assert nearby(r) == [("top", "a;b;c;d", 38), ("trim_top", "d", 30), ("trim_bottom", "c", 97)]
    assert r["nearby"][0]["added"] == 2
    run(session, "zoom off")
    r = run(session, "show")
    assert nearby(r) == [("top", "b;c;d", 37), ("trim_top", "d", 30), ("trim_bottom", "c", 97)]


def test_direction_and_cutoff(session: SearchSession[Any]) -> None:
    assert run(session, "bottom")["kind"] == "settings"  # no current summary yet
    run(session, "suggest")
    r = run(session, "select 1")
    assert {x["relation"] for x in r["nearby"]} == {"bottom"}
    r = run(session, "top")
    assert nearby(r) == [("top", "b;c", 89), ("top", "a;c", 11)]
    # A lower cutoff: [b; c] alone (89) reaches 0.9 * 97, and zooming goes through it to [a; b; c].
    run(session, "cutoff 0.9")
    assert nearby(run(session, "show")) == [("top", "a;b;c", 90)]
    for bad in ("cutoff 0", "cutoff -1", "cutoff x", "zoom maybe"):
        assert not session.execute(bad)["ok"]
    assert run(session, "both")["kind"] == "summary"
    assert session.settings() == {"suggester": "highcum", "zoom": True, "cutoff": 0.9, "direction": "both"}


def test_labels_and_overlap(session: SearchSession[Any]) -> None:
    run(session, "suggest")
    run(session, "select 0")  # [a]
    assert run(session, "label ac") == {
        "command": "label ac",
        "ok": True,
        "kind": "label",
        "label": "ac",
        "path": ["a"],
        "count": 1,
    }
    run(session, "suggest")
    run(session, "select 1")  # [c]
    run(session, "label ac")
    run(session, "select 2")  # [c; e] among c's neighbours
    run(session, "label e-path")
    # The paper's total over S = {[a], [c]}: base 16, cum 100.
    r = run(session, "labels")
    assert [(x["label"], x["total_base"], x["total_cum"]) for x in r["labels"]] == [("ac", 16, 100), ("e-path", 57, 57)]
    assert [(s["n"], s["path"]) for x in r["labels"] for s in x["summaries"]] == [
        (0, ["a"]),
        (1, ["c"]),
        (2, ["c", "e"]),
    ]
    # [b] overlaps both labels in cum (everything under b is under a, c and e are below it), in base neither.
    run(session, "suggest")
    r = run(session, "select 2")
    assert r["current"]["path"] == ["b"]
    assert r["overlaps"] == [
        {"label": "ac", "cum_overlap": 89, "cum_overlap_pct": 100.0, "base_overlap": 0, "base_overlap_pct": 0.0},
        {
            "label": "e-path",
            "cum_overlap": 57,
            "cum_overlap_pct": round(100 * 57 / 89, 3),
            "base_overlap": 0,
            "base_overlap_pct": 0.0,
        },
    ]
    # select on the labels listing; a labelled summary says so
    run(session, "labels")
    r = run(session, "select 2")
    assert r["current"]["labels"] == ["e-path"]
    assert r["overlaps"][1]["cum_overlap"] == 57 and r["overlaps"][1]["cum_overlap_pct"] == 100.0


def test_extend_trim_back(session: SearchSession[Any]) -> None:
    assert session.execute("trim top")["error"] == "no current summary: suggest, then select N"
    run(session, "suggest")
    run(session, "select 1")  # [c]
    assert run(session, "extend top b")["current"]["path"] == ["b", "c"]
    assert run(session, "extend bottom e")["current"]["path"] == ["b", "c", "e"]
    assert not session.execute("extend bottom zz")["ok"]
    assert run(session, "trim top")["current"]["path"] == ["c", "e"]
    assert run(session, "trim bottom")["current"]["path"] == ["c"]
    assert not session.execute("trim top")["ok"]  # one function: nothing to trim
    r = run(session, "extend 0")  # the first listed extension
    assert r["current"]["path"] == ["b", "c"]
    trims = [x["n"] for x in r["nearby"] if x["relation"].startswith("trim")]
    assert session.execute(f"extend {trims[0]}")["error"].startswith(f"summary {trims[0]} is not an extension")
    assert [run(session, "back")["current"]["path"] for _ in range(5)] == [
        ["c"],
        ["c", "e"],
        ["b", "c", "e"],
        ["b", "c"],
        ["c"],
    ]
    assert session.execute("back")["error"] == "nothing to go back to"


def test_errors_leave_the_session_as_it_was(session: SearchSession[Any]) -> None:
    assert session.execute("select 0")["error"] == "no numbered summaries yet: suggest first"
    run(session, "suggest 2")
    assert session.execute("select 2")["error"] == "no summary numbered 2: the last listing has 0..1"
    assert session.execute("select x")["error"] == "'x' is not a summary number"
    assert session.execute("frobnicate")["error"] == "unknown command 'frobnicate': try help"
    assert session.execute("label 'unclosed")["error"].startswith("cannot parse the command")
    assert session.execute("suggest 0")["error"] == "ask for at least 1 suggestion"
    assert session.current is None
    assert run(session, "help")["commands"][0]["usage"] == "suggester NAME"


def test_save_and_load_round_trip(session: SearchSession[Any], tmp_path: Path) -> None:
    run(session, "suggester highbase")
    run(session, "zoom off")
    run(session, "cutoff 0.8")
    run(session, "suggest")
    run(session, "select 0")  # [e]
    run(session, "label hot")
    run(session, "select 0")  # its caller [c; e]
    run(session, "label hot")
    run(session, "label path")
    before = run(session, "show")
    file = tmp_path / "session.json"
    assert run(session, f"save {file}") == {"command": f"save {file}", "ok": True, "kind": "saved", "file": str(file)}
    saved = json.loads(file.read_text())
    assert saved["source"] == {"source": "fig2"}
    assert saved["current"] == ["c", "e"] and saved["trail"] == [["e"]]
    assert saved["labels"] == {"hot": [["e"], ["c", "e"]], "path": [["c", "e"]]}
    assert saved["settings"] == {"suggester": "highbase", "zoom": False, "cutoff": 0.8, "direction": "both"}

    fresh: SearchSession[Any] = SearchSession(CallTreeProfile.from_collapsed(FIGURE_2), {"source": "fig2"})
    loaded = run(fresh, f"load {file}")
    assert loaded["warnings"] == [] and loaded["current"] == ["c", "e"]
    assert loaded["labels"] == {"hot": [["e"], ["c", "e"]], "path": [["c", "e"]]}
    assert fresh.settings() == session.settings()
    after = run(fresh, "show")
    assert {k: v for k, v in after.items() if k != "command"} == {k: v for k, v in before.items() if k != "command"}
    assert run(fresh, "back")["current"]["path"] == ["e"]

    # On another profile: what it lacks is dropped, with warnings.
    other: SearchSession[Any] = SearchSession(CallTreeProfile.from_collapsed("a;b;c;e 5\n"), {"source": "other"})
    loaded = run(other, f"load {file}")
    assert loaded["current"] == ["c", "e"] and loaded["labels"] == {"hot": [["e"], ["c", "e"]], "path": [["c", "e"]]}
    assert loaded["warnings"] == ["the session was saved on another source (fig2)"]
    small: SearchSession[Any] = SearchSession(CallTreeProfile.from_collapsed("a;b 5\n"), {"source": "fig2"})
    loaded = run(small, f"load {file}")
    assert loaded["current"] is None and loaded["labels"] == {}
    assert "current summary: the path c > e does not occur in this profile" in loaded["warnings"]
    (tmp_path / "junk.json").write_text('{"format": "speedscope"}')
    assert "not a saved search session" in fresh.execute(f"load {tmp_path / 'junk.json'}")["error"]
    assert not fresh.execute(f"load {tmp_path / 'missing.json'}")["ok"]


def test_comparative_session() -> None:
    a = CallTreeProfile.from_collapsed(FIGURE_2)
    b = CallTreeProfile.from_collapsed(FIGURE_2.replace("e 52", "e 12"))
    s: SearchSession[Any] = SearchSession(ComparativeProfile(a, b))
    r = run(s, "suggest 1")
    assert r["total"] == 40
    assert r["summaries"][0]["path"] == ["a"] and r["summaries"][0]["cum_pct"] == 100.0
    r = run(s, "select 0")
    # zooming goes down to where the difference is
    assert [(x["relation"], x["path"], x["cum"]) for x in r["nearby"]] == [("bottom", ["a", "b", "c", "e"], 40)]


def test_script_splitting_and_quit(session: SearchSession[Any]) -> None:
    assert split_script("suggest; select 0\n# a comment\nlabel hot;;") == ["suggest", "select 0", "label hot"]
    results = session.run_script("suggest 1; quit; select 0")
    assert [r["kind"] for r in results] == ["suggestions", "quit"]
    assert session.finished


def test_prompt_loop(session: SearchSession[Any]) -> None:
    lines: Iterator[str] = iter(["suggest 2", "select 0; label top", "", "bogus"])

    def read(prompt: str) -> str:
        assert prompt == "bottlenecks> "
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    out = io.StringIO()
    results = prompt_loop(session, Console(file=out, width=120), read=read)
    assert [r["command"] for r in results] == ["suggest 2", "select 0", "label top", "bogus"]
    text = out.getvalue()
    assert "highcum: starting summaries" in text and "labelled a as 'top'" in text
    assert "error: unknown command 'bogus'" in text


def test_short_name() -> None:
    assert short_name("work (/srv/app/app.py:12)") == "work (app.py:12)"
    assert short_name("work (/srv/app/app.py)") == "work (app.py)"
    assert short_name("app.py:work:12") == "app.py:work:12"


def test_command_runs_commands_and_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fig2 = tmp_path / "fig2.collapsed"
    fig2.write_text(FIGURE_2)
    assert main(["bottlenecks", str(fig2), "-c", "suggest; select 0; label hot", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert [r["command"] for r in results] == ["suggest", "select 0", "label hot"]
    assert results[1]["current"]["path"] == ["a"] and results[1]["current"]["cum"] == 100
    assert results[2] == {
        "command": "label hot",
        "ok": True,
        "kind": "label",
        "label": "hot",
        "path": ["a"],
        "count": 1,
    }

    # A failing command: the others still run, and the exit code says so.
    assert main(["bottlenecks", str(fig2), "-c", "select 7; suggest 1", "--json"]) == 1
    results = json.loads(capsys.readouterr().out)
    assert [r["ok"] for r in results] == [False, True]

    # Human output; --compare searches the difference.
    base = tmp_path / "base.collapsed"
    base.write_text(FIGURE_2.replace("e 52", "e 12"))
    assert main(["bottlenecks", str(fig2), "--compare", str(base), "--raw", "-c", "suggest 1; select 0"]) == 0
    out = capsys.readouterr().out
    assert "total 40" in out and "a > b > c > e" in out

    assert main(["bottlenecks", str(tmp_path / "missing"), "-c", "suggest"]) == 1
    assert "no such file" in capsys.readouterr().err
