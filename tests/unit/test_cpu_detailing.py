"""cpu detailing's collector on its own: exact counts of the candidates only, nothing left behind.

3.12+ counts through sys.monitoring local events on the candidates only;
3.11 counts through yappi.
"""

from __future__ import annotations

import sys

from agent.proflet import DetailContext
from proflets.cpu import CpuCollector


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
