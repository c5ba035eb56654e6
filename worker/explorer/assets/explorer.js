// The zettelq graph page: draws the notes and links embedded as JSON in #zq-data with
// Cytoscape.js and fCoSE. Stored text is hostile input: it reaches the page only through
// textContent and canvas labels, never as markup.
(function () {
  "use strict";
  var started = performance.now();
  var data = JSON.parse(document.getElementById("zq-data").textContent);
  var byId = {};
  data.nodes.forEach(function (n) { byId[n.id] = n; });
  var COLOURS = {
    note: "#4e79a7", insight: "#f28e2b", source: "#9c755f", atom: "#59a14f",
    superseded: "#bab0ac"
  };
  var EDGE_COLOURS = {
    link: "#b8c4d0", sequence: "#999999", supersession: "#e15759", abstraction: "#f28e2b",
    part: "#59a14f", contradiction: "#b07aa1"
  };
  var FINE = 300; // up to this many nodes, fCoSE's full layout; above, its fast draft
  var BIG = 1500; // above this many nodes: straight edges, no labels while panning

  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) { e.textContent = String(text); }
    if (cls) { e.className = cls; }
    return e;
  }

  function elements() {
    var out = [];
    data.nodes.forEach(function (n) {
      out.push({ group: "nodes", data: { id: n.id, label: n.label, degree: n.degree },
        classes: n.styles });
    });
    data.edges.forEach(function (e) {
      out.push({ group: "edges", classes: [e.style], data: {
        id: e.id, source: e.source, target: e.target, weight: e.weight,
        label: e.label + " " + e.weight.toFixed(2) } });
    });
    return out;
  }

  function styles() {
    var big = data.nodes.length > BIG;
    var crowded = data.nodes.length > FINE; // labels only once zoomed in
    var s = [
      { selector: "node", style: {
        "label": "data(label)", "font-size": 8, "min-zoomed-font-size": crowded ? 16 : 7,
        "text-valign": "bottom", "text-margin-y": 2, "color": "#333",
        "width": function (n) { return 12 + 3 * Math.sqrt(n.data("degree")); },
        "height": function (n) { return 12 + 3 * Math.sqrt(n.data("degree")); },
        "background-color": COLOURS.note } },
      { selector: "node.insight", style: { "background-color": COLOURS.insight,
        "shape": "star", "width": 30, "height": 30 } },
      { selector: "node.source", style: { "background-color": COLOURS.source,
        "shape": "round-rectangle" } },
      { selector: "node.atom", style: { "background-color": COLOURS.atom,
        "border-width": 2, "border-color": "#2e6b28" } },
      { selector: "node.superseded", style: { "background-color": COLOURS.superseded,
        "opacity": 0.55, "border-width": 2, "border-style": "dashed", "border-color": "#e15759" } },
      { selector: "edge", style: {
        "curve-style": big ? "haystack" : "bezier", "line-color": EDGE_COLOURS.link,
        "width": function (e) { return 0.5 + 3.5 * Math.max(0, Math.min(1, e.data("weight"))); },
        "label": "data(label)", "font-size": 6, "min-zoomed-font-size": 9,
        "text-rotation": "autorotate", "color": "#555" } },
      { selector: "node.zq-match", style: { "border-width": 5, "border-color": "#d6009b",
        "border-style": "solid", "opacity": 1, "z-index": 10 } },
      { selector: ".zq-dim", style: { "opacity": 0.12 } },
      { selector: ":selected", style: { "border-width": 4, "border-color": "#111",
        "line-color": "#111" } }
    ];
    Object.keys(EDGE_COLOURS).forEach(function (k) {
      s.push({ selector: "edge." + k, style: { "line-color": EDGE_COLOURS[k] } });
    });
    s.push({ selector: "edge.sequence", style: { "line-style": "dashed" } });
    return s;
  }

  function layout() {
    var n = data.nodes.length;
    return { name: "fcose", quality: n > FINE ? "draft" : "default", randomize: true,
      animate: false, fit: true, padding: 20, nodeDimensionsIncludeLabels: n <= FINE,
      idealEdgeLength: 80, nodeRepulsion: 9000, numIter: 2500 };
  }

  function row(table, name, value) {
    if (value === undefined || value === null || value === "") { return; }
    var tr = el("tr");
    tr.appendChild(el("td", name));
    tr.appendChild(el("td", typeof value === "object" ? JSON.stringify(value) : value));
    table.appendChild(tr);
  }

  function chips(pane, title, words) {
    if (!words || !words.length) { return; }
    pane.appendChild(el("h3", title));
    var box = el("div");
    words.forEach(function (w) { box.appendChild(el("span", w, "zq-chip")); });
    pane.appendChild(box);
  }

  function table(pane, title, rows) {
    var t = el("table");
    rows.forEach(function (r) { row(t, r[0], r[1]); });
    if (t.childNodes.length) { pane.appendChild(el("h3", title)); pane.appendChild(t); }
  }

  function linkTo(id) {
    var a = el("span", byId[id] ? byId[id].label : id, "zq-link");
    a.addEventListener("click", function () { focus(id, true); });
    return a;
  }

  function links(pane, cy, id) {
    var edges = cy.getElementById(id).connectedEdges();
    if (!edges.length) { return; }
    pane.appendChild(el("h3", "links (" + edges.length + ")"));
    var t = el("table");
    edges.forEach(function (e) {
      var other = e.data("source") === id ? e.data("target") : e.data("source");
      var tr = el("tr");
      tr.appendChild(el("td", e.data("label")));
      var td = el("td");
      td.appendChild(linkTo(other));
      tr.appendChild(td);
      t.appendChild(tr);
    });
    pane.appendChild(t);
  }

  function audit(pane, entries) {
    if (!entries || !entries.length) { return; }
    pane.appendChild(el("h3", "audit history (newest first)"));
    var t = el("table");
    entries.forEach(function (a) {
      var tr = el("tr");
      tr.appendChild(el("td", a.at));
      var what = a.op + " by " + a.actor + " (" + a.source + ")";
      if (a.fields.length) { what += ": " + a.fields.join(", "); }
      tr.appendChild(el("td", what));
      t.appendChild(tr);
    });
    pane.appendChild(t);
  }

  function showNode(cy, n) {
    var pane = document.getElementById("zq-pane");
    pane.replaceChildren();
    pane.appendChild(el("h2", n.id));
    pane.appendChild(el("div", n.styles.join(", ")));
    pane.appendChild(el("h3", "content"));
    pane.appendChild(el("div", n.content, "zq-content"));
    chips(pane, "tags", n.tags);
    chips(pane, "keywords", n.keywords);
    table(pane, "note", [["context", n.context], ["importance", n.importance],
      ["access count", n.access_count], ["version", n.version], ["links", n.degree]]);
    table(pane, "times", [["created", n.created_at], ["updated", n.updated_at],
      ["event", n.event_time], ["valid to", n.valid_to], ["last access", n.last_access]]);
    table(pane, "provenance", [["agent", n.agent], ["embedder", n.embedder],
      ["part of", n.part_of], ["superseded by", n.superseded_by],
      ["merged from", n.merged_from.length ? n.merged_from : null],
      ["metadata", Object.keys(n.metadata).length ? n.metadata : null]]);
    links(pane, cy, n.id);
    audit(pane, n.audit);
  }

  function showEdge(e) {
    var pane = document.getElementById("zq-pane");
    pane.replaceChildren();
    var d = data.edges[Number(e.id().slice(1))];
    pane.appendChild(el("h2", d.label + " " + d.weight.toFixed(3)));
    var ends = el("div");
    ends.appendChild(linkTo(d.source));
    ends.appendChild(el("span", " \u2014 "));
    ends.appendChild(linkTo(d.target));
    pane.appendChild(ends);
    table(pane, "link", [["weight", d.weight], ["label", d.label], ["reason", d.reason],
      ["provenance", d.provenance], ["at", d.at], ["style", d.style]]);
  }

  function matches(n, q) {
    var hay = [n.id, n.content, n.context].concat(n.tags, n.keywords).join("\n");
    return hay.toLowerCase().indexOf(q) >= 0;
  }

  function search(cy, text) {
    var q = text.trim().toLowerCase();
    var count = document.getElementById("zq-count");
    cy.batch(function () {
      cy.elements().removeClass("zq-match zq-dim");
      if (!q) { return; }
      var hit = cy.nodes().filter(function (c) { return matches(byId[c.id()], q); });
      cy.elements().not(hit).addClass("zq-dim");
      hit.addClass("zq-match");
    });
    count.textContent = q ? cy.nodes(".zq-match").length + " matching" : "";
    return cy.nodes(".zq-match");
  }

  function legend() {
    var box = document.getElementById("zq-legend");
    Object.keys(COLOURS).forEach(function (k) {
      var item = el("span");
      var sw = el("span", null, "zq-swatch");
      sw.style.background = COLOURS[k];
      item.appendChild(sw);
      item.appendChild(el("span", k));
      box.appendChild(item);
    });
  }

  function summary() {
    var s = data.selection;
    var how = { connected: "most connected", seed: "around " + s.seed + ", " + s.hops + " hops",
      query: "matching \u201c" + s.query + "\u201d, " + s.hops + " hops" }[s.mode];
    document.getElementById("zq-namespace").textContent = data.namespace;
    document.getElementById("zq-summary").textContent = data.nodes.length + " of " + s.active +
      " notes, " + data.edges.length + " links (" + how + (s.truncated ? ", truncated" : "") + ")";
    document.title = "zettelq graph: " + data.namespace;
  }

  var focus = function () {};

  function start() {
    cytoscape.use(cytoscapeFcose);
    summary();
    legend();
    var cy = cytoscape({ container: document.getElementById("zq-graph"), elements: elements(),
      style: styles(), wheelSensitivity: 0.3, textureOnViewport: data.nodes.length > BIG,
      hideEdgesOnViewport: data.nodes.length > BIG });
    focus = function (id, centre) {
      var n = cy.getElementById(id);
      cy.elements().unselect();
      n.select();
      if (centre) { cy.animate({ center: { eles: n } }, { duration: 200 }); }
      showNode(cy, byId[id]);
    };
    cy.on("tap", "node", function (ev) { focus(ev.target.id(), false); });
    cy.on("tap", "edge", function (ev) { showEdge(ev.target); });
    var box = document.getElementById("zq-search");
    box.addEventListener("input", function () { search(cy, box.value); });
    box.addEventListener("keydown", function (ev) {
      var hit = ev.key === "Enter" ? search(cy, box.value) : null;
      if (hit && hit.length) { cy.fit(hit, 40); focus(hit[0].id(), false); }
    });
    document.getElementById("zq-fit").addEventListener("click", function () { cy.fit(null, 20); });
    cy.one("layoutstop", function () {
      window.zqRenderMs = performance.now() - started;
      document.body.setAttribute("data-zq-ready", "1");
    });
    cy.layout(data.nodes.length ? layout() : { name: "null" }).run();
    window.zqGraph = cy;
  }

  start();
})();
