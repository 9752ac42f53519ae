// modelcast live view: the fabric, one group's tree over it, and the event timeline.
//
// Everything comes from the controller's REST API with the caller's token (typed into the
// page or given once as #token=, kept in this tab's sessionStorage, sent as
// "Authorization: Bearer"): /v1/topology, /v1/groups, /v1/groups/{id}/trace and the event
// history /v1/events. The page follows the controller through the Server-Sent Events
// stream /v1/events/stream, read with fetch() so the token travels in a header
// (EventSource cannot send one); each event redraws within a fraction of a second. A
// controller without the stream is polled every 0.5 s instead.
"use strict";
(function () {
  const TOKEN_KEY = "modelcast.token";
  const POLL_MS = 500;        // the fallback without an event stream
  const RESYNC_MS = 10000;    // a full re-read even while events arrive
  const TRACE_MS = 2000;      // the trace reads switch counters: at most this often
  const MAX_EVENTS = 500;     // timeline entries kept in the page
  const BAD = new Set(["link_down", "switch_lost", "port_down", "host_forgotten", "refused", "damped",
    "install_failed", "link_refused"]);
  const WARN = new Set(["reroute", "failover", "drain"]);
  const GOOD = new Set(["link_up", "switch_connected", "port_up", "installed", "undamped", "host_learned",
    "group_created", "join"]);
  const HIDDEN_FIELDS = new Set(["id", "time", "kind", "group", "groups", "group_count"]);

  const $ = (id) => document.getElementById(id);
  const state = {
    topo: { switches: [], links: [], hosts: [] },
    groups: [],
    selected: null,          // the group id whose tree is drawn
    trace: null,             // its last trace (null: none or not offered by this controller)
    traceAt: 0,
    traceOffered: true,
    eventsOffered: true,
    streamOffered: true,
    lastEvent: 0,
    eventCount: 0,
    mode: "starting",
    generation: 0,           // bumped to stop the running follow loop (a new token)
    abort: null,
    layoutKey: "",
    seenLinks: new Map(),    // every link drawn so far (withLostLinks)
    traceKey: "",
    draws: 0,
    drawnAt: 0,
    error: "",
  };

  class HttpError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }

  // -- the token ------------------------------------------------------------------------
  function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

  function takeUrlParameters() {
    // #token= (never sent to the server) or ?token= (which the server's access log
    // records) goes to sessionStorage and out of the address bar, so out of bookmarks and
    // screenshots; ?group= selects a group
    const url = new URL(location.href);
    const fragment = new URLSearchParams(url.hash.slice(1));
    const t = fragment.has("token") ? fragment.get("token") : url.searchParams.get("token");
    if (t !== null) {
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
      url.searchParams.delete("token");
      fragment.delete("token");
      const rest = fragment.toString();
      history.replaceState(null, "", url.pathname + url.search + (rest ? "#" + rest : ""));
      if ($("token")) $("token").value = t;
    }
    const g = parseInt(url.searchParams.get("group") || "", 10);
    if (g > 0) state.selected = g;
  }

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    const t = token();
    if (t) h.Authorization = "Bearer " + t;
    return h;
  }

  // the controller's one-sentence error ({"error", "detail"}) of an answer that is not ok
  async function httpError(r) {
    let message = r.status + " " + r.statusText;
    try { message = (await r.json()).error || message; } catch (e) { /* not JSON */ }
    return new HttpError(r.status, message);
  }

  async function getJson(path) {
    const r = await fetch(path, { headers: headers(), cache: "no-store" });
    if (!r.ok) throw await httpError(r);
    return r.json();
  }

  const noRoute = (e) => e instanceof HttpError && e.status === 404 && /no such route/.test(e.message);
  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

  // -- status line and errors ---------------------------------------------------------------
  const MODES = {
    starting: "starting",
    connecting: "connecting… (polling)",
    stream: "live (event stream)",
    polling: "live (polling every 0.5 s)",
    reconnecting: "reconnecting…",
    offline: "controller not answering",
    unauthorized: "token refused",
  };

  function setMode(mode) {
    state.mode = mode;
    const el = $("status");
    el.dataset.mode = mode;
    el.textContent = MODES[mode] || mode;
  }

  function showError(text) {
    state.error = text || "";
    const el = $("error");
    el.hidden = !text;
    el.textContent = text || "";
  }

  // -- the graph ------------------------------------------------------------------------
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue("--" + name).trim();
  const swId = (dpid) => "s" + dpid;
  const hostId = (ip) => "h" + ip;
  const linkId = (l) => "l" + l.a + "." + l.a_port + "-" + l.b + "." + l.b_port;
  const hostEdgeId = (h) => "e" + h.ip + "@" + h.dpid + "." + h.port;
  const swLabel = (dpid) => (dpid < 1e6 ? "s" + dpid : "0x" + dpid.toString(16));

  function makeGraph() {
    return cytoscape({
      container: $("graph"),
      boxSelectionEnabled: false,
      minZoom: 0.05,
      maxZoom: 3,
      style: [
        { selector: "node", style: { label: "data(label)", "font-size": 11, "text-valign": "center",
          "text-halign": "center", "min-zoomed-font-size": 6 } },
        { selector: "node[kind = 'switch']", style: { shape: "round-rectangle", width: 48, height: 26,
          "background-color": css("switch"), color: "#fff" } },
        { selector: "node[kind = 'switch'].in-tree", style: { "border-width": 3, "border-color": css("tree") } },
        { selector: "node[kind = 'host']", style: { width: 16, height: 16, "background-color": css("host"),
          "text-valign": "bottom", "text-margin-y": 4, color: css("muted"), "font-size": 10 } },
        { selector: "node.source", style: { width: 22, height: 22, "background-color": css("source") } },
        { selector: "node.rx-installed", style: { width: 22, height: 22, "background-color": css("installed") } },
        { selector: "node.rx-pending", style: { width: 22, height: 22, "background-color": css("pending") } },
        { selector: "node.rx-unreachable", style: { width: 22, height: 22, "background-color": css("unreachable") } },
        { selector: "edge", style: { "curve-style": "bezier", width: 2, "line-color": css("l0"), "arrow-scale": 1.2 } },
        { selector: "edge[kind = 'hostlink']", style: { width: 1.5 } },
        { selector: "edge.load1", style: { width: 3, "line-color": css("l1") } },
        { selector: "edge.load2", style: { width: 4, "line-color": css("l2") } },
        { selector: "edge.load4", style: { width: 6, "line-color": css("l4") } },
        { selector: "edge.tree", style: { width: 6, "line-color": css("tree"), "z-index": 10,
          "target-arrow-color": css("tree"), "source-arrow-color": css("tree") } },
        { selector: "edge.tree-fwd", style: { "target-arrow-shape": "triangle" } },
        { selector: "edge.tree-rev", style: { "source-arrow-shape": "triangle" } },
        { selector: "edge.down", style: { "line-color": css("down"), "line-style": "dashed", width: 2,
          "target-arrow-color": css("down"), "source-arrow-color": css("down") } },
        { selector: ":selected", style: { "overlay-color": css("tree"), "overlay-opacity": 0.2 } },
      ],
    });
  }

  let cy = null;

  // Layers from the hosts up: host switches at the bottom (hosts under them), every other
  // switch as many rows above as it is hops away; a leaf-spine or fat-tree reads as one.
  function positions(topo) {
    const dpids = topo.switches.slice().sort((a, b) => a - b);
    const adj = new Map(dpids.map((d) => [d, []]));
    for (const l of topo.links) {
      if (adj.has(l.a) && adj.has(l.b)) { adj.get(l.a).push(l.b); adj.get(l.b).push(l.a); }
    }
    const hostsOf = new Map();
    const loose = [];
    for (const h of topo.hosts) {
      if (adj.has(h.dpid)) (hostsOf.get(h.dpid) || hostsOf.set(h.dpid, []).get(h.dpid)).push(h);
      else loose.push(h);
    }
    let roots = dpids.filter((d) => hostsOf.has(d));
    if (!roots.length && dpids.length) roots = [dpids[0]];
    const level = new Map(roots.map((d) => [d, 0]));
    const queue = roots.slice();
    while (queue.length) {
      const d = queue.shift();
      for (const n of adj.get(d)) if (!level.has(n)) { level.set(n, level.get(d) + 1); queue.push(n); }
    }
    let top = Math.max(0, ...level.values());
    for (const d of dpids) if (!level.has(d)) level.set(d, top + 1);
    top = Math.max(0, ...level.values());
    const ROW = 140, HOST = 64, SW = 96, GAP = 24;
    const y = (lv) => (top - lv) * ROW;
    const pos = {};
    let x = 0;
    for (const d of dpids.filter((v) => level.get(v) === 0)) {
      const hs = (hostsOf.get(d) || []).sort((a, b) => ipKey(a.ip) - ipKey(b.ip));
      const width = Math.max(hs.length * HOST, SW);
      hs.forEach((h, i) => { pos[hostId(h.ip)] = { x: x + (width - hs.length * HOST) / 2 + (i + 0.5) * HOST, y: y(0) + 100 }; });
      pos[swId(d)] = { x: x + width / 2, y: y(0) };
      x += width + GAP;
    }
    loose.forEach((h, i) => { pos[hostId(h.ip)] = { x: x + i * HOST, y: y(0) + 100 }; });
    const width = Math.max(x - GAP, SW);
    for (let lv = 1; lv <= top; lv++) {
      const row = dpids.filter((d) => level.get(d) === lv);
      const centre = (d) => {
        const below = adj.get(d).map((n) => pos[swId(n)]).filter(Boolean);  // (rows below are placed)
        return below.length ? below.reduce((s, p) => s + p.x, 0) / below.length : width / 2;
      };
      row.sort((a, b) => centre(a) - centre(b) || a - b);
      row.forEach((d, i) => { pos[swId(d)] = { x: ((i + 0.5) * width) / row.length, y: y(lv) }; });
    }
    return pos;
  }

  function ipKey(ip) {
    return ip.split(".").reduce((n, o) => n * 256 + Number(o), 0);
  }

  // The physical links of a group's tree: each tree link (parent, child) is the link
  // between the two whose ends are the parent's out port and the child's in port (one
  // of parallel links), and the host links to its source and its receivers.
  // Map element id -> "fwd" (drawn source is upstream) or "rev".
  function treeEdges(g, index) {
    const out = new Map();
    const t = g && g.tree;
    if (!t) return out;
    const outPorts = t.out_ports || {};
    const inPorts = t.in_ports || {};
    const portOf = (l, d) => (l.a === d ? l.a_port : l.b_port);
    for (const [p, c] of t.links || []) {
      const cands = index.between.get(Math.min(p, c) + "-" + Math.max(p, c)) || [];
      const best = cands.find((l) => (outPorts[p] || []).includes(portOf(l, p)) && inPorts[c] === portOf(l, c))
        || cands.find((l) => l.up) || cands[0];
      if (best) out.set(linkId(best), best.a === p ? "fwd" : "rev");
    }
    const src = index.hosts.get(g.source);
    if (src && inPorts[src.dpid] === src.port) out.set(hostEdgeId(src), "rev");
    for (const ip of Object.keys(g.receivers || {})) {
      const h = index.hosts.get(ip);
      if (h && (outPorts[h.dpid] || []).includes(h.port)) out.set(hostEdgeId(h), "fwd");
    }
    return out;
  }

  function indexTopology(topo) {
    const between = new Map();
    for (const l of topo.links) {
      const k = Math.min(l.a, l.b) + "-" + Math.max(l.a, l.b);
      (between.get(k) || between.set(k, []).get(k)).push(l);
    }
    return { between: between, hosts: new Map(topo.hosts.map((h) => [h.ip, h])) };
  }

  const loadClass = (n) => (n >= 4 ? "load4" : n >= 2 ? "load2" : n === 1 ? "load1" : "load0");

  function selectedGroup() {
    return state.groups.find((g) => g.id === state.selected) || null;
  }

  function draw() {
    const topo = state.topo;
    const index = indexTopology(topo);
    const load = new Map();
    const users = new Map();
    for (const g of state.groups) {
      for (const id of treeEdges(g, index).keys()) {
        load.set(id, (load.get(id) || 0) + 1);
        (users.get(id) || users.set(id, []).get(id)).push(g.id);
      }
    }
    const group = selectedGroup();
    const tree = treeEdges(group, index);
    const treeSwitches = new Set(group && group.tree ? group.tree.switches : []);
    const ids = new Set(topo.switches);
    const els = new Map();
    const add = (group_, data, classes) => els.set(data.id, { group: group_, data: data, classes: classes });
    for (const d of topo.switches) {
      add("nodes", { id: swId(d), kind: "switch", dpid: d, label: swLabel(d) }, treeSwitches.has(d) ? "in-tree" : "");
    }
    const rx = group ? group.receivers || {} : {};
    for (const h of topo.hosts) {
      let cls = "";
      if (group && h.ip === group.source) cls = "source";
      else if (rx[h.ip]) cls = "rx-" + rx[h.ip];
      add("nodes", { id: hostId(h.ip), kind: "host", ip: h.ip, label: h.ip }, cls);
      if (ids.has(h.dpid)) {
        const id = hostEdgeId(h);
        const n = load.get(id) || 0;
        add("edges", { id: id, kind: "hostlink", source: swId(h.dpid), target: hostId(h.ip), ip: h.ip,
          dpid: h.dpid, port: h.port, load: n }, loadClass(n) + (tree.has(id) ? " tree tree-" + tree.get(id) : ""));
      }
    }
    for (const l of topo.links) {
      if (!ids.has(l.a) || !ids.has(l.b)) continue;
      const id = linkId(l);
      const n = load.get(id) || 0;
      const cls = [loadClass(n)];
      if (tree.has(id)) cls.push("tree", "tree-" + tree.get(id));
      if (!l.up) cls.push("down");
      add("edges", { id: id, kind: "link", source: swId(l.a), target: swId(l.b), a: l.a, a_port: l.a_port,
        b: l.b, b_port: l.b_port, up: l.up, lost: !!l.lost, load: n, users: users.get(id) || [] }, cls.join(" "));
    }
    cy.batch(() => {
      cy.elements().forEach((e) => { if (!els.has(e.id())) cy.remove(e); });
      for (const [id, el] of els) {
        let e = cy.getElementById(id);
        if (e.empty()) e = cy.add({ group: el.group, data: el.data });
        else e.data(el.data);
        e.classes(el.classes);
      }
    });
    const key = cy.nodes().map((n) => n.id()).sort().join(",") + "|" + topo.links.length;
    if (key !== state.layoutKey) {
      state.layoutKey = key;
      const pos = positions(topo);
      cy.nodes().forEach((n) => { if (pos[n.id()]) n.position(pos[n.id()]); });
      cy.fit(undefined, 30);
    }
    state.draws += 1;
    state.drawnAt = Date.now();
    drawGroupChoice();
    drawReceivers(group);
    $("summary").textContent = topo.switches.length + " switches · " + topo.links.filter((l) => l.up).length
      + "/" + topo.links.length + " links up · " + topo.hosts.length + " hosts · " + state.groups.length + " groups";
  }

  function drawGroupChoice() {
    const sel = $("group");
    const wanted = [["", "(none)"]].concat(state.groups.map((g) => [String(g.id),
      g.id + ": " + g.model + " from " + g.source + " (" + Object.keys(g.receivers || {}).length + " receivers, "
      + g.state + ")"]));
    if (state.selected && !state.groups.some((g) => g.id === state.selected)) {
      wanted.push([String(state.selected), state.selected + ": (no such group)"]);
    }
    const have = Array.from(sel.options).map((o) => [o.value, o.textContent]);
    if (JSON.stringify(have) !== JSON.stringify(wanted)) {
      sel.replaceChildren(...wanted.map(([v, t]) => new Option(t, v)));
    }
    sel.value = state.selected ? String(state.selected) : "";
  }

  // "s3 3→1 (120 pkts)": switch, in port → out port, and the packets its bucket towards the
  // out port sent (else its (S,G) flow matched), as the switch said at the trace
  function hopText(hop) {
    let s = swLabel(hop.dpid) + " " + hop.in_port + "→" + hop.out_port;
    const c = hop.counters || {};
    const count = c.bucket || c.flow;
    if (count && typeof count.packets === "number") s += " (" + count.packets + " pkts)";
    return s;
  }

  function drawReceivers(group) {
    const body = $("receivers").tBodies[0];
    const traced = new Map(((state.trace && state.trace.group === state.selected && state.trace.receivers) || [])
      .map((r) => [r.ip, r]));
    const rows = Object.entries(group ? group.receivers || {} : {}).map(([ip, st]) => {
      const tr = document.createElement("tr");
      const t = traced.get(ip);
      const why = t ? [t.why, (t.hops || []).map(hopText).join(" · ")].filter(Boolean).join(": ") : "";
      for (const [text, cls] of [[ip, ""], [st, "state " + st], [why, "why"]]) {
        const td = document.createElement("td");
        if (cls.startsWith("state")) {
          const span = document.createElement("span");
          span.className = cls;
          span.textContent = text;
          td.appendChild(span);
        } else {
          td.textContent = text;
          td.className = cls;
        }
        tr.appendChild(td);
      }
      tr.dataset.ip = ip;
      return tr;
    });
    body.replaceChildren(...rows);
  }

  function describe(e) {
    const d = e.data();
    if (d.kind === "link") {
      const up = d.up ? "up" : d.lost ? "DOWN (the controller no longer lists it)" : "DOWN";
      const inTree = e.hasClass("tree") ? " · in group " + state.selected + "'s tree" : "";
      return swLabel(d.a) + " port " + d.a_port + " — " + swLabel(d.b) + " port " + d.b_port + " · " + up
        + " · used by " + d.load + " tree(s)" + (d.users.length ? " (groups " + d.users.join(", ") + ")" : "")
        + inTree;
    }
    if (d.kind === "hostlink") return d.ip + " on " + swLabel(d.dpid) + " port " + d.port + " · used by " + d.load + " tree(s)";
    if (d.kind === "switch") return "switch " + swLabel(d.dpid) + " (dpid " + d.dpid + ")";
    const g = selectedGroup();
    const role = g && g.source === d.ip ? "source of group " + g.id
      : g && g.receivers && g.receivers[d.ip] ? "receiver of group " + g.id + ": " + g.receivers[d.ip] : "host";
    return d.ip + " · " + role;
  }

  // -- the event timeline ---------------------------------------------------------------------
  function concerns(ev, gid) {
    if (ev.group === gid) return true;
    const listed = ev.groups || [];
    return listed.includes(gid) || (ev.group_count || 0) > listed.length;
  }

  function shown(ev) {
    if (!$("only-group").checked || !state.selected) return true;
    return concerns(ev, state.selected) || (ev.group == null && !ev.groups);
  }

  function fieldText(v) {
    const s = typeof v === "string" ? v : JSON.stringify(v);
    return s.length > 140 ? s.slice(0, 137) + "…" : s;
  }

  function clock(t) {
    const d = new Date(t * 1000);
    const p = (n, w) => String(n).padStart(w || 2, "0");
    return p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds()) + "." + p(d.getMilliseconds(), 3);
  }

  function addEvent(ev, fresh) {
    if (ev.id <= state.lastEvent) return;
    state.lastEvent = ev.id;
    state.eventCount += 1;
    const li = document.createElement("li");
    li.className = (BAD.has(ev.kind) ? "bad" : WARN.has(ev.kind) ? "warn" : GOOD.has(ev.kind) ? "good" : "")
      + (fresh ? " fresh" : "");
    li.dataset.id = ev.id;
    li.dataset.kind = ev.kind;
    li.event = ev;
    const time = document.createElement("time");
    time.textContent = clock(ev.time);
    const kind = document.createElement("span");
    kind.className = "kind";
    kind.textContent = ev.kind;
    const parts = [];
    if (ev.group != null) parts.push("group " + ev.group);
    if (ev.groups) parts.push("groups " + ev.groups.join(",") + (ev.group_count > ev.groups.length ? " … (" + ev.group_count + ")" : ""));
    for (const [k, v] of Object.entries(ev)) if (!HIDDEN_FIELDS.has(k)) parts.push(k + "=" + fieldText(v));
    const fields = document.createElement("span");
    fields.className = "fields";
    fields.textContent = parts.join(" ");
    li.append(time, kind, fields);
    li.hidden = !shown(ev);
    const list = $("events");
    list.prepend(li);
    while (list.children.length > MAX_EVENTS) list.lastElementChild.remove();
  }

  function refilterEvents() {
    for (const li of $("events").children) li.hidden = !shown(li.event);
  }

  // -- following the controller ----------------------------------------------------------------
  let refreshing = null;
  let again = false;
  let refreshTimer = null;

  function scheduleRefresh(delay) {
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => { refreshTimer = null; refresh().catch(() => {}); }, delay || 0);
  }

  // one read of everything at a time; a request during one makes one more after it
  function refresh() {
    if (refreshing) { again = true; return refreshing; }
    refreshing = readAll().then(() => showError(""), failed).finally(() => {
      refreshing = null;
      if (again) { again = false; refresh().catch(() => {}); }
    });
    return refreshing;
  }

  async function readAll() {
    const [topo, groups] = await Promise.all([getJson("/v1/topology"), getJson("/v1/groups")]);
    state.topo = withLostLinks(topo);
    state.groups = groups;
    if (state.selected == null && groups.length && !state.choseNone) state.selected = groups[0].id;
    const g = selectedGroup();
    const key = g ? JSON.stringify([g.tree, g.receivers]) : "";
    await readTrace(key !== state.traceKey);  // (a new tree: its path now, not in 2 s)
    state.traceKey = key;
    draw();
  }

  // A cut link is forgotten by the controller (its port went down): the page keeps drawing
  // it, down, until it is back, its port holds another link or one of its switches left.
  function withLostLinks(topo) {
    const links = new Map(topo.links.map((l) => [linkId(l), l]));
    const ports = new Set(topo.links.flatMap((l) => [l.a + "." + l.a_port, l.b + "." + l.b_port]));
    const switches = new Set(topo.switches);
    for (const [id, l] of state.seenLinks) {
      if (!links.has(id) && switches.has(l.a) && switches.has(l.b)
          && !ports.has(l.a + "." + l.a_port) && !ports.has(l.b + "." + l.b_port)) {
        links.set(id, Object.assign({}, l, { up: false, lost: true }));
      }
    }
    state.seenLinks = links;
    return Object.assign({}, topo, { links: Array.from(links.values()) });
  }

  async function readTrace(force) {
    const gid = state.selected;
    if (!gid || !state.traceOffered || !state.groups.some((g) => g.id === gid)) { state.trace = null; return; }
    if (!force && state.trace && state.trace.group === gid && Date.now() - state.traceAt < TRACE_MS) return;
    try {
      state.trace = await getJson("/v1/groups/" + gid + "/trace");
      state.traceAt = Date.now();
    } catch (e) {
      if (noRoute(e)) state.traceOffered = false;
      else if (isRefusal(e)) throw e;
      state.trace = null;
    }
  }

  const isRefusal = (e) => e instanceof HttpError && e.status === 401;

  // a 401: stop following until the token changes
  function refused(e) {
    if (state.mode === "unauthorized") return;
    setMode("unauthorized");
    showError("The controller refused the token (" + e.message + "). Enter a valid token, or forget it "
      + "to read anonymously.");
    state.generation += 1;
    if (state.abort) state.abort.abort();
  }

  function failed(e) {
    if (isRefusal(e)) refused(e);
    else showError("Cannot read the controller: " + e.message);
    throw e;
  }

  // events since the last one seen; a restarted controller counts from 1 again
  async function readEvents() {
    if (!state.eventsOffered) return false;
    let answer;
    try {
      answer = await getJson("/v1/events?since=" + state.lastEvent);
    } catch (e) {
      if (noRoute(e)) { state.eventsOffered = false; return false; }
      throw e;
    }
    if (answer.last < state.lastEvent) {
      state.lastEvent = 0;
      return readEvents();
    }
    const fresh = state.eventCount > 0;
    for (const ev of answer.events || []) addEvent(ev, fresh);
    return (answer.events || []).length > 0;
  }

  // The stream, read with fetch so the token goes in a header: "id:", "event:", "data:"
  // lines, a blank line ending each message, ":" lines keeping the connection alive.
  async function stream(gen) {
    const abort = new AbortController();
    state.abort = abort;
    const r = await fetch("/v1/events/stream?since=" + state.lastEvent,
      { headers: headers({ Accept: "text/event-stream" }), cache: "no-store", signal: abort.signal });
    if (r.status === 404) { state.streamOffered = false; return; }
    if (!r.ok) throw await httpError(r);
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    while (gen === state.generation) {
      const { value, done } = await reader.read();
      if (done) return;
      if (state.mode !== "stream") { setMode("stream"); showError(""); }  // (bytes arrive: it is live)
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, ""));
        if (!data.length) continue;
        let ev;
        try { ev = JSON.parse(data.join("\n")); } catch (e) { continue; }
        if (ev.id < state.lastEvent) state.lastEvent = 0;  // (a restarted controller)
        addEvent(ev, true);
        scheduleRefresh(30);
      }
    }
    abort.abort();
  }

  // One read of events and state; the timer runs it every POLL_MS whenever the stream
  // is not delivering (connecting through a buffering proxy, reconnecting, not offered).
  let polling = false;
  async function poll() {
    if (polling) return;
    polling = true;
    try {
      await readEvents();
      await refresh();
    } catch (e) {
      if (isRefusal(e)) refused(e);
      else if (!state.error) showError("Cannot read the controller: " + e.message);
    } finally {
      polling = false;
    }
  }

  async function follow() {
    const gen = ++state.generation;
    if (state.abort) state.abort.abort();
    setMode("connecting");
    while (gen === state.generation) {
      try {
        await readEvents();
        await refresh();
        if (gen !== state.generation) return;
        if (!state.eventsOffered || !state.streamOffered) { setMode("polling"); return; }
        setMode("connecting");  // (the timer polls until the stream's first bytes)
        await stream(gen);
        if (gen !== state.generation) return;
        if (!state.streamOffered) { setMode("polling"); return; }
        setMode("reconnecting");
        await sleep(500);
      } catch (e) {
        if (isRefusal(e)) refused(e);
        if (gen !== state.generation) return;
        if (e.name !== "AbortError") {
          setMode(e instanceof HttpError ? "reconnecting" : "offline");
          if (!state.error) showError("Cannot read the controller: " + e.message);
        }
        await sleep(1000);
      }
    }
  }

  // -- wiring ---------------------------------------------------------------------------
  function select(value) {
    state.selected = value ? parseInt(value, 10) : null;
    state.choseNone = !value;
    const url = new URL(location.href);
    if (state.selected) url.searchParams.set("group", state.selected); else url.searchParams.delete("group");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
    refilterEvents();
    draw();
    readTrace(true).then(draw, () => {});
  }

  function start() {
    takeUrlParameters();
    cy = makeGraph();
    cy.on("tap", "node, edge", (evt) => { $("detail").textContent = describe(evt.target); });
    cy.on("tap", (evt) => { if (evt.target === cy) $("detail").textContent = ""; });
    window.addEventListener("resize", () => { cy.resize(); cy.fit(undefined, 30); });
    $("group").addEventListener("change", (evt) => select(evt.target.value));
    $("only-group").addEventListener("change", refilterEvents);
    $("token").value = token();
    // a #token= given to the open page (the browser does not reload it for a fragment)
    window.addEventListener("hashchange", () => {
      if (new URLSearchParams(location.hash.slice(1)).has("token")) { takeUrlParameters(); showError(""); follow(); }
    });
    $("token-form").addEventListener("submit", (evt) => {
      evt.preventDefault();
      const t = $("token").value.trim();
      if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
      showError("");
      follow();
    });
    $("token-clear").addEventListener("click", () => {
      sessionStorage.removeItem(TOKEN_KEY);
      $("token").value = "";
      showError("");
      follow();
    });
    // the trace's counters and anything no event announces
    setInterval(() => {
      if (state.mode === "stream" && state.selected) readTrace(false).then(() => drawReceivers(selectedGroup()), () => {});
    }, TRACE_MS);
    setInterval(() => { if (state.mode === "stream") refresh().catch(() => {}); }, RESYNC_MS);
    setInterval(() => { if (!["stream", "unauthorized", "starting"].includes(state.mode)) poll(); }, POLL_MS);
    follow();
  }

  // What the page shows, for tests and the curious: read from the drawn graph.
  window.modelcastView = {
    get cy() { return cy; },
    snapshot() {
      const ext = cy.extent();
      const inside = (p) => p.x >= ext.x1 && p.x <= ext.x2 && p.y >= ext.y1 && p.y <= ext.y2;
      const pair = (e) => (e.hasClass("tree-fwd") ? [e.data("a"), e.data("b")] : [e.data("b"), e.data("a")]);
      return {
        mode: state.mode,
        error: state.error,
        selected: state.selected,
        lastEvent: state.lastEvent,
        events: Array.from($("events").children).map((li) => li.event),
        draws: state.draws,
        switches: cy.nodes("[kind = 'switch']").map((n) => n.data("dpid")),
        hosts: Object.fromEntries(cy.nodes("[kind = 'host']").map((n) => [n.data("ip"), n.classes().join(" ")])),
        links: cy.edges("[kind = 'link']").map((e) => ({ a: e.data("a"), a_port: e.data("a_port"), b: e.data("b"),
          b_port: e.data("b_port"), up: !e.hasClass("down"), load: e.data("load") })),
        tree: cy.edges("[kind = 'link'].tree").map(pair),
        hostTree: cy.edges("[kind = 'hostlink'].tree").map((e) => e.data("ip")),
        receivers: Object.fromEntries(Array.from($("receivers").tBodies[0].rows).map((tr) =>
          [tr.dataset.ip, { state: tr.cells[1].textContent, path: tr.cells[2].textContent }])),
        offscreen: cy.nodes().filter((n) => !inside(n.position())).map((n) => n.id()),
      };
    },
  };

  if (typeof cytoscape === "undefined") {
    document.addEventListener("DOMContentLoaded", () => showError(
      "The graph library did not load (vendor/cytoscape.min.js): this install was built without "
      + "scripts/vendor-ui.sh."));
  } else if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
