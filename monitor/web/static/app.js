// The dyper dashboard: DYPER's web views (section 6, Figures 3-6) over the monitor's JSON API.
// Routes: #/ processes (Figure 3); #/p/PID[/START] one process (summary, details, call tree, search,
// diagnosis). Live data arrives as server-sent events from /api/events; nothing reloads the page.
(function () {
  "use strict";

  // --- small helpers ---------------------------------------------------------------------------

  function h(tag, attrs) {
    var el = document.createElement(tag);
    if (attrs) for (var k in attrs) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else if (k === "html") el.innerHTML = v;
      else if (k.slice(0, 2) === "on") el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (var i = 2; i < arguments.length; i++) add(el, arguments[i]);
    return el;
  }
  function add(el, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { add(el, c); }); return; }
    el.appendChild(typeof child === "object" ? child : document.createTextNode(String(child)));
  }
  function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }
  function fmtInt(n) { return n === null || n === undefined ? "" : Math.round(n).toLocaleString("en-US"); }
  function fmtNum(n, digits) {
    if (n === null || n === undefined || n === "") return "";
    if (typeof n !== "number") return String(n);
    if (Number.isInteger(n)) return fmtInt(n);
    var a = Math.abs(n);
    if (a > 0 && a < 0.001) return n.toPrecision(2);  // a time per call in seconds, say
    return n.toFixed(digits !== undefined ? digits : a >= 100 ? 1 : a >= 1 ? 2 : 3);
  }
  function pct(x, digits) { return x === null || x === undefined ? "" : (100 * x).toFixed(digits === undefined ? 2 : digits) + "%"; }
  function short(path) { var p = String(path || "").split("/"); return p.length > 2 ? p.slice(-2).join("/") : path; }
  function shortName(frame) {
    // "f (/long/path/app.py:12)" -> "f (app.py:12)", as the terminal's search tool shows it
    var m = /^(.*) \((.*)\)$/.exec(frame || "");
    if (!m) return frame;
    return m[1] + " (" + m[2].split("/").pop() + ")";
  }
  function ago(t) {
    if (!t) return "";
    var s = Date.now() / 1000 - t;
    if (s < 90) return Math.round(s) + " s ago";
    if (s < 5400) return Math.round(s / 60) + " min ago";
    if (s < 172800) return Math.round(s / 3600) + " h ago";
    return Math.round(s / 86400) + " days ago";
  }
  function clock(t) { var d = new Date(t * 1000); return d.toTimeString().slice(0, 8); }
  function escapeXml(text) {
    return String(text).replace(/[&<>"']/g, function (c) { return "&#" + c.charCodeAt(0) + ";"; });
  }

  function toast(text, isError) {
    var box = h("div", { class: isError ? "err" : "", text: text });
    document.getElementById("toast").appendChild(box);
    setTimeout(function () { box.remove(); }, isError ? 8000 : 4000);
  }

  function api(path, body) {
    var init = body === undefined ? {} : {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body)
    };
    return fetch(path, init).then(function (r) {
      return r.text().then(function (text) {
        var data;
        try { data = JSON.parse(text); } catch (e) { data = { ok: false, error: text || r.statusText }; }
        if (!r.ok) throw new Error(data.error || r.statusText);
        return data;
      });
    });
  }

  // --- sortable tables ---------------------------------------------------------------------------

  var LABELS = {
    name: "Name", self: "Base samples", total: "Total samples", self_pct: "Base %", total_pct: "Total %",
    self_s: "Base time (s)", total_s: "Total time (s)", count: "Count", calls: "Calls", calls_per_s: "Calls/s",
    s_per_call: "Time/call (s)", wall_self_pct: "Wall base %"
  };
  var sortState = {};  // table id -> [key, ascending]; kept across live refreshes

  function columnsOf(rows) {
    var keys = [];
    rows.slice(0, 50).forEach(function (r) { Object.keys(r).forEach(function (k) { if (keys.indexOf(k) < 0) keys.push(k); }); });
    var hasName = keys.indexOf("name") >= 0;
    // file and line are shown under the name, not as columns of their own
    keys = keys.filter(function (k) {
      var v = rows[0][k];
      return !(hasName && (k === "file" || k === "line" || k === "firstline")) && (typeof v !== "object" || v === null);
    });
    if (hasName) keys = ["name"].concat(keys.filter(function (k) { return k !== "name"; }));
    return keys;
  }
  function isNumeric(rows, key) {
    for (var i = 0; i < rows.length; i++) {
      var v = rows[i][key];
      if (v !== null && v !== undefined && v !== "") return typeof v === "number";
    }
    return false;
  }
  function label(key) {
    if (LABELS[key]) return LABELS[key];
    var s = key.replace(/_pct$/, " %").replace(/_s$/, " (s)").replace(/_ms$/, " (ms)").replace(/_/g, " ");
    return s.charAt(0).toUpperCase() + s.slice(1);
  }
  // How a column's values look when no description says (see formatOf): by its key and values.
  function formatOf(key) {
    if (key === "name") return "name";
    return /_pct$|^percent|^share/.test(key) ? "pct" : "";
  }
  // fmt: a column format of dyper.proflets.display (name, pct, num, text, yesno), or "" for by its values
  function cell(row, key, numeric, maxOf, fmt) {
    var v = row[key];
    if (fmt === "name") {
      var where = row.file ? short(row.file) + (row.line ? ":" + row.line : "") : "";
      return h("td", null, h("div", { class: "fn", text: v }), where ? h("div", { class: "where", text: where, title: row.file }) : null);
    }
    if (fmt === "pct" && typeof v === "number") {
      var w = maxOf[key] ? Math.max(0, Math.min(100, 100 * v / maxOf[key])) : 0;
      return h("td", { class: "num pct" }, h("div", { class: "b", style: "width:" + w.toFixed(1) + "%" }),
        h("span", { text: v.toFixed(1) + "%" }));
    }
    if (typeof v === "boolean") return h("td", { text: v ? "yes" : "no" });
    if (fmt === "text") numeric = false;
    return h("td", { class: numeric ? "num" : "", text: numeric ? fmtNum(v) : (v === null || v === undefined ? "" : String(v)) });
  }

  // Render rows (a list of flat dicts) as a table whose headers sort it; opts.columns picks and orders, or
  // opts.spec, a proflet's description of the table (dyper.proflets.display: its columns' keys, titles, formats).
  function sortableTable(id, rows, opts) {
    opts = opts || {};
    if (!rows || !rows.length) return h("div", { class: "empty", text: opts.empty || "nothing above the floor yet" });
    var titles = {}, formats = {}, given = opts.columns;
    if (opts.spec) {
      given = opts.spec.columns.map(function (c) { titles[c.key] = c.title; formats[c.key] = c.format; return c.key; });
    }
    function title(c) { return titles[c] || label(c); }
    var cols = given ? given.filter(function (c) {
      return rows.some(function (r) { return r[c] !== undefined; });
    }) : columnsOf(rows);
    var numeric = {}, maxOf = {};
    cols.forEach(function (c) {
      numeric[c] = isNumeric(rows, c);
      if (numeric[c]) maxOf[c] = Math.max.apply(null, rows.map(function (r) { return Math.abs(r[c] || 0); }));
    });
    var st = sortState[id] || opts.sort || null;
    var sorted = rows.slice();
    if (st) {
      var key = st[0], asc = st[1];
      sorted.sort(function (a, b) {
        var x = a[key], y = b[key];
        if (x === y) return 0;
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * (asc ? 1 : -1);
      });
    }
    if (opts.limit) sorted = sorted.slice(0, opts.limit);
    var table = h("table", { class: "t", "data-table": id });
    var tr = h("tr");
    cols.forEach(function (c) {
      var cls = "sortable" + (numeric[c] ? " num" : "") + (st && st[0] === c ? " sorted" + (st[1] ? " asc" : "") : "");
      tr.appendChild(h("th", {
        class: cls, text: title(c), title: "sort by " + title(c),
        onclick: function () {
          var cur = sortState[id] || opts.sort;
          sortState[id] = [c, cur && cur[0] === c ? !cur[1] : !numeric[c]];
          var fresh = sortableTable(id, rows, opts);
          table.replaceWith(fresh);
        }
      }));
    });
    table.appendChild(h("thead", null, tr));
    var body = h("tbody");
    sorted.forEach(function (r, i) {
      var row = h("tr", opts.onRow ? { class: "click", onclick: function () { opts.onRow(r, i); } } : null);
      cols.forEach(function (c) { row.appendChild(cell(r, c, numeric[c], maxOf, formats[c] || formatOf(c))); });
      body.appendChild(row);
    });
    table.appendChild(body);
    return h("div", { class: "tablewrap" }, table);
  }

  // --- live connection -----------------------------------------------------------------------------

  var state = { route: null, pid: null, start: null, windowText: "-60s:", compare: "", tab: "summary",
                summary: null, diagnosis: null, processes: null, es: null, search: null };
  window.dyperState = state;  // for tests and the console

  function connect() {
    if (state.es) state.es.close();
    var q = "";
    if (state.pid) {
      q = "?pid=" + state.pid + "&window=" + encodeURIComponent(state.windowText) +
        (state.start ? "&start_time=" + state.start : "");
    }
    var es = new EventSource("api/events" + q);
    state.es = es;
    var conn = document.getElementById("conn");
    es.onopen = function () { conn.className = "conn live"; conn.textContent = "live"; };
    es.onerror = function () { conn.className = "conn down"; conn.textContent = "reconnecting"; };
    es.addEventListener("processes", function (e) {
      state.processes = JSON.parse(e.data);
      document.getElementById("endpoint").textContent = "agents: " + state.processes.endpoint;
      if (state.route === "processes") renderProcesses();
    });
    es.addEventListener("summary", function (e) {
      state.summary = JSON.parse(e.data);
      if (state.route === "process") updateProcess();
    });
    es.addEventListener("diagnosis", function (e) {
      state.diagnosis = JSON.parse(e.data);
      if (state.route === "process") updateDiagnosis();
    });
  }

  // --- routing -----------------------------------------------------------------------------------------

  function route() {
    var m = /^#\/p\/(\d+)(?:\/([\d.]+))?/.exec(location.hash);
    var app = clear(document.getElementById("app"));
    if (m) {
      var changed = state.pid !== +m[1] || state.start !== (m[2] || null);
      state.route = "process"; state.pid = +m[1]; state.start = m[2] || null;
      if (changed) { state.summary = null; state.diagnosis = null; state.search = null; state.flame = null; }
      buildProcess(app);
    } else {
      state.route = "processes"; state.pid = null; state.start = null;
      app.appendChild(h("div", { id: "processes" }, h("div", { class: "empty", text: "looking for Python processes..." })));
      if (state.processes) renderProcesses();
    }
    document.getElementById("nav-processes").className = state.route === "processes" ? "on" : "";
    connect();
  }

  // --- Figure 3: processes -------------------------------------------------------------------------

  var busy = {};  // pid -> true while an attach/detach runs

  function control(pid, action) {
    busy[pid] = true;
    renderProcesses();
    var budget = parseFloat((document.getElementById("attach-budget") || {}).value || "1") / 100;
    return api("api/control", { pid: pid, action: action, budget: budget }).then(function (r) {
      toast(r.message || "done");
    }, function (err) { toast(err.message, true); }).then(function () {
      delete busy[pid];
      return api("api/processes").then(function (p) { state.processes = p; renderProcesses(); });
    });
  }

  function toggle(checked, disabled, title, onchange) {
    var input = h("input", { type: "checkbox", title: title, onchange: onchange });
    input.checked = checked; input.disabled = disabled;
    return h("label", { class: "switch", title: title }, input, h("span"));
  }

  function renderProcesses() {
    var root = document.getElementById("processes");
    if (!root || !state.processes) return;
    var p = state.processes;
    var budgetInput = document.getElementById("attach-budget");
    var budgetValue = budgetInput ? budgetInput.value : "1";
    clear(root);
    var rows = p.processes;
    var table = h("table", { class: "t", id: "process-table" });
    table.appendChild(h("thead", null, h("tr", null, ["PID", "Command", "Attached", "Monitored", "Budget", "Overhead",
      "Samples", ""].map(function (c, i) { return h("th", { class: i >= 4 && i < 7 ? "num" : "", text: c }); }))));
    var body = h("tbody");
    rows.forEach(function (r) {
      var pending = !!busy[r.pid];
      var open = r.known ? h("a", { href: "#/p/" + r.pid, class: "btn small", text: "open ›" }) : null;
      body.appendChild(h("tr", { "data-pid": r.pid },
        h("td", { class: "num" }, r.known ? h("a", { href: "#/p/" + r.pid, text: r.pid }) : String(r.pid)),
        h("td", null, h("div", { class: "fn", text: r.command.length > 140 ? r.command.slice(0, 140) + "…" : r.command }),
          r.python ? h("div", { class: "where", text: "Python " + r.python }) : null),
        h("td", null, toggle(r.attached, pending, r.attached ? "detach dyper's agent (the process is left as it was)" :
          "attach dyper's agent, streaming to this monitor", function () { control(r.pid, r.attached ? "detach" : "attach"); })),
        h("td", null, toggle(r.monitored, pending, r.monitored ? "stop monitoring: the agent leaves, the session and its history stay" :
          "monitor here" + (r.attached ? " (its agent streams elsewhere: it is moved here)" : ""), function () {
            if (!r.monitored && r.attached && !window.confirm("The agent in " + r.pid +
              " streams to another monitor. Move it to this one?")) { renderProcesses(); return; }
            control(r.pid, r.monitored ? "unmonitor" : "monitor");
          })),
        h("td", { class: "num", text: r.budget !== undefined && r.monitored ? pct(r.budget, 1) : "" }),
        h("td", { class: "num", text: r.overhead !== undefined && r.monitored ? pct(r.overhead, 2) : "" }),
        h("td", { class: "num", text: r.samples !== undefined ? fmtInt(r.samples) : "" }),
        h("td", { class: "num" }, pending ? h("span", { class: "dim", text: "working…" }) : open)));
    });
    if (!rows.length) body.appendChild(h("tr", null, h("td", { colspan: 8, class: "empty", text: "no Python processes found" })));
    table.appendChild(body);
    root.appendChild(h("div", { class: "card" },
      h("div", { class: "proc-head" }, h("h1", { text: "Python processes on " + p.host }),
        h("span", { class: "dim", text: rows.length + " found · attached: dyper's agent runs in it · monitored: this monitor receives its reports" })),
      h("div", { class: "budget-row" }, h("label", { class: "inline" }, "attach at",
        h("input", { type: "number", id: "attach-budget", min: "0.1", max: "50", step: "0.1", value: budgetValue }), "% budget")),
      h("div", { class: "tablewrap" }, table)));
    if (p.ended.length) {
      var et = h("table", { class: "t", id: "ended-table" });
      et.appendChild(h("thead", null, h("tr", null, ["PID", "Command", "Python", "Samples", "Last report"].map(function (c, i) {
        return h("th", { class: i === 3 ? "num" : "", text: c });
      }))));
      var eb = h("tbody");
      p.ended.forEach(function (s) {
        var link = "#/p/" + s.pid + "/" + s.start_time;
        eb.appendChild(h("tr", { class: "muted-row" }, h("td", null, h("a", { href: link, text: s.pid })),
          h("td", null, h("div", { class: "fn", text: s.command })), h("td", { text: s.python }),
          h("td", { class: "num", text: fmtInt(s.samples) }), h("td", { text: ago(s.last_report) })));
      });
      et.appendChild(eb);
      root.appendChild(h("div", { class: "card", style: "margin-top:14px" },
        h("h2", null, "Sessions kept in history ", h("span", { class: "sub", text: "(processes that ended or were detached)" })),
        h("div", { class: "tablewrap" }, et)));
    }
  }

  // --- one process: the frame, window bar and tabs ---------------------------------------------------

  var TABS = [["summary", "Summary"], ["cpu", "CPU"], ["flame", "Call tree"], ["search", "Bottleneck search"],
              ["diagnosis", "Diagnosis"]];

  function buildProcess(app) {
    app.appendChild(h("div", { class: "proc-head", id: "proc-head" }, h("h1", { text: "Process " + state.pid })));
    app.appendChild(h("div", { class: "facts", id: "facts" }));
    var presets = [["-10s:", "10 s"], ["-60s:", "1 min"], ["-5m:", "5 min"], ["", "whole run"]];
    var seg = h("div", { class: "seg", id: "window-presets" });
    presets.forEach(function (p) {
      seg.appendChild(h("button", { class: state.windowText === p[0] ? "on" : "", "data-window": p[0], text: p[1],
        onclick: function () { setWindow(p[0]); } }));
    });
    var slice = h("input", { type: "text", class: "mono", id: "window-text", size: 16, value: state.windowText,
      placeholder: "START:END", title: "any slice: -10m:-5m, 30s:2m, @UNIX:, 2024-05-01T10:00:" });
    slice.addEventListener("keydown", function (e) { if (e.key === "Enter") setWindow(slice.value.trim()); });
    var compare = h("input", { type: "text", class: "mono", id: "compare-text", size: 14, value: state.compare,
      placeholder: "e.g. -10m:-5m", title: "a second window: the call tree and the search then show this window minus that one" });
    compare.addEventListener("change", function () { state.compare = compare.value.trim(); refreshTab(); });
    app.appendChild(h("div", { class: "card windowbar" },
      h("span", { class: "dim", text: "Window" }), h("span", { class: "dim", text: "now:" }), seg,
      h("label", { class: "inline" }, "slice", slice, h("button", { class: "btn small", text: "apply",
        onclick: function () { setWindow(slice.value.trim()); } })),
      h("label", { class: "inline" }, "compare with", compare),
      h("span", { class: "dim", id: "window-desc" })));
    var tabs = h("div", { class: "tabs", id: "tabs" });
    app.appendChild(tabs);
    app.appendChild(h("div", { id: "tab-body" }));
    renderTabs();
    showTab(state.tab);
  }

  function setWindow(text) {
    state.windowText = text;
    var input = document.getElementById("window-text");
    if (input) input.value = text;
    document.querySelectorAll("#window-presets button").forEach(function (b) {
      b.className = b.getAttribute("data-window") === text ? "on" : "";
    });
    state.summary = null;
    connect();
    refreshTab();
  }

  function proflets() {
    // cpu has its own tab; every other proflet with tables gets one, rendered generically
    var p = (state.summary && state.summary.proflets) || {};
    return Object.keys(p).filter(function (n) { return n !== "cpu"; }).sort();
  }

  function renderTabs() {
    var tabs = document.getElementById("tabs");
    if (!tabs) return;
    var all = TABS.slice(0, 2).concat(proflets().map(function (n) { return [n, n.charAt(0).toUpperCase() + n.slice(1)]; }))
      .concat(TABS.slice(2));
    var key = all.map(function (t) { return t[0]; }).join(",");
    if (tabs.getAttribute("data-key") === key) {
      tabs.querySelectorAll("button").forEach(function (b) { b.className = b.getAttribute("data-tab") === state.tab ? "on" : ""; });
      return;
    }
    tabs.setAttribute("data-key", key);
    clear(tabs);
    all.forEach(function (t) {
      tabs.appendChild(h("button", { "data-tab": t[0], class: state.tab === t[0] ? "on" : "", text: t[1],
        onclick: function () { showTab(t[0]); } }));
    });
  }

  function showTab(tab) {
    state.tab = tab;
    renderTabs();
    var body = clear(document.getElementById("tab-body"));
    if (tab === "summary") buildSummary(body);
    else if (tab === "flame") buildFlame(body);
    else if (tab === "search") buildSearch(body);
    else if (tab === "diagnosis") buildDiagnosis(body);
    else body.appendChild(h("div", { id: "proflet-body" }));
    updateProcess();
  }

  function refreshTab() {
    if (state.route !== "process") return;
    if (state.tab === "flame") loadFlame();
    if (state.tab === "search") { state.search = null; showTab("search"); }
  }

  function updateProcess() {
    var s = state.summary;
    if (!s) return;
    renderTabs();
    var info = s.session, head = clear(document.getElementById("proc-head"));
    head.appendChild(h("h1", { text: "Process " + info.pid }));
    head.appendChild(h("span", { class: "pill " + (info.connected ? "live" : "ended"), text: info.connected ? "monitored" : "not connected" }));
    head.appendChild(h("span", { class: "cmd", text: (info.argv || []).join(" ") }));
    var facts = clear(document.getElementById("facts"));
    [["Python", info.python], ["samples", fmtInt(info.samples)], ["sampling passes/s", fmtNum(s.samples_per_s, 1)],
     ["reports", fmtInt(info.reports)], ["scheduler", info.spending && info.spending.scheduler],
     ["detailing bursts", fmtInt(s.bursts)], ["last report", ago(info.last_report)],
     ["service", s.service && s.service.processes > 1 ? s.service.name + " · " + s.service.processes + " processes" : ""]
    ].forEach(function (f) {
      if (f[1] !== undefined && f[1] !== "") facts.appendChild(h("span", null, f[0] + " ", h("b", { text: f[1] })));
    });
    var w = s.window;
    document.getElementById("window-desc").textContent = w.description + " · " + fmtInt(w.cpu_samples) + " cpu / " +
      fmtInt(w.wall_samples) + " wall samples";
    if (state.tab === "summary") updateSummary();
    else if (state.tab === "cpu") updateCpu();
    else if (state.tab === "diagnosis") updateDiagnosis();
    else if (proflets().indexOf(state.tab) >= 0) updateProflet(state.tab);
  }

  // --- Figures 4 and 6: summary ------------------------------------------------------------------------

  function buildSummary(body) {
    var range = h("input", { type: "range", id: "budget-range", min: "-1", max: "1.4", step: "0.01",
      title: "overhead budget (logarithmic: 0.1% to 25%)" });
    var number = h("input", { type: "number", id: "budget-input", min: "0.1", max: "50", step: "0.1" });
    range.addEventListener("input", function () { number.value = (+Math.pow(10, +range.value).toPrecision(2)).toString(); });
    number.addEventListener("keydown", function (e) { if (e.key === "Enter") setBudget(); });
    body.appendChild(h("div", { class: "grid" },
      h("div", { class: "card span-4", id: "lights-card" }, h("h2", { text: "Proflets" }), h("div", { class: "lights", id: "lights" }),
        h("div", { class: "legend", text: "hue: is there a problem (green none, red yes) · brightness: how sure" })),
      h("div", { class: "card span-4", id: "budget-card" }, h("h2", { text: "Overhead budget" }),
        h("div", null, h("span", { class: "big", id: "budget-now" }), h("span", { class: "dim", id: "budget-spent" })),
        h("div", { class: "dim", id: "sampler-now" }),
        h("div", { class: "budget-row" }, range, number, h("span", { class: "dim", text: "%" }),
          h("button", { class: "btn primary", id: "budget-set", text: "Set", onclick: setBudget })),
        h("div", { class: "budget-row" },
          h("button", { class: "btn", id: "pause-toggle", text: "Pause", onclick: togglePause,
            title: "stop sampling and detailing; the agent stays attached and costs nothing" }),
          h("button", { class: "btn", id: "stats-reset", text: "Reset", onclick: resetStats,
            title: "start the whole-run statistics afresh; the history keeps what came before" }),
          h("span", { class: "dim", id: "pause-state" })),
        h("dl", { class: "kv", id: "budget-kv" })),
      h("div", { class: "card span-4" }, h("h2", { text: "Noteworthy" }), h("ul", { class: "findings", id: "findings" },
        h("li", { class: "info", text: "the diagnosis runs every few seconds…" }))),
      h("div", { class: "card span-12" }, h("div", { style: "display:flex;justify-content:space-between;align-items:baseline" },
        h("h2", null, "Overhead spent vs budget ", h("span", { class: "sub", id: "plot-sub" })),
        h("div", { class: "plot-legend" }, h("span", null, h("i"), "spent"), h("span", null, h("i", { class: "b" }), "budget"))),
        h("div", { id: "plot" })),
      h("div", { class: "card span-12" }, h("h2", null, "Top functions ", h("span", { class: "sub", text: "by base (self) CPU in the window" })),
        h("div", { id: "top-functions" })),
      h("div", { class: "card span-12" }, h("h2", null, "Trigger events ",
        h("span", { class: "sub", text: "transients the agent caught (dyper attach --trigger); open one to see its window against the window before it" })),
        h("div", { id: "trigger-events" })),
      h("div", { class: "card span-12", id: "asyncio-card" }, h("h2", null, "asyncio ",
        h("span", { class: "sub", text: "event loops, where handlers spend their wall time, and the callbacks that blocked a loop (dyper export --view tasks for the task view)" })),
        h("div", { id: "asyncio" }))));
  }

  // Tasks over the window (a line) and the seconds each report's loops were blocked (red bars).
  function asyncioTimeline(tl) {
    var W = 900, H = 70, ns = "http://www.w3.org/2000/svg";
    var svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    svg.setAttribute("id", "asyncio-timeline");
    svg.setAttribute("style", "width:100%;height:70px");
    var t0 = tl[0][0], t1 = tl[tl.length - 1][0], span = Math.max(1e-9, t1 - t0);
    var maxTasks = Math.max.apply(null, tl.map(function (r) { return r[1]; })) || 1;
    var maxBlocked = Math.max.apply(null, tl.map(function (r) { return r[2]; })) || 1;
    tl.forEach(function (r) {
      if (!(r[2] > 0)) return;
      var bar = document.createElementNS(ns, "rect"), hgt = (H - 10) * r[2] / maxBlocked;
      bar.setAttribute("x", ((r[0] - t0) / span * (W - 4)).toFixed(1));
      bar.setAttribute("y", (H - hgt).toFixed(1));
      bar.setAttribute("width", "4");
      bar.setAttribute("height", hgt.toFixed(1));
      bar.setAttribute("fill", "var(--bad)");
      svg.appendChild(bar);
    });
    var line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", tl.map(function (r) {
      return ((r[0] - t0) / span * (W - 4)).toFixed(1) + "," + (H - 4 - (H - 14) * r[1] / maxTasks).toFixed(1);
    }).join(" "));
    line.setAttribute("fill", "none");
    line.setAttribute("stroke", "var(--accent, #2b6cd4)");
    line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    return h("div", null, h("div", { class: "dim", text: "tasks over the window (line, up to " + fmtNum(maxTasks, 0) +
      ") and seconds the loops were blocked per report (red, up to " + fmtNum(maxBlocked, 2) + " s)" }), svg);
  }

  function updateAsyncio(t) {
    var box = document.getElementById("asyncio");
    if (!box) return;
    clear(box);
    if (!t || !t.loops || !t.loops.length) {
      box.appendChild(h("div", { class: "empty", text: "no asyncio event loop seen in this window" }));
      return;
    }
    var loops = h("table", { class: "t", id: "asyncio-loops" });
    var head = h("tr");
    ["loop thread", "tasks", "max", "busy", "blocks", "blocked", "lag p50", "lag p99"].forEach(function (c) { head.appendChild(h("th", { text: c })); });
    loops.appendChild(h("thead", null, head));
    var body = h("tbody");
    t.loops.forEach(function (l) {
      body.appendChild(h("tr", null,
        h("td", { text: l.thread }),
        h("td", { class: "num", text: fmtNum(l.tasks_mean, 0) }),
        h("td", { class: "num", text: String(l.tasks_max) }),
        h("td", { class: "num", text: fmtNum(l.busy_pct, 0) + "%" }),
        h("td", { class: "num" + (l.blocks ? " bad" : ""), text: String(l.blocks) }),
        h("td", { class: "num", text: fmtNum(l.blocked_s, 2) + " s" }),
        h("td", { class: "num", text: fmtNum(l.lag_ms_p50, 1) + " ms" }),
        h("td", { class: "num", text: fmtNum(l.lag_ms_p99, 1) + " ms" })));
    });
    loops.appendChild(body);
    box.appendChild(h("div", { class: "tablewrap" }, loops));
    var handlers = h("table", { class: "t", id: "asyncio-handlers" });
    head = h("tr");
    ["handler", "task", "share of task time", "running", "awaiting (share of its wall time)"].forEach(function (c) { head.appendChild(h("th", { text: c })); });
    handlers.appendChild(h("thead", null, head));
    body = h("tbody");
    (t.handlers || []).slice(0, 8).forEach(function (x) {
      var waits = (x.awaiting || []).slice(0, 3).map(function (w) {
        return fmtNum(w.pct, 0) + "% " + w["function"] + (w.via && w.via !== w["function"] ? " in " + w.via : "");
      }).join("; ");
      body.appendChild(h("tr", null,
        h("td", { class: "mono", text: x.handler, title: x.file + ":" + x.line }),
        h("td", { text: x.task }),
        h("td", { class: "num", text: fmtNum(x.share_pct, 1) + "%" }),
        h("td", { class: "num", text: fmtNum(x.running_pct, 0) + "%" }),
        h("td", { text: waits })));
    });
    handlers.appendChild(body);
    box.appendChild(h("div", { class: "tablewrap" }, handlers));
    var tl = t.timeline || [];
    if (tl.length > 1) box.appendChild(asyncioTimeline(tl));
    var list = h("ul", { class: "findings", id: "asyncio-blocks" });
    (t.blocks || []).slice(0, 5).forEach(function (b) {
      var stack = (b.stack || []).slice(-4).map(function (w) { return w["function"] + " (" + w.file.split("/").pop() + ":" + w.line + ")"; }).join(" > ");
      list.appendChild(h("li", { class: "warn", text: "loop blocked " + fmtNum(b.duration_ms, 0) + " ms at " +
        new Date(b.t * 1000).toLocaleTimeString() + (b.task ? " in task " + b.task : "") + ": " + stack }));
    });
    if ((t.blocks || []).length) box.appendChild(list);
  }

  function updateTriggers(events) {
    var box = document.getElementById("trigger-events");
    if (!box) return;
    clear(box);
    if (!events.length) {
      box.appendChild(h("div", { class: "empty", text: "no trigger events: set triggers with dyper attach PID --trigger 'cpu > 80% for 10s'" }));
      return;
    }
    var table = h("table", { class: "t", id: "trigger-table" });
    var head = h("tr");
    ["#", "fired", "trigger", "what it saw", "budget", ""].forEach(function (c) { head.appendChild(h("th", { text: c })); });
    table.appendChild(h("thead", null, head));
    var body = h("tbody");
    events.slice().reverse().forEach(function (e) {
      var during = "@" + e.window[0].toFixed(1) + ":@" + e.window[1].toFixed(1);
      var before = "@" + e.normal[0].toFixed(1) + ":@" + e.normal[1].toFixed(1);
      body.appendChild(h("tr", { "data-trigger": String(e.id) },
        h("td", { class: "num", text: String(e.id) }),
        h("td", { text: new Date(e.t * 1000).toLocaleTimeString() }),
        h("td", { class: "mono", text: e.name }),
        h("td", { text: e.why }),
        h("td", { class: "num", text: pct(e.budget, 1) }),
        h("td", null, h("button", { class: "btn small", text: "open",
          title: "the window of the event, compared with the window as long just before it",
          onclick: function () {
            state.compare = before;
            var input = document.getElementById("compare-text");
            if (input) input.value = before;
            setWindow(during);
          } }))));
    });
    table.appendChild(body);
    box.appendChild(h("div", { class: "tablewrap" }, table));
  }

  function setBudget() {
    var input = document.getElementById("budget-input"), button = document.getElementById("budget-set");
    var value = parseFloat(input.value);
    if (!(value > 0)) { toast("give a budget in percent, e.g. 5", true); return; }
    button.disabled = true;
    api("api/budget", { pid: state.pid, start_time: state.start, budget: value / 100 }).then(function (r) {
      toast(r.message);
    }, function (err) { toast(err.message, true); }).then(function () { button.disabled = false; });
  }

  function pauseControl(action, button) {
    button.disabled = true;
    return api("api/pause", { pid: state.pid, start_time: state.start, action: action }).then(function (r) {
      toast(r.message);
    }, function (err) { toast(err.message, true); }).then(function () { button.disabled = false; });
  }

  function togglePause() {
    var button = document.getElementById("pause-toggle");
    pauseControl(button.getAttribute("data-paused") === "1" ? "resume" : "pause", button);
  }

  function resetStats() { pauseControl("reset", document.getElementById("stats-reset")); }

  function lightColor(problem, confidence) {
    var hue = 120 * (1 - Math.max(0, Math.min(1, problem)));
    var c = Math.max(0, Math.min(1, confidence));
    return "hsl(" + hue.toFixed(0) + "," + (15 + 70 * c).toFixed(0) + "%," + (28 + 27 * c).toFixed(0) + "%)";
  }

  function updateSummary() {
    var s = state.summary, lights = document.getElementById("lights");
    if (!lights) return;
    clear(lights);
    Object.keys(s.status || {}).sort().forEach(function (name) {
      var st = s.status[name];
      var tab = name === "cpu" || (s.proflets && s.proflets[name]) ? name : null;
      lights.appendChild(h("div", { class: "light", "data-proflet": name,
        title: name + ": problem " + (st.problem * 100).toFixed(0) + "%, confidence " + (st.confidence * 100).toFixed(0) + "%" +
          (tab ? " (click for the details)" : ""),
        onclick: tab ? function () { showTab(tab); } : null },
        h("div", { class: "dot", style: "background:" + lightColor(st.problem, st.confidence) +
          ";box-shadow:0 0 " + (4 + 10 * st.confidence).toFixed(0) + "px " + lightColor(st.problem, st.confidence) }),
        h("div", { class: "nm", text: name }),
        h("div", { class: "nb", text: (st.problem * 100).toFixed(0) + "% · " + (st.confidence * 100).toFixed(0) + "% sure" })));
    });
    Object.keys(s.off || {}).sort().forEach(function (name) {
      if (s.status && s.status[name]) return;
      // Said, never shown as zeros: "not running" or "no data yet, N s of M" (the reason in full on hover).
      var why = String(s.off[name]);
      var said = /^no data yet/.test(why) ? why.replace(/ before its first detailing.*$/, "") :
        /^not running/.test(why) ? "not running" : "off";
      lights.appendChild(h("div", { class: "light", title: name + ": " + why },
        h("div", { class: "dot", style: "background:transparent;border:2px dashed var(--line)" }),
        h("div", { class: "nm", text: name }), h("div", { class: "nb", text: said })));
    });
    if (!lights.firstChild) lights.appendChild(h("div", { class: "empty", text: "no proflet has reported a status yet" }));

    var info = s.session, sp = info.spending || {};
    document.getElementById("budget-now").textContent = pct(info.budget, 1).replace(/\.0%$/, "%");
    var now = 0; Object.keys(sp.now || {}).forEach(function (k) { now += sp.now[k]; });
    document.getElementById("budget-spent").textContent = "  spent now " + pct(now) + " · whole run " + pct(info.overhead);
    var sampler = info.sampler || {}, samplerNow = document.getElementById("sampler-now");
    samplerNow.textContent = "stacks sampled by the " + (sampler.name || "unknown") + " sampler";
    samplerNow.title = sampler.why || "the agent does not say which sampler it runs";
    var input = document.getElementById("budget-input"), range = document.getElementById("budget-range");
    if (document.activeElement !== input && document.activeElement !== range && !input.getAttribute("data-touched")) {
      input.value = +(100 * info.budget).toPrecision(3);
      range.value = Math.log10(100 * info.budget);
    }
    input.oninput = function () { input.setAttribute("data-touched", "1"); };
    var toggle = document.getElementById("pause-toggle");
    toggle.setAttribute("data-paused", info.paused ? "1" : "0");
    toggle.textContent = info.paused ? "Resume" : "Pause";
    document.getElementById("pause-state").textContent = info.paused ? "paused: no sampling, no detailing" : "";
    var kv = clear(document.getElementById("budget-kv"));
    var rows = [];
    Object.keys(sp.now || {}).sort().forEach(function (k) { rows.push(["now: " + k, pct(sp.now[k], 3)]); });
    if (sp.delays_s && sp.delays_s.sample !== undefined) rows.push(["sampling every", fmtNum(1000 * sp.delays_s.sample, 1) + " ms (mean)"]);
    if (sp.scheduler) rows.push(["timings from", sp.scheduler === "monitor" ? "the monitor (DYMON)" : "the agent itself"]);
    rows.forEach(function (r) { kv.appendChild(h("dt", { text: r[0] })); kv.appendChild(h("dd", { text: r[1] })); });

    drawPlot(document.getElementById("plot"), s.overhead, s.marks || []);
    updateTriggers(s.triggers || []);
    updateAsyncio(s.asyncio);
    var cpu = (s.proflets && s.proflets.cpu && s.proflets.cpu.functions) || [];
    var top = clear(document.getElementById("top-functions"));
    top.appendChild(sortableTable("top", cpu, { limit: 8, columns: ["name", "self_pct", "total_pct", "self_s", "calls_per_s"],
      empty: "no CPU samples in this window yet" }));
    updateFindings();
  }

  function drawPlot(box, overhead, marks) {
    var pts = (overhead && overhead.points) || [];
    document.getElementById("plot-sub").textContent = pts.length ? "(whole session, " + overhead.bucket_s + " s per point)" : "";
    if (pts.length < 1) { clear(box).appendChild(h("div", { class: "empty", text: "no reports yet" })); return; }
    var W = 1000, H = 190, L = 52, R = 12, T = 12, B = 26;
    var t0 = pts[0].t, t1 = pts[pts.length - 1].t;
    if (t1 === t0) t1 = t0 + 1;
    var ymax = 0;
    pts.forEach(function (p) { ymax = Math.max(ymax, p.spent, p.budget); });
    ymax = ymax > 0 ? ymax * 1.15 : 0.01;
    function x(t) { return L + (W - L - R) * (t - t0) / (t1 - t0); }
    function y(v) { return T + (H - T - B) * (1 - v / ymax); }
    var svg = ['<svg class="plot" viewBox="0 0 ' + W + " " + H + '" preserveAspectRatio="none" role="img" aria-label="overhead spent against budget">'];
    for (var g = 0; g <= 4; g++) {
      var v = ymax * g / 4;
      svg.push('<line class="grid-l" x1="' + L + '" x2="' + (W - R) + '" y1="' + y(v) + '" y2="' + y(v) + '"/>');
      svg.push('<text class="ax" x="' + (L - 6) + '" y="' + (y(v) + 4) + '" text-anchor="end">' + (100 * v).toFixed(ymax < 0.02 ? 2 : 1) + "%</text>");
    }
    var line = pts.map(function (p, i) { return (i ? "L" : "M") + x(p.t).toFixed(1) + "," + y(p.spent).toFixed(1); }).join("");
    var area = line + "L" + x(pts[pts.length - 1].t).toFixed(1) + "," + y(0) + "L" + x(t0).toFixed(1) + "," + y(0) + "Z";
    var budget = pts.map(function (p, i) {
      return (i ? "H" + x(p.t).toFixed(1) + "V" : "M" + x(p.t).toFixed(1) + ",") + y(p.budget).toFixed(1);
    }).join("") + "H" + (W - R);
    svg.push('<path class="spent-a" d="' + area + '"/>', '<path class="spent" d="' + line + '"/>', '<path class="budget" d="' + budget + '"/>');
    // Marks (agent.mark, pause, resume, reset, boost): a labelled line each, the name on hover.
    (marks || []).forEach(function (m) {
      // A point stands for a bucket that starts at its time: the newest marks fall in the last one.
      if (m[0] < t0 || m[0] > t1 + (overhead.bucket_s || 0)) return;
      var mx = Math.min(x(m[0]), W - R).toFixed(1);
      svg.push('<line class="mark mark-' + escapeXml(m[2]) + '" x1="' + mx + '" x2="' + mx + '" y1="' + T + '" y2="' + (H - B) +
        '"><title>' + escapeXml(clock(m[0]) + " " + m[1]) + "</title></line>");
    });
    svg.push('<text class="ax" x="' + L + '" y="' + (H - 6) + '">' + clock(t0) + "</text>");
    svg.push('<text class="ax" x="' + (W - R) + '" y="' + (H - 6) + '" text-anchor="end">' + clock(t1) + "</text>");
    svg.push("</svg>");
    box.innerHTML = svg.join("");
  }

  function updateFindings() {
    var ul = document.getElementById("findings");
    if (!ul || (!state.diagnosis && !(state.summary && state.summary.findings.length))) return;
    clear(ul);
    // the proflets' own findings (leaks, GIL contention, I/O waits...), then the diagnosis's bottlenecks
    var f = ((state.summary && state.summary.findings) || []).map(function (x) {
      return typeof x === "string" ? { level: "warn", text: x } :
        { level: x.level || "warn", text: x.text || x.message || JSON.stringify(x), path: x.path };
    }).concat((state.diagnosis && state.diagnosis.findings) || []);
    if (!f.length) ul.appendChild(h("li", { class: "info", text: "nothing noteworthy yet" }));
    f.forEach(function (item) {
      ul.appendChild(h("li", { class: item.level, text: item.text, title: (item.path || []).join("\n") }));
    });
  }

  // --- detail views: cpu (Figure 6) and any other proflet ------------------------------------------------

  // A proflet's description of the table over its results' list `key` (its render module's TABLES), if it gives one.
  function tableSpec(name, key) {
    var t = state.summary && state.summary.tables && state.summary.tables[name];
    return (t && t[key]) || null;
  }

  function updateCpu() {
    var body = document.getElementById("proflet-body"), s = state.summary;
    if (!body || !s) return;
    var cpu = (s.proflets && s.proflets.cpu) || {};
    clear(body);
    body.appendChild(h("div", { class: "card" }, h("h2", null, "CPU by function ",
      h("span", { class: "sub", text: "(" + s.window.description + "; times are samples × the sampling interval; counts from cpu detailing, extrapolated)" })),
      sortableTable("cpu-functions", cpu.functions || [], { spec: tableSpec("cpu", "functions"), sort: ["self_pct", false] })));
    Object.keys(cpu).filter(function (k) { return k !== "functions" && Array.isArray(cpu[k]); }).forEach(function (k) {
      var spec = tableSpec("cpu", k);
      body.appendChild(h("div", { class: "card", style: "margin-top:14px" }, h("h2", { text: spec ? spec.title : "CPU by " + k.replace(/s$/, "") }),
        sortableTable("cpu-" + k, cpu[k], { spec: spec, sort: ["self_pct", false] })));
    });
  }

  function updateProflet(name) {
    var body = document.getElementById("proflet-body"), s = state.summary;
    if (!body || !s) return;
    var p = (s.proflets && s.proflets[name]) || {};
    clear(body);
    var st = s.status && s.status[name];
    var why = s.off && s.off[name];
    if (why) body.appendChild(h("p", { class: "hint", text: name + ": " + why }));
    if (st) body.appendChild(h("p", { class: "hint", text: name + ": problem " + (100 * st.problem).toFixed(0) + "%, confidence " + (100 * st.confidence).toFixed(0) + "%" }));
    var any = false;
    Object.keys(p).forEach(function (k) {
      if (Array.isArray(p[k])) {
        any = true;
        var spec = tableSpec(name, k);
        body.appendChild(h("div", { class: "card", style: "margin-bottom:14px" }, h("h2", { text: spec ? spec.title : k.replace(/_/g, " ") }),
          sortableTable(name + "-" + k, p[k], { spec: spec })));
      }
    });
    var scalars = Object.keys(p).filter(function (k) { return !Array.isArray(p[k]) && typeof p[k] !== "object"; });
    if (scalars.length) {
      var kv = h("dl", { class: "kv" });
      scalars.forEach(function (k) { kv.appendChild(h("dt", { text: label(k) })); kv.appendChild(h("dd", { text: fmtNum(p[k]) })); });
      body.appendChild(h("div", { class: "card" }, kv));
    }
    if (!any && !scalars.length && !why) body.appendChild(h("div", { class: "empty", text: "no results from " + name + " yet" }));
  }

  // --- call tree -------------------------------------------------------------------------------------------

  function buildFlame(body) {
    var metric = h("select", { id: "flame-metric" }, h("option", { value: "cpu", text: "cpu samples" }),
      h("option", { value: "wall", text: "wall samples (blocked too)" }));
    metric.value = state.flameMetric || "cpu";
    metric.addEventListener("change", function () { state.flameMetric = metric.value; loadFlame(); });
    var search = h("input", { type: "search", id: "flame-search", placeholder: "search function or file, /regex/", size: 30 });
    search.addEventListener("input", function () { if (state.flame) state.flame.search(search.value); });
    // A pre-fork master and its workers: the call tree may merge the whole service.
    var svc = state.summary && state.summary.service;
    var whole = null;
    if (svc && svc.processes > 1) {
      var box = h("input", { type: "checkbox", id: "flame-service" });
      box.checked = !!state.flameService;
      box.addEventListener("change", function () { state.flameService = box.checked; loadFlame(); });
      whole = h("label", { class: "inline", title: "merge the call trees of pids " + svc.pids.join(", ") },
        box, "whole service (" + svc.processes + " processes)");
    }
    body.appendChild(h("div", { class: "card" },
      h("div", { class: "flame-tools" }, metric, whole, search,
        h("button", { class: "btn", text: "reset zoom", onclick: function () { if (state.flame) state.flame.reset(); } }),
        h("button", { class: "btn", text: "refresh", onclick: loadFlame }),
        h("span", { class: "flame-status", id: "flame-status" })),
      h("div", { id: "flame-legend", class: "hint" }),
      h("div", { id: "flame-box" }, h("div", { class: "empty", text: "loading the call tree…" })),
      h("div", { class: "flame-details", id: "flame-details", text: "hover a frame for its numbers; click to zoom in, click again to zoom out" })));
    loadFlame();
  }

  function loadFlame() {
    var box = document.getElementById("flame-box");
    if (!box) return;
    var q = "api/flame?pid=" + state.pid + "&window=" + encodeURIComponent(state.windowText) +
      "&metric=" + (state.flameMetric || "cpu") + (state.start ? "&start_time=" + state.start : "") +
      (state.compare ? "&base=" + encodeURIComponent(state.compare) : "") + (state.flameService ? "&service=1" : "");
    api(q).then(function (data) {
      var legend = document.getElementById("flame-legend");
      legend.innerHTML = "";
      if (data.base_total !== undefined) {
        add(legend, [h("span", { class: "swatch", style: "background:hsl(4,78%,55%)" }), "grew ",
          h("span", { class: "swatch", style: "background:hsl(214,78%,55%)" }), "shrank against " + data.base_window +
          " (share of the samples); widths are " + data.window]);
      } else {
        add(legend, [h("span", { class: "swatch", style: "background:hsl(28,80%,60%)" }), "your code ",
          h("span", { class: "swatch", style: "background:hsl(200,45%,68%)" }), "libraries ",
          h("span", { class: "swatch", style: "background:hsl(0,0%,80%)" }), "threads · " + data.window +
          (data.floor ? " · frames under " + data.floor + " samples left out" : "")]);
      }
      state.flame = window.DyperFlame.create(box, data, {
        details: document.getElementById("flame-details"), status: document.getElementById("flame-status")
      });
      if (state.flameFocus) {
        // Opened from a diagnosis' bottleneck: zoom on its path (the heaviest place it occurs).
        var focus = state.flameFocus;
        state.flameFocus = null;
        if (state.flame.zoomPath(focus.map(splitFrame)) < 0) toast("this path is not in the call tree of this window", true);
      }
      var s = document.getElementById("flame-search");
      if (s && s.value) state.flame.search(s.value);
      if (!data.tree[2]) clear(box).appendChild(h("div", { class: "empty", text: "no samples in this window" }));
    }, function (err) { clear(box).appendChild(h("div", { class: "empty", text: err.message })); });
  }

  // --- bottleneck search (the REPL of monitor/search, one command at a time) -------------------------------

  function buildSearch(body) {
    var suggester = h("select", { id: "suggester" }, ["highcum", "highbase", "spread"].map(function (n) {
      return h("option", { value: n, text: { highcum: "HighCum (top-down)", highbase: "HighBase (bottom-up)", spread: "spread over callers" }[n] });
    }));
    suggester.addEventListener("change", function () { run("suggester " + suggester.value).then(function () { run("suggest"); }); });
    var cmd = h("input", { type: "text", class: "cmd", id: "search-cmd", placeholder: "a command: suggest, select N, extend N, trim top, label NAME, labels, back, help" });
    cmd.addEventListener("keydown", function (e) { if (e.key === "Enter" && cmd.value.trim()) { run(cmd.value.trim()); cmd.value = ""; } });
    var zoomBox = h("input", { type: "checkbox", id: "search-zoom" });
    zoomBox.checked = true;
    zoomBox.addEventListener("change", function () { run("zoom " + (zoomBox.checked ? "on" : "off")); });
    body.appendChild(h("div", { class: "card" },
      h("div", { class: "search-bar" }, suggester, h("button", { class: "btn primary", id: "search-suggest", text: "Suggest", onclick: function () { run("suggest"); } }),
        h("button", { class: "btn", text: "labels", onclick: function () { run("labels"); } }),
        h("button", { class: "btn", text: "back", onclick: function () { run("back"); } }),
        h("label", { class: "inline" }, zoomBox, "zoom"), cmd,
        h("button", { class: "btn", text: "run", onclick: function () { if (cmd.value.trim()) { run(cmd.value.trim()); cmd.value = ""; } } })),
      h("div", { class: "hint", id: "search-source" }),
      h("div", { id: "search-results", style: "margin-top:10px" })));
    run("suggest");
  }

  function startSearch() {
    if (state.search) return Promise.resolve(state.search);
    return api("api/search/new", { pid: state.pid, start_time: state.start, window: state.windowText, base: state.compare || null,
      metric: "cpu" }).then(function (r) {
      state.search = r;
      var d = r.described, src = document.getElementById("search-source");
      if (src) src.textContent = "searching " + (d.window === "whole" ? "the whole run" : "window " + d.window) +
        (d.compare ? " minus window " + d.compare + " (comparative profile, " +
          (d.normalization === "raw" ? "raw counts" : "normalised by total samples: percentages are differences of shares") +
          "; values may be negative)" : "") +
        " · " + fmtInt(r.total) + " cpu samples · click a row to select it";
      return r;
    });
  }

  function run(command) {
    return startSearch().then(function (s) {
      return api("api/search/run", { id: s.id, command: command });
    }).then(function (result) { showResult(result); return result; }, function (err) { showResult({ command: command, ok: false, error: err.message }); });
  }

  function summaryRows(list, onRow, withRelation) {
    var rows = list.map(function (s) {
      var r = { n: s.n, name: (s.path.length > 1 ? "… > " : "") + shortName(s.path[s.path.length - 1]), base: s.base,
        base_pct: s.base_pct, cum: s.cum, cum_pct: s.cum_pct };
      if (withRelation) r.relation = { top: "↑ caller added", bottom: "↓ callee added", trim_top: "trim top", trim_bottom: "trim bottom" }[s.relation] + (s.added > 1 ? " ×" + s.added : "");
      if (s.labels && s.labels.length) r.labels = s.labels.join(", ");
      r._s = s;
      return r;
    });
    return sortableTable("search-" + Math.random(), rows, {
      columns: ["n", "name", "relation", "base", "base_pct", "cum", "cum_pct", "labels"], onRow: function (r) { onRow(r._s); }
    });
  }

  function pathView(path) {
    var box = h("div", { class: "path" });
    path.forEach(function (f, i) {
      if (i) box.appendChild(h("span", { class: "sep", text: "›" }));
      box.appendChild(h("span", { class: "fr", text: shortName(f), title: f }));
    });
    return box;
  }

  function showResult(r) {
    var out = document.getElementById("search-results");
    if (!out) return;
    var card = h("div", { class: "result" + (r.ok ? "" : " err"), "data-kind": r.kind || "error" }, h("div", { class: "cmdline", text: "› " + r.command }));
    if (!r.ok) card.appendChild(h("div", { class: "msg", text: r.error }));
    else if (r.kind === "suggestions") {
      card.appendChild(h("div", { class: "hint", text: r.summaries.length + " starting summaries from " + r.suggester + " (of " + fmtInt(r.total) + " samples)" }));
      card.appendChild(summaryRows(r.summaries, function (s) { run("select " + s.n); }));
    } else if (r.kind === "summary") {
      var c = r.current;
      card.appendChild(pathView(c.path));
      card.appendChild(h("div", { class: "metrics" },
        h("span", null, "base ", h("b", { text: fmtInt(c.base) }), " ", h("span", { class: "dim", text: c.base_pct === null ? "" : c.base_pct.toFixed(1) + "%" })),
        h("span", null, "cum ", h("b", { text: fmtInt(c.cum) }), " ", h("span", { class: "dim", text: c.cum_pct === null ? "" : c.cum_pct.toFixed(1) + "%" })),
        c.labels.length ? h("span", null, c.labels.map(function (l) { return h("span", { class: "lbl", text: l }); })) : null));
      var name = h("input", { type: "text", size: 14, placeholder: "label name" });
      name.addEventListener("keydown", function (e) { if (e.key === "Enter" && name.value.trim()) run("label " + JSON.stringify(name.value.trim())); });
      card.appendChild(h("div", { class: "search-bar" }, name,
        h("button", { class: "btn small", text: "label", onclick: function () { if (name.value.trim()) run("label " + JSON.stringify(name.value.trim())); } }),
        h("button", { class: "btn small", text: "trim top", onclick: function () { run("trim top"); } }),
        h("button", { class: "btn small", text: "trim bottom", onclick: function () { run("trim bottom"); } })));
      if (r.overlaps.length) {
        card.appendChild(h("div", { class: "hint", text: "overlap with each label (of this summary's cum and base):" }));
        card.appendChild(sortableTable("ov-" + Math.random(), r.overlaps.map(function (o) {
          return { label: o.label, cum_overlap: o.cum_overlap, cum_overlap_pct: o.cum_overlap_pct, base_overlap: o.base_overlap, base_overlap_pct: o.base_overlap_pct };
        })));
      }
      card.appendChild(h("div", { class: "hint", style: "margin-top:6px", text: "nearby summaries (click to move there):" }));
      card.appendChild(summaryRows(r.nearby, function (s) {
        run((s.relation === "top" || s.relation === "bottom" ? "extend " : "select ") + s.n);
      }, true));
    } else if (r.kind === "labels") {
      if (!r.labels.length) card.appendChild(h("div", { class: "hint", text: "no labels yet: select a summary and label it" }));
      r.labels.forEach(function (l) {
        card.appendChild(h("div", { class: "metrics" }, h("span", { class: "lbl", text: l.label }),
          h("span", null, "total base ", h("b", { text: fmtInt(l.total_base) }), " ", h("span", { class: "dim", text: (l.total_base_pct || 0).toFixed(1) + "%" })),
          h("span", null, "total cum ", h("b", { text: fmtInt(l.total_cum) }), " ", h("span", { class: "dim", text: (l.total_cum_pct || 0).toFixed(1) + "%" }))));
        card.appendChild(summaryRows(l.summaries, function (s) { run("select " + s.n); }));
      });
    } else if (r.kind === "label") {
      card.appendChild(h("div", null, "labelled ", h("span", { class: "lbl", text: r.label }), " (" + r.count + " summaries carry it)"));
    } else if (r.kind === "settings") {
      card.appendChild(h("div", { class: "hint", text: Object.keys(r.settings).map(function (k) { return k + " " + r.settings[k]; }).join(" · ") }));
    } else if (r.kind === "help") {
      card.appendChild(sortableTable("help", r.commands));
    } else card.appendChild(h("pre", { text: JSON.stringify(r, null, 1) }));
    out.insertBefore(card, out.firstChild);
    while (out.children.length > 12) out.removeChild(out.lastChild);
  }

  // --- diagnosis and its search history ------------------------------------------------------------------

  function buildDiagnosis(body) {
    var threshold = h("input", { type: "number", id: "diag-threshold", min: "0.5", max: "90", step: "0.5", value: "5", style: "width:70px" });
    body.appendChild(h("div", { class: "card" },
      h("div", { class: "search-bar" }, h("label", { class: "inline" }, "threshold", threshold, "%"),
        h("button", { class: "btn primary", text: "Diagnose now", onclick: function () {
          api("api/diagnose", { pid: state.pid, start_time: state.start, window: state.windowText, threshold: +threshold.value }).then(function (d) {
            state.diagnosis = d; state.diagnosisManual = true; updateDiagnosis();
          }, function (err) { toast(err.message, true); });
        } }),
        h("span", { class: "hint", text: "Performance Consultant style: hypotheses tested against the threshold, refined down the call graph; it re-runs on its own every few seconds at 5%" })),
      h("div", { id: "diag-body" }, h("div", { class: "empty", text: "waiting for the first diagnosis…" }))));
    updateDiagnosis();
  }

  var HYP = { cpu: "CPU-bound", loop: "blocking the event loop", io: "blocked on I/O", sync: "waiting on synchronisation",
              wait: "blocked in an unnamed call", gc: "garbage collection", samples: "samples", sleep: "sleeping",
              idle: "idle", starved: "a task starved of the loop" };

  // "qualname (file)" -> [qualname, file], as the call tree names its frames.
  function splitFrame(label) {
    var at = label.lastIndexOf(" (");
    return at > 0 && label.charAt(label.length - 1) === ")" ? [label.slice(0, at), label.slice(at + 2, -1)] : [label, ""];
  }

  // Open the call tree at a bottleneck: the metric it was found in (waits show in wall samples), zoomed on its path.
  function openInTree(b) {
    state.flameMetric = ["cpu", "samples", "gc"].indexOf(b.hypothesis) >= 0 ? "cpu" : "wall";
    state.flameFocus = (b.tree_path && b.tree_path.length ? b.tree_path : b.path).slice();
    showTab("flame");
  }

  function updateDiagnosis() {
    updateFindings();
    var box = document.getElementById("diag-body"), d = state.diagnosis;
    if (!box || !d) return;
    clear(box);
    box.appendChild(h("div", { class: "facts" }, h("span", null, "busy samples ", h("b", { text: fmtInt(d.total_samples) })),
      h("span", null, "threshold ", h("b", { text: d.threshold_pct + "%" })),
      Object.keys(d.shares_pct || {}).map(function (k) { return h("span", null, (HYP[k] || k) + " ", h("b", { text: d.shares_pct[k].toFixed(1) + "%" })); })));
    box.appendChild(h("h2", { text: "Bottlenecks, ranked" }));
    // The ranking is the one `dyper diagnose` prints (monitor/search/diagnose.py makes both); a row opens the
    // call tree at the bottleneck's path.
    box.appendChild(sortableTable("bottlenecks", d.bottlenecks.map(function (b, i) {
      return { rank: i + 1, share_pct: b.share_pct, hypothesis: HYP[b.hypothesis] || b.hypothesis, kind: b.kind,
               where: (b.path.length > 4 ? "… › " : "") + b.path.slice(-4).map(shortName).join(" › ") || "whole program",
               evidence: b.evidence, _b: b };
    }), { empty: "no bottleneck reaches the threshold", columns: ["rank", "share_pct", "hypothesis", "kind", "where", "evidence"],
          onRow: function (r) { if (r._b.path.length) openInTree(r._b); } }));
    if (d.bottlenecks.length) box.appendChild(h("div", { class: "hint", text: "click a bottleneck to open the call tree at its path" }));
    box.appendChild(h("h2", { style: "margin-top:16px", text: "Search history" }));
    var children = {};
    d.history.forEach(function (s) { var p = s.parent === null ? "root" : s.parent; (children[p] = children[p] || []).push(s); });
    function branch(parent, isRoot) {
      var ul = h("ul", { class: "tree" + (isRoot ? " root" : "") }), steps = children[parent] || [], failed = 0, hidden = [];
      steps.forEach(function (s) {
        var li = h("li", null, h("span", { class: "dim", text: "[" + s.step + "] " }),
          h(s.path.length ? "span" : "b", { text: s.path.length ? shortName(s.path[s.path.length - 1]) : (HYP[s.hypothesis] || s.hypothesis) }),
          s.share_pct === null ? null : " " + s.share_pct.toFixed(1) + "%",
          h("span", { class: "verdict " + s.verdict, text: s.verdict }), s.note ? h("span", { class: "note", text: s.note }) : null);
        if (children[s.step]) li.appendChild(branch(s.step, false));
        if (s.verdict === "failed" && s.parent !== null && ++failed > 3) { li.style.display = "none"; hidden.push(li); }
        ul.appendChild(li);
      });
      if (hidden.length) {
        var more = h("li", { class: "hint" }, h("button", { class: "btn small", text: "… " + hidden.length + " more below the threshold",
          onclick: function () { hidden.forEach(function (li) { li.style.display = ""; }); more.remove(); } }));
        ul.appendChild(more);
      }
      return ul;
    }
    box.appendChild(branch("root", true));
    (d.notes || []).forEach(function (n) { box.appendChild(h("div", { class: "hint", text: "note: " + n })); });
  }

  window.addEventListener("hashchange", route);
  route();
})();
