// Live per-shard charts and cache tables for a table page: polls the page's metrics.json,
// keeps a short history in memory, draws one SVG polyline per shard and fills the cache
// tables. No libraries, nothing fetched from elsewhere.
(function () {
  "use strict";
  var root = document.getElementById("charts");
  if (!root) { return; }
  var url = root.getAttribute("data-metrics-url");
  var statusLine = document.getElementById("scrape-status");
  var POLL_MS = 3000, KEEP = 60, PAD = 6;
  var COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#4b5563"];
  var SVG_NS = "http://www.w3.org/2000/svg";
  var history = {};   // series -> shard -> [[t, value], ...]
  var previous = {};  // shard -> last raw sample (for counter deltas)

  function push(series, shard, t, value) {
    if (value === null || value === undefined || !isFinite(value)) { return; }
    var bySeries = history[series] || (history[series] = {});
    var points = bySeries[shard] || (bySeries[shard] = []);
    points.push([t, value]);
    if (points.length > KEEP) { points.shift(); }
  }

  function derive(sample, t) {
    var last = previous[sample.index];
    previous[sample.index] = { t: t, requests: sample.requests_total,
      sum: sample.latency_sum, count: sample.latency_count };
    push("rows", sample.index, t, sample.rows);
    push("memory_bytes", sample.index, t, sample.memory_bytes);
    if (!last || last.requests === null || sample.requests_total === null) { return; }
    var dt = t - last.t;
    if (dt > 0) { push("qps", sample.index, t, Math.max(0, (sample.requests_total - last.requests) / dt)); }
    var dcount = (sample.latency_count || 0) - (last.count || 0);
    if (dcount > 0) { push("latency_ms", sample.index, t, 1000 * (sample.latency_sum - last.sum) / dcount); }
  }

  function draw(svg) {
    // Draw in the element's own pixel size so dots stay round and labels unstretched.
    var W = Math.max(svg.clientWidth, 120), H = Math.max(svg.clientHeight, 60);
    svg.setAttribute("viewBox", "0 0 " + W + " " + H);
    var series = history[svg.getAttribute("data-series")] || {};
    while (svg.firstChild) { svg.removeChild(svg.firstChild); }
    var all = [];
    Object.keys(series).forEach(function (s) { all = all.concat(series[s]); });
    if (all.length === 0) { label(svg, "no data yet", PAD, H / 2); return; }
    var t0 = Math.min.apply(null, all.map(function (p) { return p[0]; }));
    var t1 = Math.max.apply(null, all.map(function (p) { return p[0]; }));
    var vmax = Math.max.apply(null, all.map(function (p) { return p[1]; })) || 1;
    Object.keys(series).forEach(function (shard) {
      var colour = COLOURS[Number(shard) % COLOURS.length];
      var points = series[shard].map(function (p) {
        var x = PAD + (W - 2 * PAD) * (t1 > t0 ? (p[0] - t0) / (t1 - t0) : 1);
        var y = H - PAD - (H - 2 * PAD) * (p[1] / vmax);
        return [x, y];
      });
      var line = document.createElementNS(SVG_NS, "polyline");
      line.setAttribute("fill", "none");
      line.setAttribute("stroke", colour);
      line.setAttribute("stroke-width", "1.5");
      line.setAttribute("data-shard", shard);
      line.setAttribute("points", points.map(function (xy) {
        return xy[0].toFixed(1) + "," + xy[1].toFixed(1);
      }).join(" "));
      svg.appendChild(line);
      // A dot on the newest value keeps a single sample (or a flat line) visible.
      var last = points[points.length - 1];
      var dot = document.createElementNS(SVG_NS, "circle");
      dot.setAttribute("cx", last[0].toFixed(1));
      dot.setAttribute("cy", last[1].toFixed(1));
      dot.setAttribute("r", "2.5");
      dot.setAttribute("fill", colour);
      svg.appendChild(dot);
    });
    label(svg, "max " + format(vmax), PAD, 12);
  }

  function label(svg, text, x, y) {
    var node = document.createElementNS(SVG_NS, "text");
    node.setAttribute("x", String(x));
    node.setAttribute("y", String(y));
    node.setAttribute("class", "chart-label");
    node.textContent = text;
    svg.appendChild(node);
  }

  function format(v) {
    if (v >= 1e9) { return (v / 1e9).toFixed(2) + "G"; }
    if (v >= 1e6) { return (v / 1e6).toFixed(2) + "M"; }
    if (v >= 1e3) { return (v / 1e3).toFixed(1) + "k"; }
    return v.toFixed(v < 10 ? 2 : 0);
  }

  // The caches' tables: one row per shard (GPU cache) or client cache tier, then the
  // total (the clients': one per tier).
  function cacheCells(f) {
    return [f.hits, f.misses, f.evictions, f.hit_rate.toFixed(4), f.resident_rows,
      format(f.resident_bytes) + "B", format(f.capacity_bytes) + "B"];
  }

  function fillRows(table, rows) {
    var body = table.querySelector("tbody");
    while (body.firstChild) { body.removeChild(body.firstChild); }
    rows.forEach(function (cells) {
      var tr = document.createElement("tr");
      cells.forEach(function (text) {
        var td = document.createElement("td");
        td.textContent = String(text);
        tr.appendChild(td);
      });
      body.appendChild(tr);
    });
    table.hidden = rows.length === 0;
  }

  function showCaches(cache) {
    var engine = document.getElementById("engine-cache");
    var clients = document.getElementById("client-caches");
    if (!cache || !engine || !clients) { return; }
    var engineRows = [];
    cache.shards.forEach(function (s) {
      if (s.engine) { engineRows.push(["shard " + s.index].concat(cacheCells(s.engine))); }
    });
    if (cache.engine_total) { engineRows.push(["total"].concat(cacheCells(cache.engine_total))); }
    fillRows(engine, engineRows);
    var clientRows = cache.clients.map(function (c) {
      return [c.client + " / " + c.layer, c.tier, c.policy].concat(cacheCells(c),
        [new Date(c.reported_unix * 1000).toLocaleTimeString()]);
    });
    Object.keys(cache.clients_total).sort().forEach(function (tier) {
      clientRows.push(["total", tier, ""].concat(cacheCells(cache.clients_total[tier]), [""]));
    });
    fillRows(clients, clientRows);
    document.getElementById("cache-status").textContent = engineRows.length || clientRows.length ?
      "" : "No cache in front of this table has reported.";
  }

  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { if (!r.ok) { throw new Error("HTTP " + r.status); } return r.json(); })
      .then(function (body) {
        var failures = [];
        body.shards.forEach(function (s) {
          derive(s, body.at);
          if (s.error) { failures.push("shard " + s.index + ": " + s.error); }
        });
        root.querySelectorAll("svg[data-series]").forEach(draw);
        showCaches(body.cache);
        statusLine.textContent = body.shards.length === 0 ? "No nodes registered yet." :
          (failures.length ? "Metrics unavailable for " + failures.join("; ") : "Updated " +
            new Date(body.at * 1000).toLocaleTimeString());
      })
      .catch(function (err) { statusLine.textContent = "Metrics unavailable: " + err.message; })
      .then(function () { window.setTimeout(poll, POLL_MS); });
  }

  root.querySelectorAll("svg[data-series]").forEach(draw);
  poll();
})();
