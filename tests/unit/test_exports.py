"""Every export format read back: the same stacks and counts as the profile, in each format's own terms."""

import json
import re
from collections import Counter

import pytest

from dyper.monitor.exports import (
    EXPORTERS,
    Collapsed,
    FlameGraphHtml,
    OwnJson,
    Pprof,
    Speedscope,
    exporter_for,
    exporter_named,
)
from dyper.monitor.model.profile import Profile
from dyper.monitor.profile import build_profile
from tests.factories import STACKS, check_speedscope_schema, expected, html_data, make_report, read_pprof, session_with

# main -> f (thread 7, 30); main -> f -> g (thread 7, 10); a blocked main (thread 8, 60: wall only);
# main -> f -> json.dumps (a library, thread 7, 5); r -> r -> r -> main, recursive (thread 8, 7)


@pytest.fixture
def profile():
    return build_profile(session_with(make_report(STACKS)))


LABEL = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")


def _frame_of_label(label):
    m = LABEL.match(label)
    return (m["name"], m["file"], int(m["line"]))


@pytest.mark.parametrize("metric", ["cpu", "wall"])
@pytest.mark.parametrize("libraries", [False, True])
def test_collapsed_round_trip(profile, metric, libraries):
    text = Collapsed(metric, libraries).render(profile)
    back = Counter()
    for line in text.splitlines():
        stack, n = line.rsplit(" ", 1)
        back[(None, tuple(_frame_of_label(f) for f in stack.split(";")))] += int(n)
    assert back == expected(profile, metric, libraries, threads=False)


@pytest.mark.parametrize("metric", ["cpu", "wall"])
def test_speedscope_round_trip_and_schema(profile, metric):
    doc = json.loads(Speedscope(metric).render(profile))
    check_speedscope_schema(doc)
    frames = [(f["name"], f["file"], f["line"]) for f in doc["shared"]["frames"]]
    back = Counter()
    for p in doc["profiles"]:
        tid = int(re.search(r"\((\d+)\) \w+ samples$", p["name"])[1])
        for stack, w in zip(p["samples"], p["weights"], strict=True):
            back[(tid, tuple(frames[i] for i in stack))] += w  # root first, as speedscope reads them
    assert back == expected(profile, metric)


def test_pprof_decodes_to_the_same_samples_functions_and_locations(profile):
    prof, types, samples = read_pprof(Pprof("wall").encode(profile))
    st = prof.string_table
    assert types == [
        ("cpu_samples", "count"),
        ("wall_samples", "count"),
        ("cpu", "nanoseconds"),
        ("wall", "nanoseconds"),
    ]
    assert st[prof.default_sample_type] == "wall"
    for metric in ("cpu", "wall"):
        back = Counter()
        for labels, stack, values in samples:
            back[(labels["thread_id"], stack)] += values[f"{metric}_samples"]
        assert +back == expected(profile, metric)
    # thread names as labels; time estimated from the mean interval between sampling passes
    interval = prof.period
    assert interval == int(profile.process["duration_s"] * 1e9 / profile.process["samples"])
    for labels, _, values in samples:
        assert labels["thread"] == {7: "MainThread", 8: "worker"}[labels["thread_id"]]
        assert values["wall"] == values["wall_samples"] * interval
    # one function per Python function, one location per line
    fns = sorted((st[f.system_name], st[f.filename], f.start_line) for f in prof.function)
    assert all(f.name == f.system_name for f in prof.function)  # no "<module>" here: shown as is
    assert fns == sorted({(f.name, f.file, f.firstline) for f in profile.frames})
    assert len(prof.location) == len(profile.frames)
    assert prof.duration_nanos == int(profile.process["duration_s"] * 1e9)
    assert any("dyper@" in st[c] for c in prof.comment)


def test_pprof_names_that_pprof_would_hide_get_their_module():
    from dyper.monitor.model.frames import Frame
    from dyper.monitor.model.profile import StackCount

    frames = [Frame("/srv/app.py", "<module>", 1, 3), Frame("/srv/app.py", "f.<locals>.<lambda>", 5, 5)]
    p = Profile(frames, [StackCount(1, (0, 1), 4, 4)], {1: "MainThread"}, {"pid": 1})
    prof, _, samples = read_pprof(Pprof().encode(p))
    st = prof.string_table
    assert sorted(st[f.name] for f in prof.function) == ["app.<module>", "f.<locals>.<lambda>"]
    assert samples[0][1] == (("<module>", "/srv/app.py", 3), ("f.<locals>.<lambda>", "/srv/app.py", 5))
    (mapping,) = prof.mapping
    assert mapping.id == 1 and mapping.has_functions and all(loc.mapping_id == 1 for loc in prof.location)


