"""The web dashboard in a real headless Chromium, against a real monitor and a real target.

One monitor (``dyper monitor --http``), one demo service (no agent at first)
and one browser are shared by the tests of this module, which run in order
like a user's visit: find the process, attach from the page, read its
summary, change its budget, pause and resume it, look at the call tree, search,
diagnose, detach.

Needs Debian's ``chromium`` and ``chromium-driver`` (scripts/test.sh installs
them when it can). Without them these tests fail, saying how to install them,
unless DYPER_SKIP_BROWSER=1 is set. Screenshots go to $DYPER_SCREENSHOTS
(docs/screenshots holds the ones committed) or a temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dyper.agent import native
from dyper.monitor.commands.ps import has_agent
from tests.factories import StandingMonitor, free_port, stop, wait_for

INSTALL = "apt-get install chromium chromium-driver (or set DYPER_SKIP_BROWSER=1 to skip the browser tests)"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
)
WAIT_S = 30.0


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if driver is None and os.path.exists("/usr/bin/chromedriver"):  # Debian's, when /usr/bin is not on PATH
        driver = "/usr/bin/chromedriver"
    missing = [name for name, path in (("chromium", chromium), ("chromedriver", driver)) if path is None]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("selenium (pip install -e .[test])")
    if missing:
        reason = f"browser tests need {', '.join(missing)}: {INSTALL}"
        if os.environ.get("DYPER_SKIP_BROWSER") == "1":
            pytest.skip(reason)
        pytest.fail(reason, pytrace=False)
    assert chromium is not None and driver is not None
    return chromium, driver


class Page:
    """The browser on the dashboard, with the waits the tests need."""

    def __init__(self, driver: Any, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def until(self, script: str, what: str, timeout: float = WAIT_S) -> Any:
        """Wait until ``script`` (a JS expression) is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(f"return ({script});")
            if value:
                return value
            if time.monotonic() > deadline:
                self.screenshot("failed-" + what.replace(" ", "-")[:40])
                raise AssertionError(f"timed out waiting for {what} in the page")
            time.sleep(0.2)

    def tab(self, name: str) -> None:
        self.js("document.querySelector('[data-tab=\"' + arguments[0] + '\"]').click()", name)

    def screenshot(self, name: str) -> Path:
        self.js("var t = document.getElementById('toast'); if (t) t.innerHTML = '';")
        # The whole page, not just the window.
        height = int(self.js("return document.documentElement.scrollHeight") or 1000)
        self.driver.set_window_size(1400, min(max(height, 900), 2600))
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        self.driver.set_window_size(1400, 1000)
        return path


@dataclass
class Visit:
    monitor: StandingMonitor
    target: subprocess.Popen[str]
    page: Page


