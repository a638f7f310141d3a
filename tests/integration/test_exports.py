"""The HTML flame graph's script run by node (moved from tests/unit/test_exports.py: it starts node)."""

import json
import re
import shutil
import subprocess

import pytest

from dyper.monitor.exports import (
    FlameGraphHtml,
)
from dyper.monitor.profile import build_profile
from tests.factories import STACKS, make_report, session_with


@pytest.fixture
def profile():
    return build_profile(session_with(make_report(STACKS)))


NODE_HARNESS = r"""
const fs = require("fs");
const page = fs.readFileSync(process.argv[2], "utf8");
const data = /<script id="dyper-data" type="application\/json">([\s\S]*?)<\/script>/.exec(page)[1];
const code = /<script>([\s\S]*?)<\/script>/.exec(page)[1];
const els = {};
function element(id) {
  return {id, style: {}, innerHTML: "", textContent: "", value: "", listeners: {}, children: [],
    clientWidth: 1000, addEventListener(t, f) { this.listeners[t] = f; }, focus() {},
    appendChild(c) { this.children.push(c); return c; }};
}
function el(id) {
  if (!els[id]) els[id] = element(id);
  return els[id];
}
el("dyper-data").textContent = data;
global.document = {getElementById: el, addEventListener() {}, activeElement: null, createElement: () => element()};
global.window = {addEventListener() {}, innerWidth: 1200};
new Function(code)();
// the renderer draws in a div of its own inside #graph
const graph = el("graph").children[0];
const api = window.dyperFlame, out = {};
out.first = graph.innerHTML;
out.title = el("title").textContent;
const f = api.find("f");
api.zoomTo(f);
out.zoomed = graph.innerHTML;
out.details = el("details").textContent;
api.search("dumps");
out.status = el("status").innerHTML;
out.searched = graph.innerHTML;
// a click on a frame's box zooms the way the page does it
api.search("");
graph.listeners.click({target: {getAttribute: (k) => (k === "data-i" ? String(api.find("g")) : null)}});
out.clicked = el("details").textContent;
api.reset();
api.flip();
out.flipped = graph.innerHTML;
console.log(JSON.stringify(out));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the page's script")
def test_html_flame_graph_script_renders_zooms_and_searches(profile, tmp_path):
    page = tmp_path / "fg.html"
    FlameGraphHtml("cpu").write(profile, page)
    harness = tmp_path / "harness.js"
    harness.write_text(NODE_HARNESS)
    proc = subprocess.run(["node", str(harness), str(page)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    box = r'<div class="([^"]*)" data-i="(\d+)" style="left:([\d.]+)px;top:(\d+)px;width:([\d.]+)px'
    boxes = re.findall(box, out["first"])
    assert out["title"].startswith("dyper: python app.py")
    assert ">main<" in out["first"] and ">f<" in out["first"] and ">MainThread (7)<" in out["first"]
    root = [b for b in boxes if b[3] == "0"]
    assert len(root) == 1 and float(root[0][4]) == pytest.approx(999.0)  # the root spans the page (less 1 px)
    # zoomed on f: f spans the page; its ancestors stay above it, dimmed
    assert "n anc" in out["zoomed"] and out["details"].startswith("f\n/app/app.py:11\ntotal 45 cpu samples")
    # search: dumps is 5 of 52 cpu samples, and 5 of the 45 under f
    assert "9.6%</b> of all (5 cpu samples), 11.1% of the zoomed frame" in out["status"]
    assert re.search(r'class="n[^"]* hit[^"]*"[^>]*>dumps<', out["searched"]) and " miss" in out["searched"]
    assert out["clicked"].startswith("g\n")
    # root at the bottom: the root's box is on the lowest row
    flipped = re.findall(box, out["flipped"])
    root = [b for b in flipped if b[1] == "0"]
    assert int(root[0][3]) == max(int(b[3]) for b in flipped) > 0
