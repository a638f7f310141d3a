"""`dyper export`'s options and mistakes, one of which asks a monitor that is not there (moved from
tests/unit/test_export_cli.py: it opens a ZeroMQ socket)."""

import pytest

from dyper.monitor.cli import main
from dyper.monitor.exports import OwnJson
from dyper.monitor.profile import build_profile
from tests.factories import STACKS, make_report, session_with


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "prof.json"
    OwnJson().write(build_profile(session_with(make_report(STACKS))), path)
    return path


def test_export_options_and_mistakes(saved, tmp_path, capfd, monkeypatch):
    from dyper.monitor.commands import export

    monkeypatch.setattr(export, "PING_TIMEOUT_S", 0.3)
    assert main(["export", str(saved), "-o", "-", "--format", "collapsed", "--metric", "wall", "--libraries"]) == 0
    lines = capfd.readouterr().out.splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == 112 and not any("dumps" in x for x in lines)

    def error(*args):
        code = main(["export", *args])
        err = capfd.readouterr().err
        assert err.count("\n") == 1, err  # one line
        return code, err

    assert error(str(saved), "-o", str(tmp_path / "x.svg")) == (
        2,
        f"dyper export: error: cannot tell the format of '{tmp_path / 'x.svg'}' from its name: end it with one of "
        ".speedscope.json, .pb.gz, .html, .collapsed, .json, or give --format\n",
    )
    code, err = error(str(saved), "--last", "60", "-o", str(tmp_path / "x.html"))
    assert code == 2 and "need a PID" in err
    code, err = error(str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.html"))
    assert code == 1 and "no such file" in err
    code, err = error(str(saved), "-o", "-")
    assert code == 2 and "give --format" in err
    empty = tmp_path / "empty.json"
    OwnJson().write(build_profile(session_with(make_report([(8, 5, [3])]))), empty)  # blocked: no cpu
    code, err = error(str(empty), "-o", str(tmp_path / "x.html"))
    assert code == 1 and "no cpu samples" in err and not (tmp_path / "x.html").exists()
    code, err = error("999999", "--monitor", "tcp://127.0.0.1:1", "-o", str(tmp_path / "x.html"))
    assert code == 1 and "no dyper monitor answers" in err
    with pytest.raises(SystemExit):
        main(["export", str(saved), "-o", "x.html", "--window", "soon"])
