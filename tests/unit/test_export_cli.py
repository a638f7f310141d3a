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
from tests.factories import STACKS, check_speedscope_schema, expected, html_data, make_report, session_with


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
        check_speedscope_schema(doc)
        assert sum(sum(p["weights"]) for p in doc["profiles"]) == total
    elif name.endswith(".collapsed"):
        assert sum(int(line.rsplit(" ", 1)[1]) for line in data.decode().splitlines()) == total
    elif name.endswith(".html"):
        assert html_data(data.decode())["tree"][2] == total
    else:
        assert expected(Profile.load(out), "wall") == expected(Profile.load(saved), "wall")
