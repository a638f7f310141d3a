import json

import pytest

from dyper.monitor.exports import Collapsed, OwnJson, Speedscope, exporter_for
from dyper.monitor.model.profile import Profile
from dyper.monitor.profile import build_profile
from dyper.monitor.session import UnknownLocation
from dyper.monitor.windows import WindowSpec
from tests.factories import make_report, session_with


def test_functions_self_and_total_and_blocking_excluded_from_cpu():
    s = session_with(make_report([(7, 30, [1, 0]), (7, 10, [2, 1, 0]), (8, 60, [3])]))
    p = build_profile(s)
    assert p.total("wall") == 100 and p.total("cpu") == 40
    rows = {r["name"]: r for r in p.functions("cpu")}
    assert rows["f"]["self"] == 30 and rows["f"]["total"] == 40
    assert rows["g"]["self_pct"] == pytest.approx(25.0)
    assert rows["main"]["total_pct"] == pytest.approx(100.0)
    wall = {r["name"]: r for r in p.functions("wall")}
    assert wall["main"]["self"] == 60  # the sleeping thread counts in wall time only


def test_recursion_is_counted_once_in_total():
    s = session_with(make_report([(7, 10, [5, 5, 5, 0])]))
    rows = {r["name"]: r for r in build_profile(s).functions("cpu")}
    assert rows["r"]["total"] == 10 and rows["r"]["self"] == 10


def test_lines_and_floor():
    s = session_with(make_report([(7, 995, [1, 0]), (7, 4, [2, 0]), (7, 1, [0])]))
    p = build_profile(s)
    lines = {(r["name"], r["line"]) for r in p.lines("cpu", floor_pct=0.5)}
    assert ("f", 11) in lines and ("g", 21) not in lines  # 0.4% is under the floor


def test_library_time_charged_to_calling_app_line():
    s = session_with(make_report([(7, 10, [4, 1, 0])]))
    p = build_profile(s)
    plain = {r["name"]: r["self"] for r in p.functions("cpu")}
    charged = {r["name"]: r["self"] for r in p.functions("cpu", charge_libraries=True)}
    assert plain == {"dumps": 10, "f": 0, "main": 0}
    assert charged == {"f": 10, "main": 0}


def test_unknown_location_changes_nothing():
    s = session_with()
    state = s.agents["h:1:x"]
    with pytest.raises(UnknownLocation):
        s.ingest(state, make_report([(7, 5, [1, 0])], with_tables=False))
    assert s.counts == {} and s.samples == 0


def test_time_windows():
    s = session_with(make_report([(7, 10, [1, 0])], t=1000.0), make_report([(7, 5, [2, 0])], seq=1, t=1030.0))
    recent = build_profile(s, WindowSpec.last(10.0))
    assert {r["name"] for r in recent.functions("cpu") if r["self"]} == {"g"}
    assert build_profile(s).total("cpu") == 15


def test_tree_totals():
    s = session_with(make_report([(7, 30, [1, 0]), (7, 10, [2, 1, 0])]))
    root = build_profile(s).tree("cpu")
    (main,) = root.children.values()
    (f,) = main.children.values()
    assert (root.total, main.total, f.total, f.self) == (40, 40, 40, 30)


def test_exports(tmp_path):
    s = session_with(make_report([(7, 30, [1, 0]), (7, 10, [2, 1, 0]), (8, 60, [3])]))
    p = build_profile(s)
    folded = Collapsed().render(p).splitlines()
    assert "main (/app/app.py:2);f (/app/app.py:11) 30" in folded
    assert "main (/app/app.py:2);f (/app/app.py:11);g (/app/app.py:21) 10" in folded
    assert sum(int(line.rsplit(" ", 1)[1]) for line in folded) == 40
    assert sum(int(x.rsplit(" ", 1)[1]) for x in Collapsed("wall").render(p).splitlines()) == 100

    doc = json.loads(Speedscope("wall").render(p))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    names = [f["name"] for f in doc["shared"]["frames"]]
    for prof in doc["profiles"]:
        assert prof["type"] == "sampled" and len(prof["samples"]) == len(prof["weights"])
        assert all(0 <= i < len(names) for sample in prof["samples"] for i in sample)
    assert sum(sum(pr["weights"]) for pr in doc["profiles"]) == 100

    path = tmp_path / "p.json"
    OwnJson().write(p, path)
    back = Profile.load(path)
    assert back.functions("cpu") == p.functions("cpu") and back.process["pid"] == 1
    assert isinstance(exporter_for("x.speedscope.json"), Speedscope)
    assert isinstance(exporter_for("x.json"), OwnJson)
    with pytest.raises(ValueError, match="end it with"):
        exporter_for("x.txt")


@pytest.mark.parametrize(
    "doc",
    [
        {},
        {"format": "dyper-profile", "version": 7},
        {"format": "dyper-profile", "version": 1, "frames": [], "stacks": [[1, 1, 1, [3]]]},
    ],
)
def test_bad_saved_profiles_are_refused(tmp_path, doc):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError):
        Profile.load(path)


def test_call_rates_divide_by_the_application_time_a_burst_covered():
    # A burst that slowed the application (yappi's slow path on 3.11) counts
    # fewer calls for its length; the agent says how much of the application's
    # time the counts cover, and the rate divides by that.
    report = make_report([(7, 3, [1, 0])])
    report["details"] = [
        {"proflet": "cpu", "t": 1000.0, "length_s": 2.0, "slowdown_s": 1.0, "counted_s": 1.0,
         "functions": [["/app/app.py", "f", 10, 100]], "lines": [], "lines_counted": False},
        # from an agent that does not say, or says something impossible: the length stands
        {"proflet": "cpu", "t": 1000.0, "length_s": 1.0, "slowdown_s": 0.0,
         "functions": [["/app/app.py", "g", 20, 30]], "lines": [], "lines_counted": False},
        {"proflet": "cpu", "t": 1000.0, "length_s": 1.0, "slowdown_s": 0.0, "counted_s": 5.0,
         "functions": [["/app/app.py", "g", 20, 30]], "lines": [], "lines_counted": False},
        # a function's own figure (3.11: per calling thread) comes before the burst's
        {"proflet": "cpu", "t": 1000.0, "length_s": 2.0, "slowdown_s": 1.0, "counted_s": 1.0,
         "functions": [["/app/app.py", "r", 30, 50, 0.5], ["/app/app.py", "main", 1, 10, 9.0]],
         "lines": [], "lines_counted": False},
    ]  # fmt: skip
    rates = session_with(report).calls_per_s()
    assert rates[("/app/app.py", "f", 10)] == pytest.approx(100.0)
    assert rates[("/app/app.py", "g", 20)] == pytest.approx(30.0)
    assert rates[("/app/app.py", "r", 30)] == pytest.approx(100.0)
    assert rates[("/app/app.py", "main", 1)] == pytest.approx(10.0)  # more than the length: the burst's figure
