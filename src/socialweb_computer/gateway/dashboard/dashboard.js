// The dashboard's only script: renders /api/overview and follows /api/overview/stream.
// Everything is written with textContent (never innerHTML), so no value from a cluster can
// become markup. Ages are computed here from timestamps, so they move between pushes.
"use strict";

const $ = (id) => document.getElementById(id);

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function age(stamp) {
  const then = Date.parse(stamp);
  if (!stamp || Number.isNaN(then)) return "";
  const s = Math.max(0, Math.floor((Date.now() - then) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

function bytes(n) {
  if (n < 0) return "unknown";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function fill(tableId, rows, columns, emptyText) {
  const body = $(tableId).tBodies[0];
  const fresh = document.createElement("tbody");
  if (rows.length === 0) {
    const tr = el("tr");
    const td = el("td", emptyText, "empty");
    td.colSpan = $(tableId).tHead.rows[0].cells.length;
    tr.append(td);
    fresh.append(tr);
  }
  for (const row of rows) {
    const tr = el("tr");
    for (const column of columns) {
      const [text, cls] = column(row);
      tr.append(el("td", text, cls));
    }
    fresh.append(tr);
  }
  body.replaceWith(fresh);
}

function podSummary(pods) {
  const parts = Object.entries(pods || {}).filter(([, n]) => n > 0).map(([phase, n]) => `${n} ${phase}`);
  return parts.length ? parts.join(", ") : "none";
}

function tile(value, label) {
  const box = el("div", undefined, "tile");
  box.append(el("b", value), el("span", label));
  return box;
}

function renderSummary(doc) {
  const ready = doc.clusters.filter((c) => c.phase === "Ready").length;
  const nodesReady = doc.nodes.filter((n) => n.ready === "True").length;
  const summary = $("summary");
  summary.replaceChildren(
    tile(`${ready}/${doc.clusters.length}`, "clusters Ready"),
    tile(`${nodesReady}/${doc.nodes.length}`, "nodes Ready"),
    tile(doc.pendingTotal, "pods pending"),
    tile(doc.capacity ? `${doc.capacity.warmPool.size}` : "—", "warm nodes"),
  );
}

function renderCapacity(capacity) {
  const box = $("capacity");
  if (!capacity) {
    box.replaceChildren(el("p", "no capacity controller: nodes are not rented, and there is no host " +
      "budget or warm pool to show yet.", "note"));
    box.firstChild.id = "no-capacity";
    return;
  }
  const parts = [];
  if (capacity.bidder !== undefined) {
    parts.push(el("p", capacity.bidder === "none" || !capacity.bidder
      ? "bidder: none (capacity.bidder in the gateway spec): no node is rented"
      : `bidder: ${capacity.bidder}`));
  }
  for (const b of capacity.budget) {
    const line = el("div");
    const bar = el("span", undefined, "bar");
    const inner = el("i");
    inner.style.width = `${b.total ? Math.min(100, (100 * b.used) / b.total) : 0}%`;
    bar.append(inner);
    line.append(el("span", `${b.resource}: ${b.used} of ${b.total} ${b.unit} used, ${b.free} free `), bar);
    parts.push(line);
  }
  parts.push(el("p", `warm pool: ${capacity.warmPool.size} of ${capacity.warmPool.target}`));
  const table = el("table");
  const head = el("tr");
  for (const h of ["Node", "Cluster", "Bidder", "State", "Size", "Since", "Why"]) head.append(el("th", h));
  table.append(head);
  for (const n of capacity.nodes) {
    const tr = el("tr");
    for (const v of [n.name, n.cluster || "(warm)", n.bidder, n.state, `${n.vcpu} vCPU, ${n.memMiB} MiB`,
      age(n.since), n.reason]) tr.append(el("td", v));
    table.append(tr);
  }
  parts.push(table);
  box.replaceChildren(...parts);
}

function render(doc) {
  $("version").textContent = `gateway ${doc.gateway.version}`;
  renderSummary(doc);
  fill("clusters", doc.clusters, [
    (c) => [c.name],
    (c) => [c.phase || "—", `phase-${c.phase}`],
    (c) => [c.url, "mono"],
    (c) => [c.nodes],
    (c) => [podSummary(c.pods)],
  ], "no clusters: create one with kubectl apply on the admin plane");
  fill("nodes", doc.nodes, [
    (n) => [n.cluster],
    (n) => [n.name],
    (n) => [n.unschedulable ? `${n.ready}, cordoned` : n.ready, `ready-${n.ready}`],
    (n) => [n.bidder || "—"],
    (n) => [n.size || "—"],
    (n) => [n.image || "—"],
    (n) => [age(n.created)],
    (n) => [n.pods.length ? n.pods.join(", ") : "nothing"],
  ], "no nodes: a node is rented when a pod needs one");
  fill("pending", doc.pending, [
    (p) => [p.cluster],
    (p) => [`${p.namespace}/${p.name}`],
    (p) => [age(p.created)],
    (p) => [p.reason],
  ], "no pod is waiting");
  renderCapacity(doc.capacity);
  fill("events", doc.events, [
    (e) => [age(e.time)],
    (e) => [e.cluster],
    (e) => [e.type, `type-${e.type}`],
    (e) => [e.reason],
    (e) => [e.object],
    (e) => [e.count > 1 ? `${e.message} (×${e.count})` : e.message],
  ], "no events yet");
  const s = doc.store;
  $("store").textContent = s ? `${s.backend}, ${bytes(s.sizeBytes)}, revision ${s.revision}, ` +
    `${s.commits.count} commits (mean ${(1000 * s.commits.meanSeconds).toFixed(2)} ms), ` +
    `${s.watches} watches` : "unknown";
  document.body.dataset.generated = doc.generatedAt;
}

function follow() {
  const live = $("live");
  const source = new EventSource("/api/overview/stream");
  source.addEventListener("overview", (event) => {
    latest = JSON.parse(event.data);
    render(latest);
    live.textContent = "live";
    live.className = "live on";
  });
  source.onerror = () => {
    live.textContent = "reconnecting…";
    live.className = "live off";
  };
}

let latest = null;
async function start() {
  try {
    const response = await fetch("/api/overview", { cache: "no-store" });
    latest = await response.json();
    render(latest);
  } catch (err) {
    $("live").textContent = "cannot reach the gateway";
  }
  follow();
  setInterval(() => { if (latest) render(latest); }, 5000);  // ages move between pushes
}

document.addEventListener("DOMContentLoaded", start);
