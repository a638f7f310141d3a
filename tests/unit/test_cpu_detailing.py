"""cpu detailing's collector on its own: exact counts of the candidates only, nothing left behind.

3.12+ counts through sys.monitoring local events on the candidates only;
3.11 counts through yappi.
"""

from __future__ import annotations

import sys
import types
from types import CodeType

import pytest

from agent import _fastsample
from agent.proflet import DetailContext
from proflets.cpu import CpuAnalyzer, CpuCollector, PyCallCounter, call_counter


def hot(x: int) -> int:
    return x + 1


def cold(x: int) -> int:
    return x - 1


def other(x: int) -> int:
    return x * 2


def _burst(collector: CpuCollector, hot_calls: int, cold_calls: int) -> dict[str, list[int]]:
    collector.start_detail(DetailContext([hot.__code__, cold.__code__], 1.0))
    for i in range(hot_calls):
        hot(i)
        other(i)
    for i in range(cold_calls):
        cold(i)
    result = collector.stop_detail()
    return {row[1]: row for row in result["functions"]}


def test_exact_counts_of_the_candidates_only() -> None:
    collector = CpuCollector()
    assert collector.unavailable() is None
    rows = _burst(collector, hot_calls=5000, cold_calls=300)
    assert set(rows) == {"hot", "cold"}  # `other` is no candidate
    assert rows["hot"][3] == 5000 and rows["cold"][3] == 300
    collector.close()


def test_a_second_burst_counts_again_and_the_tool_is_freed() -> None:
    collector = CpuCollector()
    first = _burst(collector, hot_calls=1000, cold_calls=10)
    second = _burst(collector, hot_calls=1000, cold_calls=10)
    assert first["hot"][3] == second["hot"][3] == 1000
    if sys.version_info >= (3, 12):
        mon = sys.monitoring
        assert all(mon.get_tool(t) != "dyper" for t in range(6))
    else:
        import yappi

        assert not yappi.is_running()
    collector.close()


def looped(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_a_lines_burst_counts_each_line_exactly() -> None:
    collector = CpuCollector()
    collector.explicit = True  # yappi on 3.11 is opt-in
    collector._bursts = 1  # odd bursts count lines too
    collector.start_detail(DetailContext([looped.__code__], 1.0))
    looped(250)
    looped(250)
    result = collector.stop_detail()
    collector.close()
    assert [row[3] for row in result["functions"]] == [2]
    if sys.version_info < (3, 12):
        # yappi counts calls, not lines
        assert not result["lines_counted"] and result["lines"] == []
        return
    assert result["lines_counted"]
    body = looped.__code__.co_firstlineno + 3  # `total += i`
    lines = {row[3]: row[4] for row in result["lines"]}
    assert lines[body] == 500
    assert lines[body - 2] == 2  # `total = 0`, once a call


def _feed(counter: object, a: CodeType, b: CodeType, stranger: CodeType) -> None:
    for _ in range(3):
        counter.on_start(a, 0)  # type: ignore[attr-defined]
    counter.on_start(stranger, 0)  # type: ignore[attr-defined]  # not counted: no candidate
    counter.on_line(b, 7)  # type: ignore[attr-defined]
    counter.on_line(b, 7)  # type: ignore[attr-defined]
    counter.on_line(a, 9)  # type: ignore[attr-defined]
    counter.on_line(stranger, 9)  # type: ignore[attr-defined]


@pytest.mark.parametrize("make", [PyCallCounter, _fastsample.CallCounter], ids=["python", "c"])
def test_the_counters_count_candidates_only_and_reset(make: type) -> None:
    a, b, stranger = hot.__code__, cold.__code__, other.__code__
    counter = make([a, b])
    _feed(counter, a, b, stranger)
    calls, lines = counter.counts()
    assert calls == {a: 3}
    assert lines == {(b, 7): 2, (a, 9): 1}
    assert counter.total() == 6
    assert counter.events() == (6, 0)  # all plain: not a native counter, no clock read
    counter.reset()
    assert counter.counts() == ({}, {}) and counter.total() == 0 and counter.events() == (0, 0)
    _feed(counter, a, b, stranger)  # counts again after a reset
    assert counter.counts() == ({a: 3}, {(b, 7): 2, (a, 9): 1})


def test_the_c_counter_refuses_bad_codes() -> None:
    with pytest.raises(TypeError, match="code objects"):
        _fastsample.CallCounter([hot])
    with pytest.raises(ValueError, match="at most 16"):
        _fastsample.CallCounter([hot.__code__] * 17)
    assert isinstance(call_counter([hot.__code__]), _fastsample.CallCounter)


def sorts(data: list[int], rounds: int) -> int:
    n = 0
    for _ in range(rounds):
        n += len(sorted(data))
    return n


def test_a_native_burst_times_the_c_calls_of_each_candidate() -> None:
    collector = CpuCollector()
    collector.explicit = True
    collector._bursts = 1  # native time comes with the line counts
    data = list(range(20_000, 0, -1))
    collector.start_detail(DetailContext([sorts.__code__], 1.0))
    sorts(data, 40)
    result = collector.stop_detail()
    collector.close()
    if sys.version_info < (3, 12):
        assert "native" not in result  # yappi counts calls only
        return
    native = result["native"]
    [(_, name, _, own)] = native["functions"]
    assert name == "sorts" and own > 0
    callees = {row[3]: row for row in native["callees"]}
    assert callees["builtins.sorted"][4] == 40 and callees["builtins.len"][4] == 40
    # sorting 20,000 numbers is nearly all of sorts()'s time, and never more than all of it
    assert 0.5 * own < callees["builtins.sorted"][5] <= own
    assert callees["builtins.len"][5] < 0.1 * own
    assert result["slowdown_s"] > 0  # the events are charged


def test_the_analyzer_says_which_c_call_takes_a_function_s_time() -> None:
    analyzer = CpuAnalyzer(session=types.SimpleNamespace(counts={}, samples=0))
    burst = {
        "native": {
            "functions": [["app.py", "handle", 10, 2.0], ["app.py", "other", 30, 1.0]],
            "callees": [
                ["app.py", "handle", 10, "_json.scanstring", 500, 1.2],
                ["app.py", "handle", 10, "builtins.len", 500, 0.01],
                ["app.py", "other", 30, "time.sleep", 3, 0.1],
            ],
        }
    }
    analyzer.merge_detail(burst)
    analyzer.merge_detail(burst)  # a second burst adds up
    rows = analyzer.native_rows()
    assert [r["callee"] for r in rows] == ["_json.scanstring", "time.sleep", "builtins.len"]
    assert rows[0]["calls"] == 1000 and rows[0]["pct_of_function"] == pytest.approx(60.0)
    assert rows[1]["pct_of_function"] == pytest.approx(10.0)
    # in words, only what takes a large share of its function
    assert analyzer.findings() == [
        "_json.scanstring inside handle() is 60% of handle()'s time (native time, 1,000 calls measured)"
    ]
    # through history: state, restore
    again = CpuAnalyzer(session=None)
    again.restore(analyzer.state())
    assert again.native_rows() == rows
    analyzer.merge_detail({"native": {"callees": [["x"]]}})  # malformed: ignored
    assert analyzer.native_rows() == rows
