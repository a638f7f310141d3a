"""The threads analyzer splits running from waiting for the GIL only with the collector's CPU clocks."""

from __future__ import annotations

from dyper.proflets.base import ReportView
from dyper.proflets.threads.analyzer import ThreadsAnalyzer

MAIN = 1


def _view(data: dict[str, object] | None) -> ReportView:
    # one second, 100 samples: the thread always on the CPU or ready for it
    return ReportView(
        t=1.0, window_s=1.0, samples=100, data=data, kinds={MAIN: {"run": 100}}, threads={MAIN: "MainThread"}
    )


def test_without_the_collector_running_is_not_called_waiting_for_the_gil() -> None:
    analyzer = ThreadsAnalyzer()
    analyzer.merge(_view(None))  # the threads proflet is off in the agent: no CPU clocks
    [row] = analyzer.results()["threads"]
    assert row["run_pct"] == 100.0 and row["gil_pct"] is None
    assert not any("GIL" in f for f in analyzer.findings())
    again = ThreadsAnalyzer()
    again.restore(analyzer.state())
    assert again.results() == analyzer.results()


def test_with_cpu_clocks_the_rest_of_running_is_the_gil() -> None:
    analyzer = ThreadsAnalyzer()
    # 0.3 s of CPU in a second it was never waiting: ready but not running 70% of it
    analyzer.merge(_view({"threads": [[MAIN, 0, 0.3]]}))
    [row] = analyzer.results()["threads"]
    assert round(row["run_pct"]) == 30 and round(row["gil_pct"]) == 70
    assert any("ready to run but not running 70%" in f for f in analyzer.findings())
