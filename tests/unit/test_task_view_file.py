"""`dyper export FILE --view tasks` and `dyper bottlenecks FILE --view tasks`: the task view a saved profile carries."""

import json
from pathlib import Path

import pytest

from dyper.monitor.cli import main
from dyper.monitor.embedded import TASK_VIEW
from dyper.monitor.model.frames import Frame
from dyper.monitor.model.profile import Profile, StackCount

APP = "/srv/app.py"


def _saved(tmp_path: Path, with_tasks: bool = True) -> Path:
    frames = [Frame(APP, "main", 1, 2), Frame(APP, "handler", 10, 12), Frame(APP, "work", 20, 21)]
    threads = Profile(frames, [StackCount(1, (0, 2), 50, 50)], {1: "MainThread"})
    # The task view: handler waits 900 ms (wall only), work runs 100 ms.
    tasks = Profile(frames, [StackCount(0, (1,), 900, 0), StackCount(1, (2,), 100, 100)], {0: "task a", 1: "task b"})
    if with_tasks:
        threads.proflets = {TASK_VIEW: tasks.to_json()}
    path = tmp_path / "prof.json"
    path.write_text(json.dumps(threads.to_json()))
    return path


def test_export_reads_the_task_view_with_the_wall_metric(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    assert main(["export", str(saved), "--view", "tasks", "-o", "-", "--format", "collapsed"]) == 0
    lines = sorted(capsys.readouterr().out.split("\n"))
    # wall by default: the waiting handler is there
    assert "handler (/srv/app.py:12) 900" in lines and "work (/srv/app.py:21) 100" in lines
    assert main(["export", str(saved), "--view", "tasks", "--metric", "cpu", "-o", "-", "--format", "collapsed"]) == 0
    assert "handler" not in capsys.readouterr().out
    # The thread view is still the default, with cpu.
    assert main(["export", str(saved), "-o", "-", "--format", "collapsed"]) == 0
    assert capsys.readouterr().out.strip() == "main (/srv/app.py:2);work (/srv/app.py:21) 50"


def test_bottlenecks_reads_the_task_view(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path)
    assert main(["bottlenecks", str(saved), "--view", "tasks", "-c", "suggest 1", "--json"]) == 0
    [result] = json.loads(capsys.readouterr().out)
    assert result["total"] == 1000 and result["summaries"][0]["path"] == ["handler (/srv/app.py)"]


def test_a_profile_without_a_task_view_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = _saved(tmp_path, with_tasks=False)
    assert main(["export", str(saved), "--view", "tasks", "-o", "-", "--format", "collapsed"]) == 2
    assert "carries no task view" in capsys.readouterr().err
