// The tierq dashboard: reads /v1/dashboard every REFRESH_MS with the key kept in this tab,
// draws one card per tier, the pool or the tenant's own figures, and two line charts of the
// last HISTORY_MS. With [pools] configured it also draws every pool and its workers (a
// tenant: its use of each pool); with one pool the page is as it was before pools. The
// fleet's page shows packing too: items/s per pool, items per run per kind.
// Beside it, a job explorer (#jobs?status=…) and a page per job (#job/<id>): the admin key
// searches and acts on every tenant's jobs, a tenant's key on its own.
// Plain DOM and canvas; no library, nothing loaded from elsewhere; data is set as text only.
(() => {
  "use strict";

  const REFRESH_MS = 2000;
  const HISTORY_MS = 5 * 60 * 1000;
  const MIN_SPAN_MS = 30 * 1000;
  const KEY_ITEM = "tierq.dashboard.key";
  const COLORS = ["#2f5bd3", "#e07b00", "#2e7d32", "#8e24aa", "#00838f", "#c62828"];
  const API = "v1/dashboard"; // relative: /v1/dashboard beside /dashboard, behind any prefix

  const $ = (id) => document.getElementById(id);
  const samples = []; // [{t, queued: {tier: n}, inflight: {name: n}}], oldest first
  let refreshes = 0; // answers drawn since the page opened (body[data-refreshes])
  let timer = null;

  // -- the key ------------------------------------------------------------------------------

  function keyFromFragment() {
    const match = /(?:^#|&)key=([^&]+)/.exec(window.location.hash);
    if (!match) return;
    sessionStorage.setItem(KEY_ITEM, decodeURIComponent(match[1]));
    window.history.replaceState(null, "", window.location.pathname);
  }

  function askForKey(message) {
    sessionStorage.removeItem(KEY_ITEM);
    if (timer !== null) clearTimeout(timer);
    timer = null;
    viewKind = null;
    stopJobTimer();
    for (const id of ["board", "explorer", "job-page", "nav"]) $(id).hidden = true;
    $("forget-key").hidden = true;
    $("key-form").hidden = false;
    $("key-error").hidden = !message;
    $("key-error").textContent = message || "";
    $("view-name").textContent = "";
    setStatus("idle", "not connected");
    $("key-input").focus();
  }

  function setStatus(state, text) {
    $("status").dataset.state = state;
    $("status").textContent = text;
  }

  // -- fetching -----------------------------------------------------------------------------

  async function refresh() {
    if (timer !== null) clearTimeout(timer);
    timer = null;
    const key = sessionStorage.getItem(KEY_ITEM);
    if (!key) return askForKey("");
    try {
      const answer = await fetch(API, {
        headers: { Authorization: "Bearer " + key, Accept: "application/json" },
        cache: "no-store",
      });
      if (answer.status === 401) return askForKey("That key is not known to this system.");
      const body = await answer.json();
      if (!answer.ok) {
        const error = body && body.error ? body.error.message : answer.statusText;
        setStatus("error", "figures unavailable: " + error);
      } else {
        render(body);
        setStatus("live", "updated " + new Date().toLocaleTimeString());
      }
    } catch (err) {
      setStatus("error", "cannot reach the API");
    }
    timer = setTimeout(refresh, REFRESH_MS);
  }

  // -- formatting ---------------------------------------------------------------------------

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    if (value < 10) return value.toFixed(1) + " s";
    if (value < 600) return Math.round(value) + " s";
    return (value / 60).toFixed(1) + " min";
  }

  function percent(fraction) {
    return Math.round(fraction * 100) + "%";
  }

  function level(fraction) {
    return fraction >= 1 ? "bad" : fraction >= 0.75 ? "warn" : "ok";
  }

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (name === "text") node.textContent = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(name, value);
    }
    for (const child of children) if (child) node.append(child);
    return node;
  }

  // A labelled figure with a bar: value / limit, coloured by how close it is to the limit.
  function metric(field, label, shown, fraction, limitText) {
    const bar = el("span", { dataset: { level: level(fraction) } });
    bar.style.width = Math.min(100, Math.max(0, fraction * 100)) + "%";
    return el("div", { class: "metric" },
      el("div", { class: "label" },
        el("span", { text: label }),
        el("span", {},
          el("b", { text: shown, dataset: { field } }),
          limitText ? document.createTextNode(" / " + limitText) : null)),
      el("div", { class: "bar" }, bar));
  }

  function color(index) {
    return COLORS[index % COLORS.length];
  }

  // -- cards --------------------------------------------------------------------------------

  function tierCard(tier, index, view) {
    const wait = tier.wait_p95_s === null ? 0 : tier.wait_p95_s / tier.max_wait_s;
    // The best tier's guarantee is 0 s (nothing can overtake it): its own max wait instead.
    const ageLimit = tier.ageing_guarantee_s > 0 ? tier.ageing_guarantee_s : tier.max_wait_s;
    const ageLabel = tier.ageing_guarantee_s > 0
      ? "oldest job / ageing guarantee" : "oldest job / max wait (best tier)";
    const age = tier.oldest_age_s === null ? 0 : tier.oldest_age_s / ageLimit;
    const refusals = el("ul", { class: "refusals", dataset: { field: "refusals" } });
    if (tier.refusals.length === 0) {
      refusals.append(el("li", { class: "none", text: "no refusals in the last "
        + Math.round(view.window_s / 60) + " min" }));
    }
    for (const r of tier.refusals) {
      refusals.append(el("li", {},
        el("span", { text: r.cause + " · " + r.limit }),
        el("span", { class: "count", text: String(r.count) })));
    }
    const swatch = el("span", { class: "swatch" });
    swatch.style.background = color(index);
    return el("article", { class: "card tier", dataset: { tier: tier.name } },
      el("h2", {},
        el("span", {}, swatch, document.createTextNode(tier.name)),
        el("small", { text: "tenant cap " + tier.tenant_cap })),
      metric("queued", "queued / bound", String(tier.queued), tier.queued / Math.max(1, tier.bound),
        String(tier.bound)),
      metric("oldest", ageLabel, seconds(tier.oldest_age_s), age, seconds(ageLimit)),
      metric("wait-p95", "wait p95 (p50 " + seconds(tier.wait_p50_s) + ", "
        + tier.waits_counted + " started) / max wait", seconds(tier.wait_p95_s), wait,
        seconds(tier.max_wait_s)),
      el("div", { class: "label" }, el("small", { text: view.view === "tenant"
        ? "your refusals" : "refusals", class: "hint" })),
      refusals);
  }

  function poolCard(pool, pooled) {
    return el("article", { class: "card pool", dataset: { card: "pool" } },
      el("h2", {}, el("span", { text: pooled ? "Pool " + pool.name : "Pool" }),
        el("small", { text: pool.service_measured ? "service time measured" : "configured service time" })),
      metric("inflight", "in flight / capacity", String(pool.inflight), pool.utilisation,
        String(pool.capacity)),
      el("div", { class: "pool-grid" },
        el("div", { class: "metric" }, el("div", { class: "label" },
          el("span", { text: "utilisation" }),
          el("b", { text: percent(pool.utilisation), dataset: { field: "utilisation" } }))),
        el("div", { class: "metric" }, el("div", { class: "label" },
          el("span", { text: "μ (jobs/s)" }),
          el("b", { text: pool.service_rate.toFixed(2), dataset: { field: "service-rate" } }))),
        el("div", { class: "metric" }, el("div", { class: "label" },
          el("span", { text: "mean service time" }),
          el("b", { text: seconds(pool.mean_service_s), dataset: { field: "service-time" } })))),
      el("div", { class: "hint", dataset: { field: "workers" },
        text: workersText(pool.workers || []) }));
  }

  // "cuda:0 (80 GiB)": a worker's device, with its memory on a GPU.
  function deviceText(worker) {
    const memory = worker.memory_bytes
      ? ` (${Math.round(worker.memory_bytes / 2 ** 30)} GiB)` : "";
    return worker.device + memory;
  }

  // "2 workers: 1 slot on cuda:0 (80 GiB), 4 slots on cpu": what the pool is made of.
  function workersText(workers) {
    if (!workers.length) return "no live workers";
    const byDevice = new Map();
    for (const w of workers) {
      const device = deviceText(w);
      byDevice.set(device, (byDevice.get(device) || 0) + w.slots);
    }
    const parts = [...byDevice].map(([device, slots]) =>
      `${slots} slot${slots === 1 ? "" : "s"} on ${device}`);
    return `${workers.length} worker${workers.length === 1 ? "" : "s"}: ${parts.join(", ")}`;
  }

  // Every pool: its kinds, its live workers, its load and μ; then each live worker's pool.
  function poolsCard(pools, workers) {
    const rows = pools.map((p) => el("tr", { dataset: { pool: p.name } },
      el("td", { text: p.name }),
      el("td", p.kinds === null ? { class: "hint", text: "every other kind" }
        : { text: p.kinds.join(", ") || "none" }),
      el("td", p.live_workers === 0
        ? { class: "num warn", text: "no live worker", dataset: { field: "live-workers" } }
        : { class: "num", text: String(p.live_workers), dataset: { field: "live-workers" } }),
      el("td", { class: "num", text: p.inflight + " / " + p.capacity,
        dataset: { field: "inflight" } }),
      el("td", { class: "num", text: percent(p.utilisation) }),
      el("td", { class: "num", text: p.service_rate.toFixed(2) })));
    const card = el("article", { class: "card pools", dataset: { card: "pools" } },
      el("h2", {}, el("span", { text: "Pools" }),
        el("small", { text: pools.length + " pools" })),
      el("table", { dataset: { table: "pools" } },
        el("thead", {}, el("tr", {},
          el("th", { text: "pool" }), el("th", { text: "kinds" }),
          el("th", { class: "num", text: "live workers" }),
          el("th", { class: "num", text: "in flight / capacity" }),
          el("th", { class: "num", text: "utilisation" }),
          el("th", { class: "num", text: "μ (jobs/s)" }))),
        el("tbody", {}, ...rows)));
    if (workers.length === 0) {
      card.append(el("p", { class: "empty", text: "no live workers" }));
      return card;
    }
    const lines = workers.map((w) => el("tr", { dataset: { worker: w.id, pool: w.pool } },
      el("td", { class: "id", text: w.id }), el("td", { text: w.pool }),
      el("td", { text: deviceText(w) }), el("td", { class: "num", text: String(w.slots) })));
    card.append(el("table", { dataset: { table: "workers" } },
      el("thead", {}, el("tr", {},
        el("th", { text: "worker" }), el("th", { text: "pool" }), el("th", { text: "device" }),
        el("th", { class: "num", text: "slots" }))),
      el("tbody", {}, ...lines)));
    return card;
  }

  function perSecond(value) {
    return value >= 100 ? String(Math.round(value)) : value.toFixed(value >= 10 ? 1 : 2);
  }

  // "3–4 items: 12 runs": one size bucket of a kind's runs (le null: past the largest bound).
  function sizeText(size, below) {
    const items = size.le === null ? "over " + below
      : size.le === below + 1 ? String(size.le) : (below + 1) + "–" + size.le;
    return items + (size.le === 1 ? " item: " : " items: ") + size.runs
      + (size.runs === 1 ? " run" : " runs");
  }

  // A kind's runs by size as a row of small bars, 1 item on the left; each says its count.
  function sizesBars(sizes) {
    const most = Math.max(1, ...sizes.map((size) => size.runs));
    const bars = el("span", { class: "sizes", dataset: { field: "sizes" } });
    let below = 0;
    const said = [];
    for (const size of sizes) {
      const text = sizeText(size, below);
      const bar = el("span", { title: text });
      if (size.runs === 0) bar.dataset.empty = "";
      else said.push(text);
      bar.style.height = Math.max(6, (size.runs / most) * 100) + "%";
      bars.append(bar);
      below = size.le === null ? below : size.le;
    }
    bars.setAttribute("title", said.join("\n") || "no runs");
    return bars;
  }

  // Packing: each pool's items started a second, each kind's items per run.
  function packingCard(packing, pooled) {
    const card = el("article", { class: "card packing", dataset: { card: "packing" } },
      el("h2", {}, el("span", { text: "Packing" }),
        el("small", { text: "items/s over the last " + seconds(packing.window_s) })));
    const pools = packing.pools.map((p) => el("tr", { dataset: { pool: p.pool } },
      el("td", { text: p.pool }),
      el("td", { class: "num", text: perSecond(p.items_per_s), dataset: { field: "items-per-s" } }),
      el("td", { class: "num", text: String(p.items_started) })));
    card.append(el("table", { dataset: { table: "pool-items" } },
      el("thead", {}, el("tr", {}, el("th", { text: "pool" }),
        el("th", { class: "num", text: "items/s" }),
        el("th", { class: "num", text: "items started" }))),
      el("tbody", {}, ...pools)));
    if (packing.kinds.length === 0) {
      card.append(el("p", { class: "empty", text: "no runs recorded yet" }));
      return card;
    }
    const kinds = packing.kinds.map((k) => el("tr", { dataset: { kind: k.kind, pool: k.pool } },
      el("td", { text: k.kind }), pooled ? el("td", { text: k.pool }) : null,
      el("td", { class: "num", text: String(k.runs) }),
      el("td", { class: "num", dataset: { field: "mean-items" }, text:
        k.mean_items_per_run === null ? "–" : k.mean_items_per_run.toFixed(1) }),
      el("td", {}, sizesBars(k.sizes))));
    card.append(el("table", { dataset: { table: "kind-runs" } },
      el("thead", {}, el("tr", {}, el("th", { text: "kind" }),
        pooled ? el("th", { text: "pool" }) : null,
        el("th", { class: "num", text: "runs" }),
        el("th", { class: "num", text: "items/run" }),
        el("th", { text: "runs by items (1 … 256+)" }))),
      el("tbody", {}, ...kinds)));
    return card;
  }

  function tenantsCard(tenants, pooled) {
    const card = el("article", { class: "card tenants", dataset: { card: "tenants" } },
      el("h2", {}, el("span", { text: "Tenants nearest their cap" })));
    if (tenants.length === 0) {
      card.append(el("p", { class: "empty", text: "no tenant has jobs in flight" }));
      return card;
    }
    // With pools, a tenant's cap and in-flight count are per pool: one row per pool it uses.
    const rows = tenants.map((t) => el("tr", { dataset: { tenant: t.name, pool: t.pool } },
      el("td", { text: t.name }), pooled ? el("td", { text: t.pool }) : null,
      el("td", { text: t.tier }),
      el("td", { class: "num", text: t.inflight + " / " + t.cap }),
      el("td", { class: "num", text: percent(t.cap_use) }),
      el("td", { class: "num", text: t.queued + " / " + t.quota })));
    card.append(el("table", {},
      el("thead", {}, el("tr", {},
        el("th", { text: "tenant" }), pooled ? el("th", { text: "pool" }) : null,
        el("th", { text: "tier" }),
        el("th", { class: "num", text: "in flight / cap" }), el("th", { class: "num", text: "cap use" }),
        el("th", { class: "num", text: "queued / quota" }))),
      el("tbody", {}, ...rows)));
    return card;
  }

  // A tenant's use of each pool: its cap and quota there are that pool's.
  function ownPools(uses) {
    const rows = uses.map((u) => el("tr", { dataset: { pool: u.pool } },
      el("td", { text: u.pool }),
      el("td", { class: "num", text: u.inflight + " / " + u.cap }),
      el("td", { class: "num", text: u.queued + " / " + u.quota })));
    return el("table", { dataset: { table: "own-pools" } },
      el("thead", {}, el("tr", {}, el("th", { text: "pool" }),
        el("th", { class: "num", text: "in flight / cap" }),
        el("th", { class: "num", text: "queued / quota" }))),
      el("tbody", {}, ...rows));
  }

  function ownCard(own, pooled) {
    const use = own.use;
    const statuses = el("div", { class: "statuses", dataset: { field: "by-status" } });
    for (const [status, count] of Object.entries(own.jobs_by_status)) {
      if (count > 0) statuses.append(el("span", {}, document.createTextNode(status + " "),
        el("b", { text: String(count) })));
    }
    if (!statuses.childElementCount) statuses.append(el("span", { class: "empty", text: "no jobs yet" }));
    const where = pooled ? " (pool " + use.pool + ")" : "";
    return el("article", { class: "card own", dataset: { card: "own" } },
      el("h2", {}, el("span", { text: use.name }), el("small", { text: use.tier + " tier" })),
      metric("own-inflight", "in flight / your cap" + where, String(use.inflight), use.cap_use,
        String(use.cap)),
      metric("own-queued", "queued / your quota" + where, String(use.queued), use.quota_use,
        String(use.quota)),
      pooled ? ownPools(own.pools) : null,
      el("div", { class: "metric" }, el("div", { class: "label" },
        el("span", { text: "your waits, p50 · p95 (" + own.waits_counted + " started)" }),
        el("b", { text: seconds(own.wait_p50_s) + " · " + seconds(own.wait_p95_s),
          dataset: { field: "own-waits" } }))),
      el("div", { class: "hint", text: "your last " + own.jobs_counted + " jobs:" }),
      statuses);
  }

  function jobsCard(own) {
    const card = el("article", { class: "card jobs", dataset: { card: "jobs" } },
      el("h2", {}, el("span", { text: "Your latest jobs" })));
    if (own.recent_jobs.length === 0) {
      card.append(el("p", { class: "empty", text: "none yet" }));
      return card;
    }
    const rows = own.recent_jobs.slice(0, 8).map((job) => el("tr", {},
      el("td", { class: "id", title: job.id }, jobLink(job.id, "…" + job.id.slice(-10))),
      el("td", { text: job.kind }),
      el("td", { text: job.status }), el("td", { class: "num", text: seconds(job.wait_s) })));
    card.append(el("table", {},
      el("thead", {}, el("tr", {}, el("th", { text: "job" }), el("th", { text: "kind" }),
        el("th", { text: "status" }), el("th", { class: "num", text: "waited" }))),
      el("tbody", {}, ...rows)));
    return card;
  }

  // -- charts -------------------------------------------------------------------------------

  function remember(body) {
    const now = Date.now();
    const queued = {};
    for (const tier of body.tiers) queued[tier.name] = tier.queued;
    const inflight = {};
    if (body.pool) {
      inflight["in flight"] = body.pool.inflight;
      inflight["capacity"] = body.pool.capacity;
    }
    if (body.tenant) {
      inflight["in flight"] = body.tenant.use.inflight;
      inflight["cap"] = body.tenant.use.cap;
      queued["yours"] = body.tenant.use.queued;
    }
    samples.push({ t: now, queued, inflight });
    while (samples.length && samples[0].t < now - HISTORY_MS) samples.shift();
    refreshes += 1;
    document.body.dataset.refreshes = String(refreshes);
  }

  // A line per series over the last HISTORY_MS; y from 0 to the largest value seen.
  function drawChart(canvas, legend, pick, names) {
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || canvas.width;
    const height = canvas.clientHeight || canvas.height;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const left = 34, right = 8, top = 8, bottom = 18;
    const now = Date.now();
    // The x axis spans the samples kept (at least MIN_SPAN_MS, at most HISTORY_MS).
    const first = samples.length ? samples[0].t : now;
    const span = Math.min(HISTORY_MS, Math.max(MIN_SPAN_MS, now - first));
    let max = 2;
    for (const point of samples) for (const name of names) max = Math.max(max, pick(point)[name] || 0);
    max = niceCeiling(max);
    const x = (t) => left + (width - left - right) * (1 - (now - t) / span);
    const y = (v) => top + (height - top - bottom) * (1 - v / max);
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = "#667085";
    ctx.strokeStyle = "#e2e5ea";
    ctx.lineWidth = 1;
    for (const fraction of [0, 0.5, 1]) {
      const value = max * fraction;
      ctx.beginPath();
      ctx.moveTo(left, y(value));
      ctx.lineTo(width - right, y(value));
      ctx.stroke();
      ctx.fillText(Number.isInteger(value) ? String(value) : value.toFixed(1), 4, y(value) + 4);
    }
    const tick = span > 120000 ? 60000 : span > 60000 ? 30000 : 10000;
    for (let back = 0; back <= span; back += tick) {
      const label = back === 0 ? "now"
        : tick === 60000 ? "−" + back / 60000 + " min" : "−" + back / 1000 + " s";
      ctx.fillText(label, Math.max(left, x(now - back) - 14), height - 4);
    }
    legend.replaceChildren();
    names.forEach((name, index) => {
      ctx.strokeStyle = color(index);
      ctx.lineWidth = 2;
      ctx.beginPath();
      let started = false;
      for (const point of samples) {
        const value = pick(point)[name];
        if (value === undefined) continue;
        if (started) ctx.lineTo(x(point.t), y(value));
        else ctx.moveTo(x(point.t), y(value));
        started = true;
      }
      ctx.stroke();
      const last = samples.length ? pick(samples[samples.length - 1])[name] : undefined;
      const swatch = el("span", { class: "swatch" });
      swatch.style.background = color(index);
      legend.append(el("span", {}, swatch,
        document.createTextNode(name + (last === undefined ? "" : " " + last))));
    });
  }

  function niceCeiling(value) {
    const magnitude = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 5, 10]) if (value <= step * magnitude) return step * magnitude;
    return 10 * magnitude;
  }

  // -- the job explorer ---------------------------------------------------------------------
  // #jobs?status=…&kind=…: a search (GET v1/jobs, or v1/admin/jobs with the admin key), newest
  // first, a page at a time; #job/<id>: one job read whole, refreshed until it has ended,
  // with Cancel, Retry and its webhook deliveries.

  const PAGE = 50;
  const FILTERS = ["status", "kind", "tier", "tenant", "since", "until"];
  const TERMINAL = ["succeeded", "failed", "cancelled", "expired"];
  const RETRYABLE = ["failed", "cancelled", "expired"];
  let viewKind = null; // "fleet" (the admin key) or "tenant", once /v1/dashboard answered
  let search = { serial: 0, params: new URLSearchParams(), cursor: null };
  let jobTimer = null;
  let notice = { id: null, node: null }; // what the last action on a job said

  function route() {
    const hash = window.location.hash.replace(/^#/, "");
    if (hash.startsWith("job/")) return { name: "job", id: decodeURIComponent(hash.slice(4)) };
    if (hash === "jobs" || hash.startsWith("jobs?")) {
      return { name: "jobs", params: new URLSearchParams(hash.slice(5)) };
    }
    return { name: "board" };
  }

  function showRoute() {
    if (viewKind === null) return; // the first answer of /v1/dashboard says whose key it is
    const where = route();
    $("board").hidden = where.name !== "board";
    $("explorer").hidden = where.name !== "jobs";
    $("job-page").hidden = where.name !== "job";
    document.body.dataset.route = where.name;
    for (const button of document.querySelectorAll("#nav [data-route]")) {
      button.dataset.active = String(button.dataset.route === (where.name === "board" ? "" : "jobs"));
    }
    if (where.name !== "job") stopJobTimer();
    if (where.name === "jobs") openSearch(where.params);
    if (where.name === "job") openJob(where.id);
  }

  // The admin's routes act on any tenant's job; a tenant's on its own.
  function jobPath(id, tenantTail, adminTail) {
    const fleet = viewKind === "fleet";
    return (fleet ? "v1/admin/jobs/" : "v1/jobs/") + encodeURIComponent(id)
      + (fleet ? adminTail : tenantTail);
  }

  async function call(path, method) {
    const answer = await fetch(path, {
      method: method || "GET",
      headers: { Authorization: "Bearer " + sessionStorage.getItem(KEY_ITEM),
        Accept: "application/json" },
      cache: "no-store",
    });
    if (answer.status === 401) {
      askForKey("That key is not known to this system.");
      throw new Error("unauthorized");
    }
    let body = null;
    try { body = await answer.json(); } catch (err) { body = null; }
    return { ok: answer.ok, status: answer.status, body };
  }

  function problem(result) {
    return result.body && result.body.error ? result.body.error.message : "HTTP " + result.status;
  }

  function jobLink(id, text) {
    return el("a", { href: "#job/" + encodeURIComponent(id), text: text || id,
      dataset: { jobLink: id } });
  }

  // datetime-local inputs hold local time without a zone; the API takes RFC 3339 with one.
  function isoOf(local) {
    const moment = new Date(local);
    return Number.isNaN(moment.getTime()) ? local : moment.toISOString();
  }

  function localOf(iso) {
    const moment = new Date(iso);
    if (!iso || Number.isNaN(moment.getTime())) return "";
    const two = (n) => String(n).padStart(2, "0");
    return `${moment.getFullYear()}-${two(moment.getMonth() + 1)}-${two(moment.getDate())}T`
      + `${two(moment.getHours())}:${two(moment.getMinutes())}:${two(moment.getSeconds())}`;
  }

  function openSearch(params) {
    const form = $("search-form");
    for (const name of FILTERS) {
      const value = params.get(name) || "";
      form.elements[name].value = name === "since" || name === "until" ? localOf(value) : value;
    }
    search = { serial: search.serial + 1, params, cursor: null };
    $("results").tBodies[0].replaceChildren();
    searchPage();
  }

  async function searchPage() {
    const serial = search.serial;
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = search.params.get(name);
      if (value && (name !== "tenant" || viewKind === "fleet")) query.set(name, value);
    }
    query.set("limit", String(PAGE));
    if (search.cursor) query.set("cursor", search.cursor);
    $("results").dataset.state = "loading";
    $("more").hidden = true;
    $("search-error").hidden = true;
    let result;
    try {
      result = await call((viewKind === "fleet" ? "v1/admin/jobs?" : "v1/jobs?") + query);
    } catch (err) {
      result = { ok: false, status: 0, body: { error: { message: "cannot reach the API" } } };
    }
    if (serial !== search.serial) return; // another search began meanwhile
    if (!result.ok) {
      $("search-error").textContent = problem(result);
      $("search-error").hidden = false;
    } else {
      $("results").tBodies[0].append(...result.body.jobs.map(resultRow));
      search.cursor = result.body.next_cursor;
      $("more").hidden = !search.cursor;
    }
    $("results-empty").hidden = !result.ok || $("results").tBodies[0].childElementCount > 0;
    $("results").dataset.state = "done";
  }

  function resultRow(job) {
    return el("tr", { dataset: { job: job.id, status: job.status } },
      el("td", { class: "id" }, jobLink(job.id)),
      viewKind === "fleet" ? el("td", { text: job.tenant || job.tenant_id }) : null,
      el("td", { text: job.kind }), el("td", { text: job.tier }),
      el("td", { text: job.status, dataset: { field: "status" } }),
      el("td", { text: job.created_at || "–" }),
      el("td", { class: "num", text: job.starts + " / " + job.max_attempts }));
  }

  function stopJobTimer() {
    if (jobTimer !== null) clearTimeout(jobTimer);
    jobTimer = null;
  }

  async function openJob(id) {
    stopJobTimer();
    const card = $("job");
    if (card.dataset.job !== id) {
      card.dataset.job = id;
      card.dataset.state = "loading";
      card.replaceChildren(el("p", { class: "empty", text: "loading…" }));
    }
    let result;
    try {
      result = await call(jobPath(id, "/detail", ""));
    } catch (err) {
      result = { ok: false, status: 0, body: { error: { message: "cannot reach the API" } } };
    }
    const here = route();
    if (here.name !== "job" || here.id !== id) return; // the page moved on meanwhile
    if (!result.ok) {
      card.dataset.state = result.status === 404 ? "missing" : "error";
      card.replaceChildren(backLink(), el("p", { class: "error", dataset: { field: "problem" },
        text: result.status === 404 ? "No job " + id + " for this key." : problem(result) }));
    } else {
      renderJob(card, result.body);
      if (!TERMINAL.includes(result.body.status)) {
        jobTimer = setTimeout(() => openJob(id), REFRESH_MS);
      }
    }
  }

  function backLink() {
    return el("p", {}, el("a", { href: "#jobs", text: "← search jobs" }));
  }

  function field(name, label, value) {
    const shown = value === null || value === undefined || value === "" ? "–" : value;
    return [el("dt", { text: label }),
      el("dd", { dataset: { field: name } }, typeof shown === "string"
        ? document.createTextNode(shown) : shown)];
  }

  function progressText(progress) {
    if (!progress) return null;
    return Math.round(progress.fraction * 100) + "%"
      + (progress.message ? " · " + progress.message : "") + " (" + progress.at + ")";
  }

  function renderJob(card, job) {
    const ended = TERMINAL.includes(job.status);
    const facts = el("dl", { class: "facts" },
      ...field("id", "id", job.id),
      ...field("tenant", "tenant", job.tenant + " (" + job.tenant_id + ")"),
      ...field("tier", "tier", job.tier),
      ...field("kind", "kind", job.kind),
      ...field("status", "status", job.status
        + (job.cancel_requested && !ended ? " (cancel requested)" : "")),
      ...field("progress", "progress", progressText(job.progress)),
      ...field("attempt", "attempt", job.attempt + " of at most " + job.max_attempts + " starts"),
      ...field("starts", "starts", String(job.starts)),
      ...(job.status === "queued" ? field("queue", "queue position",
        job.queue_position === null ? null : job.queue_position + " ahead, about "
          + seconds(job.estimated_wait_s) + " to start") : []),
      ...field("created-at", "created", job.created_at),
      ...field("enqueued-at", "enqueued", job.enqueued_at),
      ...field("dispatched-at", "dispatched", job.dispatched_at),
      ...field("started-at", "started", job.started_at),
      ...field("finished-at", "finished", job.finished_at),
      ...field("error", "error", job.error),
      ...field("error-type", "error type", job.error_type),
      ...field("timeout", "run-time limit", job.timeout_s === null ? null : seconds(job.timeout_s)),
      ...(job.retry_of ? field("retry-of", "retries", jobLink(job.retry_of)) : []),
      ...(job.webhook ? field("webhook", "webhook", job.webhook.url
        + " (" + (job.webhook.events || []).join(", ") + ")") : []));
    const payload = el("pre", { class: "payload", dataset: { field: "payload" },
      text: job.payload_truncated ? job.payload_excerpt + " …"
        : JSON.stringify(job.payload, null, 2) });
    const actions = el("div", { class: "actions" });
    if (!ended) {
      const cancel = el("button", { type: "button", dataset: { action: "cancel" },
        text: job.cancel_requested ? "Cancel requested" : "Cancel" });
      cancel.disabled = job.cancel_requested;
      cancel.addEventListener("click", () => act(job.id, "cancel", cancel));
      actions.append(cancel);
    }
    if (RETRYABLE.includes(job.status)) {
      const retry = el("button", { type: "button", dataset: { action: "retry" }, text: "Retry" });
      retry.addEventListener("click", () => act(job.id, "retry", retry));
      actions.append(retry);
    }
    const deliveries = el("section", { class: "deliveries", dataset: { field: "deliveries" } },
      el("h3", { text: "Webhook deliveries" }), el("p", { class: "empty", text: "loading…" }));
    card.replaceChildren(...[backLink(),
      el("h2", {}, el("span", { text: "Job " + job.id }),
        el("small", { text: job.status, dataset: { status: job.status } })),
      actions, notice.id === job.id ? notice.node : null, facts,
      el("h3", { text: "Payload" }),
      job.payload_truncated ? el("p", { class: "hint", dataset: { field: "payload-cut" },
        text: "cut: its JSON is " + job.payload_bytes + " bytes; only its start is shown" })
        : null,
      payload, deliveries].filter(Boolean));
    card.dataset.state = ended ? "ended" : "live";
    card.dataset.status = job.status;
    loadDeliveries(job.id, deliveries);
  }

  async function act(id, action, button) {
    button.disabled = true;
    let result;
    try {
      result = await call(jobPath(id, "/" + action, "/" + action), "POST");
    } catch (err) {
      result = { ok: false, status: 0, body: { error: { message: "cannot reach the API" } } };
    }
    let node;
    if (!result.ok) {
      node = el("p", { class: "error", dataset: { field: "notice" }, text: problem(result) });
    } else if (action === "retry") {
      node = el("p", { class: "notice", dataset: { field: "notice" } },
        document.createTextNode("Retried as a new job: "), jobLink(result.body.id));
    } else {
      node = el("p", { class: "notice", dataset: { field: "notice" }, text: result.status === 202
        ? "Asked its handler to stop: it ends cancelled when it does." : "Cancel: " + result.body.status });
    }
    notice = { id, node };
    openJob(id);
  }

  async function loadDeliveries(id, section) {
    let result;
    try {
      result = await call(jobPath(id, "/deliveries", "/deliveries"));
    } catch (err) {
      result = { ok: false, status: 0, body: { error: { message: "cannot reach the API" } } };
    }
    const list = result.ok && result.body && Array.isArray(result.body.deliveries)
      ? result.body.deliveries : null;
    let shown;
    if (list === null) {
      shown = el("p", { class: "empty", dataset: { state: "unavailable" },
        text: "deliveries unavailable: " + problem(result) });
    } else if (list.length === 0) {
      shown = el("p", { class: "empty", dataset: { state: "none" }, text: "no webhook" });
    } else {
      shown = el("table", { dataset: { table: "deliveries" } },
        el("thead", {}, el("tr", {}, el("th", { text: "event" }), el("th", { text: "url" }),
          el("th", { text: "status" }), el("th", { text: "created" }),
          el("th", { text: "next attempt" }), el("th", { text: "attempts" }))),
        el("tbody", {}, ...list.map(deliveryRow)));
    }
    section.replaceChildren(section.firstChild, shown);
  }

  function deliveryRow(delivery) {
    const attempts = delivery.attempts || [];
    const last = attempts.length ? attempts[attempts.length - 1] : null;
    const lastText = last === null ? "none"
      : attempts.length + ", last " + (last.status_code === null ? "" : "HTTP " + last.status_code)
        + (last.error ? " " + last.error : "") + " at " + last.at;
    return el("tr", { dataset: { delivery: delivery.webhook_id, status: delivery.status } },
      el("td", { text: delivery.type }), el("td", { class: "id", text: delivery.url }),
      el("td", { text: delivery.status }), el("td", { text: delivery.created_at }),
      el("td", { text: delivery.next_attempt_at || "–" }), el("td", { text: lastText }));
  }

  // -- the page -----------------------------------------------------------------------------

  function render(body) {
    $("key-form").hidden = true;
    $("forget-key").hidden = false;
    $("nav").hidden = false;
    document.body.dataset.view = body.view;
    if (viewKind !== body.view) {
      viewKind = body.view; // whose key it is: the explorer's routes and columns follow
      for (const node of document.querySelectorAll("[data-fleet-only]")) {
        node.hidden = viewKind !== "fleet";
      }
      showRoute();
    }
    $("view-name").textContent = body.view === "fleet"
      ? "fleet" : "tenant " + body.tenant.use.name;
    const cards = body.tiers.map((tier, i) => tierCard(tier, i, body));
    // More than the default pool: each pool and each worker's pool are shown.
    const pooled = (body.view === "fleet" ? body.pools || []
      : body.tenant.pools || []).length > 1;
    if (body.view === "fleet") {
      $("tiers").replaceChildren(...cards);
      const side = [poolCard(body.pool, pooled), tenantsCard(body.tenants, pooled)];
      if (body.packing) side.splice(1, 0, packingCard(body.packing, pooled));
      if (pooled) side.splice(1, 0, poolsCard(body.pools, body.workers || []));
      $("side").replaceChildren(...side);
    } else {
      $("tiers").replaceChildren(...cards, ownCard(body.tenant, pooled));
      $("side").replaceChildren(jobsCard(body.tenant));
    }
    remember(body);
    const tierNames = body.tiers.map((tier) => tier.name);
    const queueNames = body.view === "fleet" ? tierNames : [...tierNames, "yours"];
    $("chart-queue-title").textContent = body.view === "fleet"
      ? "Queued jobs per tier" : "Queued jobs: your tier and yours";
    drawChart($("chart-queue"), $("legend-queue"), (p) => p.queued, queueNames);
    $("chart-load-title").textContent = body.view === "fleet"
      ? (pooled ? "Pool " + body.pool.name : "Pool") + ": jobs in flight and capacity"
      : "Your jobs in flight and your cap" + (pooled ? " (pool " + body.tenant.use.pool + ")" : "");
    drawChart($("chart-load"), $("legend-load"), (p) => p.inflight,
      body.view === "fleet" ? ["in flight", "capacity"] : ["in flight", "cap"]);
  }

  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const key = $("key-input").value.trim();
    if (!key) return;
    sessionStorage.setItem(KEY_ITEM, key);
    $("key-input").value = "";
    samples.length = 0;
    refresh();
  });
  $("forget-key").addEventListener("click", () => {
    samples.length = 0;
    askForKey("");
  });

  for (const button of document.querySelectorAll("#nav [data-route]")) {
    button.addEventListener("click", () => {
      window.location.hash = button.dataset.route ? "#" + button.dataset.route : "";
      if (!button.dataset.route) showRoute(); // an empty hash may not fire hashchange
    });
  }
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const form = $("search-form");
    const query = new URLSearchParams();
    for (const name of FILTERS) {
      const value = form.elements[name].value.trim();
      if (value) query.set(name, name === "since" || name === "until" ? isoOf(value) : value);
    }
    const hash = "#jobs" + (query.toString() ? "?" + query : "");
    if (window.location.hash === hash) showRoute();
    else window.location.hash = hash;
  });
  $("more").addEventListener("click", () => searchPage());
  window.addEventListener("hashchange", () => {
    if (!window.location.hash.includes("key=")) showRoute();
  });

  keyFromFragment();
  if (sessionStorage.getItem(KEY_ITEM)) refresh();
  else askForKey("");
})();
