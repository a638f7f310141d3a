"""`dyper export` of a saved profile, in-process (the PID and window paths run against a real monitor in
tests/integration/test_history_export.py)."""

import gzip
import json

import pytest

from dyper.monitor.cli import main
from dyper.monitor.exports import OwnJson
from dyper.monitor.model.profile import Profile
from dyper.monitor.pprof import profile_pb2
from dyper.monitor.profile import build_profile
from tests.unit.test_exports import STACKS, _check_speedscope_schema, _html_data, expected
from tests.unit.test_session_profile import make_report, session_with


@pytest.fixture
def saved(tmp_path):
    path = tmp_path / "prof.json"
    OwnJson().write(build_profile(session_with(make_report(STACKS))), path)
    return path


@pytest.mark.parametrize(
    ("name", "fmt", "written"),
    [
        ("p.speedscope.json", None, "speedscope"),
        ("p.pb.gz", None, "pprof"),
        ("p.collapsed", None, "collapsed"),
        ("p.html", None, "html"),
        ("p.json", None, "json"),
        ("p.bin", "pprof", "pprof"),
        ("p.txt", "speedscope", "speedscope"),
    ],
)
def test_export_a_saved_profile(saved, tmp_path, capsys, name, fmt, written):
    out = tmp_path / name
    assert main(["export", str(saved), "-o", str(out), *(["--format", fmt] if fmt else [])]) == 0
    total = Profile.load(saved).total("cpu")
    said = f"dyper export: wrote {out} ({written}, {total} cpu samples; {saved})\n"
    assert capsys.readouterr().err == said
    data = out.read_bytes()
    if fmt == "pprof" or name.endswith(".pb.gz"):
        prof = profile_pb2.Profile.FromString(gzip.decompress(data))
        assert sum(s.value[0] for s in prof.sample) == total
    elif fmt == "speedscope" or name.endswith(".speedscope.json"):
        doc = json.loads(data)
        _check_speedscope_schema(doc)
        assert sum(sum(p["weights"]) for p in doc["profiles"]) == total
    elif name.endswith(".collapsed"):
        assert sum(int(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()) == total
    elif name.endswith(".html"):
        assert _html_data(data.decode())["tree"][2] == total
    else:
        assert expected(Profile.load(out), "wall") == expected(Profile.load(saved), "wall")


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
