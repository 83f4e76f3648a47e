// zeroserve playground and live dashboard. Plain browser JS, no dependencies.
// Model output is only ever placed in the page as text (textContent / Text nodes),
// never parsed as HTML. The dashboard reads /v1/stats (JSON) once a second while the
// page is visible; rates and windowed percentiles are differences between two reads.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "zeroserve.apiKey";
  const POLL_MS = 1000;        // dashboard refresh period
  const HISTORY = 60;          // sparkline points (one a poll: a minute)
  const WINDOW = 10;           // polls the percentiles and the copy ratio look back over
  // The page's own requests, left out of requests/s so the dashboard does not count itself.
  const UI_ROUTES = new Set(["/", "/ui/app.js", "/ui/app.css", "/v1/stats"]);
  // Preferred default chat models, best first; else the first model that can generate.
  const PREFERRED = ["smollm2", "tinyllm"];
  // The metric families the dashboard reads from /v1/stats, each by its names (first found).
  const REQUESTS = ["zeroserve_http_requests"];
  const COPIED = ["zeroserve_copied_bytes"];
  const PAYLOAD = ["zeroserve_payload_bytes"];
  const TOKENS = ["zeroserve_generation_tokens", "zeroserve_stream_pieces"];
  const TTFT = ["zeroserve_generation_ttft_seconds", "zeroserve_stream_first_piece_seconds"];
  const ITL = ["zeroserve_generation_inter_token_seconds", "zeroserve_stream_inter_piece_seconds"];
  const LAG = ["zeroserve_event_loop_lag_seconds"];
  const YIELD_MS = 8;          // longest run of stream parsing without yielding to the page
  // An answer's text shown on the page, at most (the rest is counted, not drawn): laying
  // out megabytes of text every frame would make the page, not the server, the bottleneck.
  const MAX_SHOWN_CHARS = 100000;

  let apiKey = sessionStorage.getItem(KEY_STORE) || "";
  let capabilities = null;     // model -> [capability], from /v1/stats
  let controller = null;       // the AbortController of the answer being streamed
  const history = [];          // the conversation sent with each request

  // -- requests --------------------------------------------------------------------
  async function api(path, init = {}) {
    const headers = Object.assign({}, init.headers || {});
    if (apiKey) headers.Authorization = "Bearer " + apiKey;
    const res = await fetch(path, Object.assign({}, init, { headers }));
    if (res.status === 401) $("key-form").hidden = false;
    return res;
  }

  async function errorText(res) {
    const raw = await res.text();
    try {
      const body = JSON.parse(raw);
      const err = body.error;
      if (err && typeof err === "object") {
        return err.message + (err.param ? " (param: " + err.param + ")" : "");
      }
      if (typeof err === "string") return err;
    } catch (_) { /* not JSON: show the text */ }
    return raw || res.statusText;
  }

  function setState(text, cls) {
    const el = $("server-state");
    el.textContent = text;
    el.className = "pill " + (cls || "");
  }

  // -- models ----------------------------------------------------------------------
  async function loadModels() {
    let res;
    try { res = await api("/v1/models"); } catch (e) { setState("offline", "bad"); return; }
    if (!res.ok) {
      // 401 reads the same whichever of the page's first requests answers last.
      setState(res.status === 401 ? "API key needed" : "models: HTTP " + res.status, "bad");
      return;
    }
    const body = await res.json();
    const sel = $("model");
    const previous = sel.value;
    sel.replaceChildren();
    for (const card of body.data) {
      const opt = document.createElement("option");
      opt.value = card.id;
      opt.textContent = card.id;
      opt.title = card.description || "";
      sel.append(opt);
    }
    if (previous) sel.value = previous;
    markModels();
  }

  // A model with capabilities but not "generate" (an embedder) cannot chat. One with none
  // is relayed (a remote upstream, an in-process engine) and may.
  function canGenerate(name) {
    const caps = capabilities && capabilities[name];
    return !caps || !caps.length || caps.includes("generate");
  }

  function markModels() {
    const sel = $("model");
    for (const opt of sel.options) {
      opt.disabled = !canGenerate(opt.value);
      opt.textContent = opt.value + (opt.disabled ? " (no chat)" : "");
    }
    if (sel.dataset.picked) return;   // the user's choice stands
    const names = Array.from(sel.options).filter((o) => !o.disabled).map((o) => o.value);
    const best = PREFERRED.find((n) => names.includes(n)) || names[0];
    if (best) sel.value = best;
  }

  // -- the catalog (models at run time: GET /models, admin POST /models/load|unload) --
  // A server without --models-dir has no /models route: the panel stays hidden.
  function stateText(st) {
    if (st.failed) return "failed: " + (st.reason || "");
    return st.value + (st.replacing ? " (replacing)" : "");
  }

  let noCatalog = false;
  async function loadCatalog() {
    if (noCatalog) return;
    let res;
    try { res = await api("/models", { cache: "no-store" }); } catch (e) { return; }
    noCatalog = res.status === 404;
    if (!res.ok) { $("catalog").hidden = true; return; }
    const body = await res.json();
    $("catalog").hidden = false;
    const rows = body.data.map((m) => {
      const tr = document.createElement("tr");
      tr.dataset.model = m.id;
      const name = document.createElement("td");
      name.textContent = m.id + (m.pinned ? " (pinned)" : "");
      const state = document.createElement("td");
      state.className = "state";
      state.textContent = stateText(m.status);
      const actions = document.createElement("td");
      const busy = m.status.value === "loading" || m.status.value === "unloading";
      actions.append(
        control("Load", "load", m.id, busy),
        control("Unload", "unload", m.id, busy || m.pinned || m.status.value !== "loaded"),
      );
      tr.append(name, state, actions);
      return tr;
    });
    $("catalog-table").tBodies[0].replaceChildren(...rows);
  }

  function control(label, action, model, disabled) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    b.className = action;
    b.disabled = disabled;
    b.addEventListener("click", async () => {
      b.disabled = true;
      $("catalog-note").textContent = label + "ing " + model + "…";
      try {
        const res = await api("/models/" + action, {
          method: "POST",
          headers: { "Content-Type": "application/json" },
          body: JSON.stringify({ model }),
        });
        $("catalog-note").textContent = res.ok
          ? model + ": " + action + "ed"
          : model + ": HTTP " + res.status + ": " + await errorText(res);
      } catch (e) {
        $("catalog-note").textContent = model + ": " + e;
      }
      loadCatalog();
    });
    return b;
  }

  // -- chat ------------------------------------------------------------------------
  function addMessage(role, text) {
    const box = document.createElement("div");
    box.className = "msg " + role;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role;
    const content = document.createElement("div");
    content.className = "content";
    content.textContent = text;
    const meta = document.createElement("div");
    meta.className = "meta";
    box.append(label, content, meta);
    $("messages").append(box);
    scrollDown();
    return { box, content, meta };
  }

  function scrollDown() {
    const m = $("messages");
    m.scrollTop = m.scrollHeight;
  }

  function showError(out, text, failed = true) {
    const err = document.createElement("div");
    err.className = "error";
    err.textContent = text;
    out.box.append(err);
    if (failed) out.box.dataset.state = "error";
    scrollDown();
  }

  function sseData(event) {
    const lines = [];
    for (const line of event.split("\n")) {
      if (line.startsWith("data:")) lines.push(line.slice(line.startsWith("data: ") ? 6 : 5));
    }
    return lines.length ? lines.join("\n") : null;
  }

  function buildRequest(prompt) {
    const body = { model: $("model").value, messages: [], stream: true,
      stream_options: { include_usage: true } };
    const system = $("system").value.trim();
    if (system) body.messages.push({ role: "system", content: system });
    body.messages.push(...history, { role: "user", content: prompt });
    const t = parseFloat($("temperature").value);
    if (Number.isFinite(t)) body.temperature = t;
    const n = parseInt($("max-tokens").value, 10);
    if (n > 0) body.max_tokens = n;
    if ($("json-mode").checked) {
      body.response_format = { type: "json_schema",
        json_schema: { name: "answer", schema: JSON.parse($("schema").value), strict: true } };
    }
    return body;
  }

  function describe(m) {
    const parts = [];
    if (m.ttft !== null) parts.push("TTFT " + fmtSeconds(m.ttft));
    if (m.tps !== null) parts.push(m.tps.toFixed(1) + " tok/s");
    if (m.usage) {
      parts.push(m.usage.prompt_tokens + " prompt + " + m.usage.completion_tokens + " completion tokens");
    } else if (m.pieces) {
      parts.push(m.pieces + " tokens");
    }
    if (m.finish) parts.push("finish: " + m.finish);
    if (m.stopped) parts.push("stopped");
    return parts.join(" · ");
  }

  async function send(ev) {
    ev.preventDefault();
    if (controller) return;
    const prompt = $("prompt").value;
    if (!prompt.trim()) return;
    let body;
    try { body = buildRequest(prompt); } catch (e) {
      showError(addMessage("assistant", ""), "the JSON schema is not valid JSON: " + e.message);
      return;
    }
    const jsonMode = Boolean(body.response_format);
    addMessage("user", prompt);
    const out = addMessage("assistant", "");
    out.box.dataset.state = "streaming";
    $("prompt").value = "";
    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    const m = { ttft: null, tps: null, usage: null, pieces: 0, finish: null, stopped: false };
    let first = null;
    let text = "";
    let failed = false;
    // Text reaches the page at most once a frame, however fast the tokens come.
    const render = painter(out, () => describe(m));
    try {
      const res = await api("/v1/chat/completions", { method: "POST", signal: controller.signal,
        headers: { "Content-Type": "application/json", Accept: "text/event-stream" },
        body: JSON.stringify(body) });
      if (!res.ok) {
        failed = true;
        showError(out, "HTTP " + res.status + ": " + await errorText(res));
        return;
      }
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      let yielded = performance.now();
      for (;;) {
        // Reads of an already-filled stream resolve as microtasks, which would starve
        // painting and input; give the event loop a turn every few milliseconds (the
        // socket then fills and the server's backpressure holds the stream).
        if (performance.now() - yielded > YIELD_MS) {
          await new Promise((resolve) => setTimeout(resolve, 0));
          yielded = performance.now();
        }
        const { value, done } = await reader.read();
        if (done) break;
        const events = (buf + decoder.decode(value, { stream: true })).split("\n\n");
        buf = events.pop();   // an incomplete event waits for the next read
        let added = "";
        for (const event of events) {
          const data = sseData(event);
          if (data === null || data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || "the stream failed");
          if (chunk.usage) m.usage = chunk.usage;
          for (const c of chunk.choices || []) {
            if (c.delta && c.delta.content) { added += c.delta.content; m.pieces += 1; }
            if (c.finish_reason) m.finish = c.finish_reason;
          }
        }
        if (added) {
          const now = performance.now();
          if (first === null) { first = now; m.ttft = (now - started) / 1000; }
          text += added;
          const secs = (now - first) / 1000;
          m.tps = secs > 0 && m.pieces > 1 ? (m.pieces - 1) / secs : null;
          render.add(added);
        }
      }
    } catch (e) {
      if (e.name === "AbortError") { m.stopped = true; } else { failed = true; showError(out, String(e.message || e)); }
    } finally {
      render.flush();
      controller = null;
      setBusy(false);
      if (first !== null && m.usage && m.usage.completion_tokens > 1) {
        const secs = (performance.now() - first) / 1000;
        if (secs > 0) m.tps = (m.usage.completion_tokens - 1) / secs;
      }
      out.meta.textContent = describe(m);
      if (!failed) {
        out.box.dataset.state = m.stopped ? "stopped" : "done";
        history.push({ role: "user", content: prompt }, { role: "assistant", content: text });
        if (jsonMode && !m.stopped) showJson(out, text, body.response_format.json_schema.schema);
      }
    }
  }

  function painter(out, meta) {
    let pending = "";
    let frame = 0;
    let shown = 0;
    const flush = () => {
      if (frame) { cancelAnimationFrame(frame); frame = 0; }
      if (pending && shown < MAX_SHOWN_CHARS) {
        const part = pending.slice(0, MAX_SHOWN_CHARS - shown);
        out.content.append(part);   // a Text node, never HTML
        shown += part.length;
        if (shown >= MAX_SHOWN_CHARS) {
          const note = document.createElement("div");
          note.className = "meta";
          note.textContent = "(only the first " + MAX_SHOWN_CHARS + " characters are shown)";
          out.content.after(note);
        }
      }
      pending = "";
      out.meta.textContent = meta();
      scrollDown();
    };
    return {
      add(text) {
        pending += text;
        if (!frame) frame = requestAnimationFrame(() => { frame = 0; flush(); });
      },
      flush,
    };
  }

  // The answer parsed, and checked against the schema's top-level type and required
  // keys (the server's grammar enforces the whole schema; this catches a model without one).
  function showJson(out, text, schema) {
    let obj;
    try { obj = JSON.parse(text); } catch (e) {
      showError(out, "the answer is not valid JSON: " + e.message, false);
      return;
    }
    const isObject = obj !== null && typeof obj === "object" && !Array.isArray(obj);
    if (schema && schema.type === "object" && !isObject) {
      showError(out, "the answer is JSON but not an object, as the schema asks", false);
      return;
    }
    const missing = isObject && schema ? (schema.required || []).filter((k) => !(k in obj)) : [];
    if (missing.length) {
      showError(out, "the answer lacks required keys: " + missing.join(", "), false);
      return;
    }
    const pre = document.createElement("pre");
    pre.className = "json";
    pre.textContent = JSON.stringify(obj, null, 2);
    out.box.append(pre);
    scrollDown();
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  // -- dashboard -------------------------------------------------------------------
  const snaps = [];
  const series = {};
  let updates = 0;

  function push(name, v) {
    const s = series[name] || (series[name] = []);
    s.push(Number.isFinite(v) ? v : 0);
    if (s.length > HISTORY) s.shift();
  }

  function sum(obj, f) {
    let n = 0;
    for (const k in obj || {}) n += f(obj[k], k);
    return n;
  }

  // The first of ``names`` that the server exposes (a metric may have moved or be new).
  function family(table, names) {
    for (const name of names) if (table && table[name]) return table[name];
    return null;
  }

  function counterBy(s, names, label) {   // label value -> value
    const out = {};
    for (const c of family(s.counters, names) || []) {
      const key = c.labels[label];
      out[key] = (out[key] || 0) + c.value;
    }
    return out;
  }

  function counterSum(s, names, keep) {
    let n = 0;
    for (const c of family(s.counters, names) || []) if (!keep || keep(c.labels)) n += c.value;
    return n;
  }

  function requestsTotal(s) {
    return counterSum(s, REQUESTS, (l) => !UI_ROUTES.has(l.route));
  }

  // Histograms are lists of buckets {lo, hi, n}, so children with different bucket
  // bounds (two recorders of one quantity) can be pooled for a percentile.
  function buckets(child, base) {   // child - base (same family and labels), as buckets
    const out = [];
    child.counts.forEach((c, i) => {
      const n = c - (base ? base.counts[i] || 0 : 0);
      if (n <= 0) return;
      const last = child.bounds[child.bounds.length - 1];
      const lo = i ? child.bounds[i - 1] : 0;
      const hi = i < child.bounds.length ? child.bounds[i] : last;   // +Inf: report the top bound
      out.push({ lo: Math.min(lo, hi), hi, n });
    });
    return out;
  }

  function sameChild(s, name, labels) {
    const key = JSON.stringify(labels);
    return ((s.histograms || {})[name] || []).find((h) => JSON.stringify(h.labels) === key) || null;
  }

  // The window's buckets of a latency recorded per model, possibly by two recorders (the
  // OpenAI layer's and the engine stream's): each model counts with the one that saw
  // more of its generations, so nothing is counted twice and no model is left out.
  function modelBuckets(base, s, names) {
    const best = {};
    for (const name of names) {
      for (const child of (s.histograms || {})[name] || []) {
        const model = child.labels.model;
        if (!best[model] || child.count > best[model].child.count) best[model] = { name, child };
      }
    }
    const out = [];
    for (const model in best) {
      const { name, child } = best[model];
      out.push(...buckets(child, base === s ? null : sameChild(base, name, child.labels)));
    }
    return out;
  }

  function allBuckets(base, s, names) {   // every child of the first family found, pooled
    const fam = family(s.histograms, names) || [];
    const name = names.find((n) => (s.histograms || {})[n]);
    const out = [];
    for (const child of fam) out.push(...buckets(child, base === s ? null : sameChild(base, name, child.labels)));
    return out;
  }

  function quantile(list, q) {
    const total = list.reduce((x, b) => x + b.n, 0);
    if (!total) return null;
    list = list.slice().sort((a, b) => a.hi - b.hi || a.lo - b.lo);
    const rank = q * total;
    let cum = 0;
    for (const b of list) {
      if (cum + b.n >= rank) return b.lo + (b.hi - b.lo) * ((rank - cum) / b.n);
      cum += b.n;
    }
    return list[list.length - 1].hi;
  }

  // A counter recorded per model by one or more recorders: each model's largest.
  function perModelTotal(s, names) {
    const best = {};
    for (const name of names) {
      for (const c of (s.counters || {})[name] || []) {
        const model = c.labels.model;
        best[model] = Math.max(best[model] || 0, c.value);
      }
    }
    return sum(best, (v) => v);
  }

  function fmtSeconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 0.001) return (s * 1e6).toFixed(0) + " µs";
    if (s < 1) return (s * 1000).toFixed(s < 0.01 ? 2 : 1) + " ms";
    return s.toFixed(2) + " s";
  }

  function fmtBytes(n) {
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : String(Math.round(n))) + " " + units[i];
  }

  function fmtRate(x) { return x === null ? "–" : x >= 100 ? x.toFixed(0) : x.toFixed(1); }
  function fmtPct(x) { return x === null ? "–" : (x * 100).toFixed(x < 0.001 ? 3 : 2) + " %"; }
  function ratio(a, b) { return b > 0 ? a / b : null; }

  function show(id, text, value) {
    const el = $(id);
    el.textContent = text;
    if (value !== undefined) el.dataset.value = value === null ? "" : String(value);
  }

  function copiedTotal(s) { return counterSum(s, COPIED); }
  function payloadTotal(s) { return counterSum(s, PAYLOAD); }

  function update(s) {
    // Another process (--workers N) or a restarted server: differences start afresh.
    if (snaps.length && snaps[snaps.length - 1].process !== s.process) snaps.length = 0;
    const prev = snaps.length ? snaps[snaps.length - 1] : null;
    snaps.push(s);
    if (snaps.length > WINDOW + 1) snaps.shift();
    const base = snaps[0];
    const dt = prev ? s.now - prev.now : 0;
    const rate = (f) => (prev && dt > 0 ? (f(s) - f(prev)) / dt : null);
    const src = s.sources || {};
    const queue = src.queue || {};
    const batch = src.batch || {};
    const workers = src.workers || {};

    if (!capabilities) { capabilities = s.models; markModels(); } else capabilities = s.models;

    const rps = rate(requestsTotal);
    show("s-rps", fmtRate(rps), rps);
    push("rps", rps);
    const tokens = (x) => perModelTotal(x, TOKENS);
    const tps = rate(tokens);
    show("s-tps", fmtRate(tps), tps);
    push("tps", tps);
    const inflight = sum(queue, (q) => q.in_flight);
    show("s-inflight", String(inflight), inflight);
    push("inflight", inflight);
    const queued = sum(batch, (b) => b.queued) + sum(src.engine, (e) => e.queued);
    show("s-queued", String(queued), queued);
    push("queued", queued);
    const rejected = rate((x) => sum((x.sources || {}).queue, (q) => q.rejected));
    show("s-rejected", fmtRate(rejected), rejected);
    push("rejected", rejected);

    latency("s-ttft", "ttft", TTFT, base, s);
    latency("s-itl", "itl", ITL, base, s);
    const lag99 = quantile(allBuckets(base, s, LAG), 0.99);
    show("s-lag", fmtSeconds(lag99), lag99);
    push("lag", lag99);

    const channels = src.channels || {};
    show("s-buffered", fmtBytes(channels.pending_bytes || 0) + " · " + (channels.open || 0) + " open",
      channels.pending_bytes || 0);
    push("buffered", channels.pending_bytes || 0);
    const arena = src.arena || {};
    show("s-arena", fmtBytes(arena.used || 0) + " / " + fmtBytes(arena.budget || 0), arena.used || 0);
    push("arena", arena.used || 0);

    const windowRatio = base === s ? null
      : ratio(copiedTotal(s) - copiedTotal(base), payloadTotal(s) - payloadTotal(base));
    const totalRatio = ratio(copiedTotal(s), payloadTotal(s));
    show("s-copy", fmtPct(windowRatio) + " · " + fmtPct(totalRatio));
    $("s-copy").dataset.window = windowRatio === null ? "" : String(windowRatio);
    $("s-copy").dataset.total = totalRatio === null ? "" : String(totalRatio);
    push("copy", windowRatio === null ? 0 : windowRatio * 100);

    copyTable(s, base);
    modelTable(s, queue, batch, workers, src.engine || {});
    const payload = counterBy(s, PAYLOAD, "direction");
    $("payload-line").textContent = "payload in " + fmtBytes(payload.in || 0) + " · out " +
      fmtBytes(payload.out || 0) + " · copied " + fmtBytes(copiedTotal(s)) + " since start";
    const conns = src.connections ? src.connections.open : "–";
    $("conn-line").textContent = "open connections: " + conns;
    setState(s.ready ? "ready" : "not ready", s.ready ? "ok" : "bad");
    drawAll();
    updates += 1;
    $("dash-pane").dataset.updates = String(updates);
  }

  function latency(id, name, names, base, s) {
    if (!family(s.histograms, names)) {
      show(id, "no streams yet", null);
      push(name, 0);
      return;
    }
    const list = modelBuckets(base, s, names);
    const p50 = quantile(list, 0.5);
    const p99 = quantile(list, 0.99);
    show(id, p50 === null ? "idle" : fmtSeconds(p50) + " / " + fmtSeconds(p99), p99);
    push(name, p99 === null ? 0 : p99);
  }

  function row(cells) {
    const tr = document.createElement("tr");
    for (const c of cells) {
      const td = document.createElement("td");
      td.textContent = c;
      tr.append(td);
    }
    return tr;
  }

  function copyTable(s, base) {
    const payload = payloadTotal(s);
    const windowPayload = payloadTotal(s) - payloadTotal(base);
    const copied = counterBy(s, COPIED, "site");
    const before = counterBy(base, COPIED, "site");
    const rows = Object.keys(copied).sort().map((site) => {
      const n = copied[site];
      const w = n - (before[site] || 0);
      const tr = row([site, fmtBytes(n), fmtPct(ratio(n, payload)) + " (10 s: " +
        (base === s ? "–" : fmtPct(ratio(w, windowPayload))) + ")"]);
      tr.dataset.site = site;
      return tr;
    });
    if (!rows.length) rows.push(row(["none yet", "0 B", "–"]));
    $("copy-table").tBodies[0].replaceChildren(...rows);
  }

  function modelTable(s, queue, batch, workers, engines) {
    const rows = Object.keys(s.models).sort().map((name) => {
      const q = queue[name] || {};
      const b = batch[name] || {};
      const w = workers[name] || {};
      const e = engines[name];   // an in-process engine's slots, where the model has one
      const tr = row([name, String(q.in_flight ?? "–"), String((b.queued || 0) + (e ? e.queued : 0)),
        String(q.rejected ?? "–"),
        (w.executor || "") + " " + (w.ready ?? "–") + "/" + (w.busy ?? "–"),
        e ? e.active + "/" + e.slots : "–",
        String(w.streams ?? "–"), String(w.restarts ?? "–")]);
      tr.dataset.model = name;
      return tr;
    });
    $("model-table").tBodies[0].replaceChildren(...rows);
  }

  function drawAll() {
    for (const canvas of document.querySelectorAll("canvas[data-series]")) {
      spark(canvas, series[canvas.dataset.series] || []);
    }
  }

  function spark(canvas, values) {
    const dpr = window.devicePixelRatio || 1;
    const w = Math.max(1, Math.round(canvas.clientWidth * dpr));
    const h = Math.max(1, Math.round(canvas.clientHeight * dpr));
    if (canvas.width !== w || canvas.height !== h) { canvas.width = w; canvas.height = h; }
    const ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, w, h);
    if (values.length < 2) return;
    const max = Math.max(...values) || 1;
    const step = w / (HISTORY - 1);
    const x0 = w - step * (values.length - 1);
    ctx.beginPath();
    values.forEach((v, i) => {
      const x = x0 + i * step;
      const y = h - 1 - (v / max) * (h - 2);
      if (i) ctx.lineTo(x, y); else ctx.moveTo(x, y);
    });
    ctx.strokeStyle = "#2f6fde";
    ctx.lineWidth = 1.5 * dpr;
    ctx.stroke();
    ctx.lineTo(w, h);
    ctx.lineTo(x0, h);
    ctx.closePath();
    ctx.fillStyle = "rgba(47, 111, 222, 0.12)";
    ctx.fill();
  }

  let timer = null;
  let polling = false;
  async function poll() {
    timer = null;
    // A hidden page does not poll (visibilitychange resumes it): it costs the server nothing.
    if (polling || document.hidden) return;
    polling = true;
    try {
      const res = await api("/v1/stats", { cache: "no-store" });
      if (res.ok) update(await res.json());
      else setState(res.status === 401 ? "API key needed" : "stats: HTTP " + res.status, "bad");
      await loadCatalog();
    } catch (e) {
      setState("offline", "bad");
    } finally {
      polling = false;
    }
    if (!timer && !document.hidden) timer = setTimeout(poll, POLL_MS);
  }

  function resume() { if (!timer && !polling) poll(); }

  // -- wiring ----------------------------------------------------------------------
  function init() {
    $("chat-form").addEventListener("submit", send);
    $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
    $("clear").addEventListener("click", () => { history.length = 0; $("messages").replaceChildren(); });
    $("prompt").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); $("chat-form").requestSubmit(); }
    });
    $("json-mode").addEventListener("change", () => { $("schema-box").hidden = !$("json-mode").checked; });
    $("model").addEventListener("change", () => { $("model").dataset.picked = "1"; });
    $("key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      apiKey = $("api-key").value.trim();
      sessionStorage.setItem(KEY_STORE, apiKey);
      $("key-form").hidden = true;
      loadModels();
      resume();
    });
    document.addEventListener("visibilitychange", () => { if (!document.hidden) resume(); });
    loadModels();
    poll();
  }

  init();
})();