def test_pprof_without_a_known_duration_has_sample_counts_only(profile):
    profile.process["duration_s"] = 0
    prof, types, _ = read_pprof(Pprof("cpu").encode(profile))
    assert types == [("cpu_samples", "count"), ("wall_samples", "count")]
    assert prof.string_table[prof.default_sample_type] == "cpu_samples"


@pytest.mark.parametrize("metric", ["cpu", "wall"])
def test_html_flame_graph_round_trip_and_self_contained(profile, metric):
    text = FlameGraphHtml(metric).render(profile)
    data = html_data(text)
    frames = data["frames"]
    back = Counter()
    stack = [(data["tree"], ())]
    thread_of = {}
    while stack:
        (_frame, self_n, total, children), path = stack.pop()
        assert total == self_n + sum(c[2] for c in children)
        if self_n and path:
            back[path] += self_n
        for c in children:
            stack.append((c, (*path, c[0])))
    got = Counter()
    for path, n in back.items():
        name, _, _, kind = frames[path[0]]
        assert kind == 2  # threads first
        tid = int(re.search(r"\((\d+)\)$", name)[1])
        thread_of[tid] = name
        got[(tid, tuple((frames[i][0], frames[i][1], frames[i][2]) for i in path[1:]))] += n
    assert got == expected(profile, metric)
    assert thread_of[7] == "MainThread (7)"
    assert {frames[i][3] for i in range(len(frames)) if frames[i][0] == "dumps"} == {1}  # a library frame
    # one file, nothing fetched
    assert not re.search(r"https?://|<link|@import|url\(|<script[^>]+src|<img", text)
    assert text.count("<script") == 2 and text.count("</script>") == 2


def test_html_keeps_hostile_names_inert(profile):
    from dyper.monitor.model.frames import Frame

    profile.frames[1] = Frame("/app/x.py", "</script><script>alert(1)</script>&amp;", 10, 11)
    text = FlameGraphHtml("cpu").render(profile)
    assert text.count("</script>") == 2
    assert any(f[0] == "</script><script>alert(1)</script>&amp;" for f in html_data(text)["frames"])


def test_html_inlines_the_dashboards_renderer_and_reads_no_placeholder_twice(profile):
    from importlib import resources

    profile.process["argv"] = ["app.py", "__DYPER_DATA__", "__DYPER_FLAME_JS__"]
    text = FlameGraphHtml("cpu").render(profile)
    flame_js = resources.files("dyper.monitor").joinpath("web/static/flame.js").read_text(encoding="utf-8")
    assert text.count(flame_js) == 1  # one renderer: the dashboard's, inlined
    title = html_data(text)["title"]
    assert title.startswith("dyper: app.py __DYPER_DATA__ __DYPER_FLAME_JS__")
    assert re.search(r"<title>(.*?)</title>", text)[1] == title  # the page's title, not the data put in its place


def test_html_prunes_big_trees_to_the_largest_frames(profile):
    exporter = FlameGraphHtml("wall")
    exporter.max_nodes = 6
    data = exporter.data(profile)
    kept, stack = 0, [data["tree"]]
    while stack:
        node = stack.pop()
        kept += 1
        assert sum(c[2] for c in node[3]) <= node[2] - node[1]
        stack.extend(node[3])
    assert kept <= 6 and data["tree"][2] == profile.total("wall")
    assert "left out" in data["subtitle"]


def test_exporters_by_name_and_by_file_name():
    assert [cls.format for cls in EXPORTERS] == ["speedscope", "pprof", "html", "collapsed", "json"]
    for path, cls in [
        ("x.speedscope.json", Speedscope),
        ("x.pb.gz", Pprof),
        ("x.pprof", Pprof),
        ("x.html", FlameGraphHtml),
        ("x.collapsed", Collapsed),
        ("x.folded", Collapsed),
        ("x.json", OwnJson),
    ]:
        assert isinstance(exporter_for(path), cls)
        assert isinstance(exporter_named(cls.format), cls)
    with pytest.raises(ValueError, match="end it with"):
        exporter_for("x.txt")
    with pytest.raises(ValueError, match="unknown format"):
        exporter_named("svg")


def test_own_json_round_trip(profile, tmp_path):
    path = tmp_path / "p.json"
    OwnJson().write(profile, path)
    back = Profile.load(path)
    assert back.to_json() == json.loads(json.dumps(profile.to_json()))
    for metric in ("cpu", "wall"):
        assert expected(back, metric) == expected(profile, metric)
