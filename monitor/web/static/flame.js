// dyper's flame graph (an icicle: root on top, or at the bottom after flip()), the one renderer of the
// dashboard's call tree and of the HTML file `dyper export` writes (which inlines this file).
// DyperFlame.create(container, data, opts) draws data = {frames: [[name, file, line, kind]],
// tree: [frame, self, total, [children], base total?], unit, base_total?} (monitor/flame.py builds it)
// into a new div.flame in container; opts.details and opts.status are elements it fills, #tip is its tooltip.
// With a base total (a differential view) each box keeps this window's width and is coloured by how its
// share of the samples changed against the base window: red grew, blue shrank.
(function () {
  "use strict";
  var ROW = 18;

  function esc(s) {
    return String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
  }
  function fmt(n) { return String(n).replace(/\B(?=(\d{3})+(?!\d))/g, ","); }
  function pct(n, of) { return of ? (100 * n / of).toFixed(n * 1000 < of ? 2 : 1) + "%" : "0%"; }
  function hash(s) {
    var h = 2166136261;
    for (var k = 0; k < s.length; k++) { h ^= s.charCodeAt(k); h = Math.imul(h, 16777619); }
    return (h >>> 0) / 4294967296;
  }

  function create(container, data, opts) {
    opts = opts || {};
    var frames = data.frames, unit = data.unit || "samples";
    var diff = data.base_total !== undefined;
    var F = [], SELF = [], TOTAL = [], BASE = [], PARENT = [], DEPTH = [], X = [], KIDS = [];
    (function flatten() {
      var stack = [[data.tree, -1, 0, 0]];
      while (stack.length) {
        var item = stack.pop(), node = item[0], i = F.length;
        F.push(node[0]); SELF.push(node[1]); TOTAL.push(node[2]); BASE.push(node[4] || 0); PARENT.push(item[1]);
        DEPTH.push(item[2]); X.push(item[3]); KIDS.push([]);
        if (item[1] >= 0) KIDS[item[1]].push(i);
        var children = node[3] || [], x = item[3], pending = [];
        for (var c = 0; c < children.length; c++) { pending.push([children[c], i, item[2] + 1, x]); x += children[c][2]; }
        for (var p = pending.length - 1; p >= 0; p--) stack.push(pending[p]);
      }
    })();
    var ROOT_TOTAL = TOTAL[0] || 0, BASE_TOTAL = data.base_total || 0;
    var maxDelta = 0;
    if (diff) {
      for (var d = 1; d < F.length; d++) maxDelta = Math.max(maxDelta, Math.abs(delta(d)));
    }

    container.innerHTML = "";
    var graph = document.createElement("div");
    graph.className = "flame";
    container.appendChild(graph);
    var details = opts.details || null, status = opts.status || null, tip = document.getElementById("tip");
    var zoom = 0, hits = null, rootAtBottom = !!opts.rootAtBottom;

    function name(i) { return frames[F[i]][0]; }
    function where(i) { var f = frames[F[i]]; return f[1] ? f[1] + (f[2] ? ":" + f[2] : "") : ""; }
    function delta(i) {
      var a = ROOT_TOTAL ? TOTAL[i] / ROOT_TOTAL : 0, b = BASE_TOTAL ? BASE[i] / BASE_TOTAL : 0;
      return a - b;
    }
    function color(i) {
      var kind = frames[F[i]][3], v = hash(name(i));
      if (kind === 3) return "hsl(0,0%,72%)";
      if (kind === 2) return "hsl(0,0%," + (78 + 6 * v).toFixed(0) + "%)";
      if (diff) {
        var dv = maxDelta ? delta(i) / maxDelta : 0, s = Math.min(1, Math.abs(dv));
        var light = (92 - 42 * s).toFixed(0);
        return dv >= 0 ? "hsl(4,78%," + light + "%)" : "hsl(214,78%," + light + "%)";
      }
      if (kind === 1) return "hsl(" + (190 + 30 * v).toFixed(0) + ",45%," + (64 + 8 * v).toFixed(0) + "%)";
      return "hsl(" + (8 + 42 * v).toFixed(0) + "," + (72 + 14 * v).toFixed(0) + "%," + (56 + 8 * v).toFixed(0) + "%)";
    }
    function ancestors(i) { var out = []; for (var p = PARENT[i]; p >= 0; p = PARENT[p]) out.unshift(p); return out; }

    function render() {
      var width = graph.clientWidth || 1000;
      var z = zoom, scale = TOTAL[z] ? width / TOTAL[z] : 0, html = [], rows = 0;
      var anc = ancestors(z), top0 = anc.length, boxes = [];
      for (var a = 0; a < anc.length; a++) boxes.push([anc[a], 0, width, a, true]);
      var stack = [z];
      while (stack.length) {
        var i = stack.pop(), w = TOTAL[i] * scale;
        if (w < 0.5) continue;
        boxes.push([i, (X[i] - X[z]) * scale, w, top0 + DEPTH[i] - DEPTH[z], false]);
        for (var c = 0; c < KIDS[i].length; c++) stack.push(KIDS[i][c]);
      }
      for (var b = 0; b < boxes.length; b++) rows = Math.max(rows, boxes[b][3] + 1);
      for (b = 0; b < boxes.length; b++) {
        var box = boxes[b], n = box[0], cls = "n" + (box[4] ? " anc" : "");
        var row = rootAtBottom ? rows - 1 - box[3] : box[3];
        if (hits) cls += hits[n] ? " hit" : " miss";
        var label = box[2] > 28 ? esc(name(n)) : "";
        if (label) cls += " l";
        html.push('<div class="' + cls + '" data-i="' + n + '" style="left:' + box[1].toFixed(1) + "px;top:" +
          row * ROW + "px;width:" + Math.max(box[2] - 1, 0.5).toFixed(1) + "px;background:" + color(n) + '">' +
          label + "</div>");
      }
      graph.style.height = Math.max(rows, 1) * ROW + "px";
      graph.innerHTML = html.join("");
      updateStatus();
    }

    function describe(i) {
      var lines = [name(i)];
      if (where(i)) lines.push(where(i));
      lines.push("total " + fmt(TOTAL[i]) + " " + unit + " (" + pct(TOTAL[i], ROOT_TOTAL) + " of all" +
        (zoom ? ", " + pct(TOTAL[i], TOTAL[zoom]) + " of the zoomed frame" : "") + ")   self " + fmt(SELF[i]) +
        " (" + pct(SELF[i], ROOT_TOTAL) + ")");
      if (diff) {
        var dv = 100 * delta(i);
        lines.push("base window: " + fmt(BASE[i]) + " (" + pct(BASE[i], BASE_TOTAL) + ")   change " +
          (dv >= 0 ? "+" : "") + dv.toFixed(1) + " points of the samples");
      }
      return lines;
    }

    function zoomTo(i) {
      zoom = i >= 0 && i < F.length ? i : 0;
      render();
      if (details) details.textContent = describe(zoom).join("\n");
    }

    function setSearch(text) {
      text = (text || "").trim();
      hits = null;
      if (text) {
        var m = /^\/(.*)\/([a-z]*)$/.exec(text), matcher = null;
        try { matcher = m ? new RegExp(m[1], m[2].indexOf("i") >= 0 ? m[2] : m[2] + "i") : null; } catch (e) { matcher = null; }
        if (!matcher) {
          var needle = text.toLowerCase();
          matcher = { test: function (s) { return s.toLowerCase().indexOf(needle) >= 0; } };
        }
        hits = new Uint8Array(F.length);
        for (var i = 1; i < F.length; i++) if (matcher.test(name(i) + " " + where(i))) hits[i] = 1;
      }
      render();
    }

    function matchedTotal(under) {
      // Samples under matched frames, each counted once: outermost matches only.
      var sum = 0, stack = [under];
      while (stack.length) {
        var i = stack.pop();
        if (hits[i]) { sum += TOTAL[i]; continue; }
        for (var c = 0; c < KIDS[i].length; c++) stack.push(KIDS[i][c]);
      }
      return sum;
    }

    function updateStatus() {
      if (!status) return;
      if (!hits) {
        status.textContent = fmt(ROOT_TOTAL) + " " + unit + (zoom ? ", zoomed on " + name(zoom) : "") +
          (diff ? " · base window " + fmt(BASE_TOTAL) : "");
        return;
      }
      var all = matchedTotal(0);
      status.innerHTML = "match: <b>" + pct(all, ROOT_TOTAL) + "</b> of all (" + fmt(all) + " " + esc(unit) + ")" +
        (zoom ? ", " + pct(matchedTotal(zoom), TOTAL[zoom]) + " of the zoomed frame" : "");
    }

    function nodeOf(target) {
      while (target && target !== graph) {
        if (target.getAttribute && target.getAttribute("data-i") !== null) return +target.getAttribute("data-i");
        target = target.parentNode;
      }
      return -1;
    }

    graph.addEventListener("click", function (e) {
      var i = nodeOf(e.target);
      if (i >= 0) zoomTo(i === zoom ? Math.max(PARENT[i], 0) : i);
    });
    graph.addEventListener("mousemove", function (e) {
      var i = nodeOf(e.target);
      if (i < 0 || !tip) { if (tip) tip.style.display = "none"; return; }
      var lines = describe(i);
      tip.innerHTML = "<div>" + esc(lines[0]) + "</div>" + lines.slice(1).map(function (l) {
        return '<div class="k">' + esc(l) + "</div>";
      }).join("");
      tip.style.display = "block";
      var x = e.clientX + 14, y = e.clientY + 14;
      if (x + 420 > window.innerWidth) x = Math.max(4, e.clientX - 420);
      tip.style.left = x + "px"; tip.style.top = y + "px";
      if (details) details.textContent = lines.join("\n");
    });
    graph.addEventListener("mouseleave", function () { if (tip) tip.style.display = "none"; });
    var onResize = function () { if (graph.isConnected) render(); else window.removeEventListener("resize", onResize); };
    window.addEventListener("resize", onResize);
    render();
    return {
      zoomTo: zoomTo, search: setSearch, render: render, reset: function () { zoomTo(0); },
      flip: function () { rootAtBottom = !rootAtBottom; render(); return rootAtBottom; },
      find: function (n) { for (var i = 0; i < F.length; i++) if (name(i) === n) return i; return -1; },
      // Zoom on the heaviest frame whose callers end in path ([[name, file], ...], outermost first; thread
      // rows skipped): where a diagnosis' bottleneck is. Returns the frame's index, or -1 (nothing zoomed).
      zoomPath: function (path) {
        var best = -1, n = path.length;
        function is(i, p) { var f = frames[F[i]]; return f[0] === p[0] && (!p[1] || f[1] === p[1]); }
        for (var i = 1; i < F.length && n; i++) {
          if (!is(i, path[n - 1]) || (best >= 0 && TOTAL[i] <= TOTAL[best])) continue;
          var j = i, k = n - 1;
          while (k > 0) {
            j = PARENT[j];
            while (j > 0 && frames[F[j]][3] >= 2) j = PARENT[j];
            if (j <= 0 || !is(j, path[k - 1])) break;
            k--;
          }
          if (k === 0) best = i;
        }
        if (best >= 0) zoomTo(best);
        return best;
      },
      total: function (i) { return TOTAL[i]; }, count: function () { return F.length; },
      boxes: function () { return graph.querySelectorAll(".n").length; }
    };
  }

  window.DyperFlame = { create: create };
})();