@pytest.fixture(scope="module")
def dashboard() -> Iterator[Visit]:
    chromium, driver_path = _browser_paths()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    http_port = free_port()
    monitor = StandingMonitor(free_port(), None, "--http", f"127.0.0.1:{http_port}")
    monitor.start()
    # A trigger the agent attached from the page reads from the target's environment (as agent.start
    # does): the demo's own load fires it at once. Its budget is the page's 2%, so nothing else moves.
    env = {**os.environ, "DYPER_TRIGGERS": json.dumps(["cpu > 5% for 0s, before 2s, after 2s, budget 2%"])}
    target = subprocess.Popen(
        [sys.executable, "-m", "dyper.monitor.demo.service"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    profile_dir = tempfile.mkdtemp(prefix="dyper-chromium-")
    driver = None
    try:
        assert target.stdout is not None
        assert "demo service on" in target.stdout.readline()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in CHROMIUM_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={profile_dir}")
        driver = webdriver.Chrome(options=options, service=Service(driver_path))
        shots = Path(os.environ.get("DYPER_SCREENSHOTS") or tempfile.mkdtemp(prefix="dyper-screenshots-"))
        shots.mkdir(parents=True, exist_ok=True)
        print(f"screenshots in {shots}")
        yield Visit(monitor, target, Page(driver, f"http://127.0.0.1:{http_port}/", shots))
    finally:
        if driver is not None:
            driver.quit()
        stop(target)
        monitor.kill()
        Path(monitor.log.name).unlink(missing_ok=True)
        monitor.cleanup()
        shutil.rmtree(profile_dir, ignore_errors=True)


def test_process_list_shows_the_target_and_attaches_to_it(dashboard):
    monitor, target, page = dashboard.monitor, dashboard.target, dashboard.page
    page.driver.get(page.url)
    row = f"document.querySelector('#process-table tr[data-pid=\"{target.pid}\"]')"
    page.until(row, "the target's row")
    assert page.js(f"return {row}.textContent").find("dyper.monitor.demo.service") >= 0
    attached, monitored = f"{row}.cells[2].querySelector('input')", f"{row}.cells[3].querySelector('input')"
    assert page.js(f"return [{attached}.checked, {monitored}.checked]") == [False, False]

    page.js("document.getElementById('attach-budget').value = '2'")
    page.js(f"{attached}.click()")
    page.until(f"{row} && {row}.cells[3].querySelector('input').checked", "the target monitored", timeout=40)
    assert has_agent(target.pid)
    session = wait_for(lambda: monitor.session(target.pid), what="the session")
    assert session["connected"] and session["budget"] == pytest.approx(0.02)
    page.screenshot("processes")


def test_summary_shows_lights_and_budget(dashboard):
    target, page = dashboard.target, dashboard.page
    page.driver.get(f"{page.url}#/p/{target.pid}")
    page.until("document.querySelector('.light[data-proflet=\"cpu\"] .dot')", "the cpu light")
    page.until("document.getElementById('budget-now').textContent === '2%'", "the budget")
    page.until("document.querySelectorAll('#top-functions tbody tr').length > 0", "top functions")
    page.until("document.querySelector('#plot svg path.spent')", "the overhead plot")
    # which sampler took the stacks, as the agent said (the native one, where it was built)
    expected = "native" if native.available() else "gil"
    page.until(
        f"document.getElementById('sampler-now').textContent === 'stacks sampled by the {expected} sampler'", "sampler"
    )
    # the diagnosis's bottlenecks in words (proflets' own findings may come first)
    page.until("document.getElementById('findings').textContent.includes('% of the busy time')", "findings", 40)


def test_changing_the_budget_on_the_page_reaches_the_agent(dashboard):
    monitor, target, page = dashboard.monitor, dashboard.target, dashboard.page
    page.js("var i = document.getElementById('budget-input'); i.value = '5'; i.setAttribute('data-touched', '1')")
    page.js("document.getElementById('budget-set').click()")
    # The session's budget is what the agent reports it runs at.
    wait_for(lambda: monitor.session(target.pid)["budget"] == pytest.approx(0.05), what="the agent's new budget")
    page.until("document.getElementById('budget-now').textContent === '5%'", "the new budget on the page")
    page.until("document.querySelector('#top-functions td .fn')", "top functions")
    page.screenshot("summary")


def test_pausing_and_resuming_from_the_page(dashboard):
    monitor, target, page = dashboard.monitor, dashboard.target, dashboard.page
    toggle = "document.getElementById('pause-toggle')"
    page.js(f"{toggle}.click()")
    wait_for(lambda: monitor.session(target.pid)["paused"], what="the agent paused")
    page.until(f"{toggle}.textContent === 'Resume'", "the Resume button")
    page.js(f"{toggle}.click()")
    wait_for(lambda: not monitor.session(target.pid)["paused"], what="the agent resumed")
    page.until(f"{toggle}.textContent === 'Pause'", "the Pause button")
    # Pause and resume are marks: lines on the overhead plot, named on hover.
    marks = "document.querySelectorAll('#plot svg line.mark-pause, #plot svg line.mark-resume')"
    page.until(f"{marks}.length >= 2", "the pause and resume marks on the plot")
    assert "pause" in page.js("return document.querySelector('#plot svg line.mark-pause title').textContent")


def test_a_trigger_event_is_listed_and_opens_its_window_against_the_one_before(dashboard):
    page = dashboard.page
    rows = "document.querySelectorAll('#trigger-table tbody tr')"
    page.until(f"{rows}.length >= 1", "the trigger event in its card")
    assert "cpu > 5%" in page.js(f"return {rows}[0].textContent")
    page.js(f"{rows}[0].querySelector('button').click()")
    page.until("document.getElementById('window-text').value.startsWith('@')", "the event's window")
    window = page.js("return document.getElementById('window-text').value")
    before = page.js("return document.getElementById('compare-text').value")
    start, end = (float(x) for x in window.replace("@", "").split(":"))
    normal_start, normal_end = (float(x) for x in before.replace("@", "").split(":"))
    assert normal_end == start and normal_end - normal_start == pytest.approx(end - start, abs=0.2)
    # Back to the last minute, with nothing to compare, for the tests that follow.
    page.js("var c = document.getElementById('compare-text'); c.value = ''; c.dispatchEvent(new Event('change'))")
    page.js("document.querySelector('#window-presets button[data-window=\"-60s:\"]').click()")


def test_the_asyncio_card_shows_the_demos_loop_its_handlers_and_a_block(dashboard):
    page = dashboard.page
    page.until("document.querySelectorAll('#asyncio-blocks li').length >= 1", "a blocked loop in the asyncio card")
    assert "notifier" in page.js("return document.querySelector('#asyncio-loops tbody tr').textContent")
    handlers = page.js("return document.getElementById('asyncio-handlers').textContent")
    assert "send_notification" in handlers, handlers
    assert "write_metrics_file" in page.js("return document.getElementById('asyncio-blocks').textContent")
    # Tasks over the window: a line with a point per report (or group of reports).
    points = page.js("return document.querySelector('#asyncio-timeline polyline').getAttribute('points')")
    assert len(points.split()) >= 2, points


def test_cpu_table_and_flame_graph_render(dashboard):
    page = dashboard.page
    page.tab("cpu")
    page.until(
        "[...document.querySelectorAll('[data-table=\"cpu-functions\"] td .fn')]"
        ".some(e => e.textContent === 'render_report')",
        "render_report in the cpu table",
    )
    headers = page.js(
        "return [...document.querySelectorAll('[data-table=\"cpu-functions\"] th')].map(e => e.textContent)"
    )
    assert headers[:5] == ["Name", "Base time (s)", "Base %", "Total time (s)", "Total %"]
    # a header sorts by its column, numbers largest first
    page.js("[...document.querySelectorAll('[data-table=\"cpu-functions\"] th')][3].click()")
    totals = page.js(
        "return [...document.querySelectorAll('[data-table=\"cpu-functions\"] tbody tr')]"
        ".map(r => parseFloat(r.cells[3].textContent))"
    )
    assert totals == sorted(totals, reverse=True)
    page.screenshot("cpu")

    page.tab("flame")
    page.until("window.dyperState.flame && window.dyperState.flame.find('render_report') >= 0", "the flame graph")
    assert page.js("return window.dyperState.flame.boxes()") > 10
    page.screenshot("flame")
    # click a frame: it zooms in (the status line says so)
    page.js(
        "var f = window.dyperState.flame; var i = f.find('Handler.do_GET');"
        "document.querySelector('.flame .n[data-i=\"' + i + '\"]').click()"
    )
    page.until("document.getElementById('flame-status').textContent.includes('zoomed on Handler.do_GET')", "zoom")
    page.js(
        "var s = document.getElementById('flame-search'); s.value = 'render_report';s.dispatchEvent(new Event('input'))"
    )
    page.until("document.querySelectorAll('.flame .n.hit').length > 0", "search hits")

    # the differential view: this window against an earlier one
    page.js(
        "var c = document.getElementById('compare-text'); c.value = '-60s:-5s'; c.dispatchEvent(new Event('change'))"
    )
    page.until("document.getElementById('flame-legend').textContent.includes('grew')", "the differential view")


def test_search_panel_answers(dashboard):
    page = dashboard.page
    page.js("var c = document.getElementById('compare-text'); c.value = ''; c.dispatchEvent(new Event('change'))")
    page.tab("search")
    page.until("document.querySelector('.result[data-kind=\"suggestions\"] tbody tr')", "suggestions")
    page.js("document.querySelector('.result[data-kind=\"suggestions\"] tbody tr').click()")
    page.until("document.querySelector('.result[data-kind=\"summary\"] .path')", "the selected summary")
    # label it and show it again: the REPL's commands, typed in the page
    page.js(
        "var c = document.getElementById('search-cmd'); c.value = 'label hot';"
        "c.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}))"
    )
    page.until("document.querySelector('.result[data-kind=\"label\"]')", "the label")
    page.js(
        "var c = document.getElementById('search-cmd'); c.value = 'show';"
        "c.dispatchEvent(new KeyboardEvent('keydown', {key: 'Enter'}))"
    )
    page.until("document.querySelector('.result[data-kind=\"summary\"] .lbl')", "the labelled summary")
    page.screenshot("search")


def test_diagnosis_with_history(dashboard):
    page = dashboard.page
    page.tab("diagnosis")
    page.until("document.querySelector('[data-table=\"bottlenecks\"] tbody tr')", "ranked bottlenecks", timeout=40)
    page.until("document.querySelectorAll('ul.tree .verdict.passed').length > 0", "the search history")
    page.screenshot("diagnosis")
    # A bottleneck opens the call tree zoomed on its path.
    page.js("document.querySelector('[data-table=\"bottlenecks\"] tbody tr').click()")
    status = "document.getElementById('flame-status')"
    page.until(f"{status} && {status}.textContent.includes('zoomed on')", "the call tree at the bottleneck's path")
    page.tab("diagnosis")


def test_detach_from_the_page(dashboard):
    target, page = dashboard.target, dashboard.page
    page.driver.get(page.url)
    row = f"document.querySelector('#process-table tr[data-pid=\"{target.pid}\"]')"
    page.until(f"{row} && {row}.cells[2].querySelector('input').checked", "the attached switch")
    page.js(f"{row}.cells[2].querySelector('input').click()")
    page.until(f"{row} && !{row}.cells[2].querySelector('input').checked", "the target detached")
    assert not has_agent(target.pid)
    assert target.poll() is None  # the service goes on
