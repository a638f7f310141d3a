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


def test_the_native_samplers_own_kinds_are_its_columns() -> None:
    # The native sampler saw the thread on a CPU 30 times, waiting for the GIL 50 and in the run
    # queue 20: those are the columns, whatever the CPU clock (a GIL sampler's guess from it would
    # put 70% under the GIL), and they add up to 100 with the waits.
    analyzer = ThreadsAnalyzer()
    analyzer.merge(
        ReportView(
            t=1.0,
            window_s=1.0,
            samples=100,
            data={"threads": [[MAIN, 0, 0.3]]},
            kinds={MAIN: {"run": 30, "gil": 50, "runq": 20}},
            threads={MAIN: "MainThread"},
        )
    )
    [row] = analyzer.results()["threads"]
    assert (round(row["run_pct"]), round(row["gil_pct"]), round(row["runqueue_pct"])) == (30, 50, 20)
    assert row["wait_pct"] == 0.0
    assert any("ready to run but not running 50%" in f for f in analyzer.findings())


def test_a_history_saved_before_the_gil_and_run_queue_kinds_loads() -> None:
    # five kinds, then CPU seconds and seconds observed: as saved before "gil" and "runq"
    analyzer = ThreadsAnalyzer()
    analyzer.restore({"names": {str(MAIN): "MainThread"}, "totals": {str(MAIN): [100, 0, 0, 0, 0, 0.3, 1.0]}})
    [row] = analyzer.results()["threads"]
    assert round(row["run_pct"]) == 30 and round(row["gil_pct"]) == 70 and row["samples"] == 100
