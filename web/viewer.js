// vostream viewer: click-to-track over WebSocket + msgpack (docs/protocol.md).  No build step.
// Frames are decoded off the main thread with createImageBitmap; masks arrive as COCO RLE and are drawn
// translucent with an opaque contour.  Latest frame wins: while one frame is being drawn, a newer arrival
// replaces the waiting one (counted as a client drop).  Test hooks: window.__vostream.
"use strict";
(function () {
  const MP = window.MessagePack;
  const $ = (id) => document.getElementById(id);
  const canvas = $("view");
  const ctx = canvas.getContext("2d");
  const params = new URLSearchParams(location.search);
  const token = params.get("token");

  // ---- state --------------------------------------------------------------------------------------------------
  const S = {
    ws: null, session: null, watcher: false, width: 0, height: 0, frames: null, seekable: false,
    playing: false, ended: false, index: -1, objects: new Map(), selected: null, offset: 0, offsetKnown: false,
    view: null,
    clock: [], pingId: 0, pingTimer: null, pending: null, drawing: false, lastMsg: null, drag: null, caps: null,
  };
  const stats = {
    connected: false, frames: 0, masksDrawn: 0, clientDrops: 0, serverDrops: 0, lastIndex: -1, lastSeq: 0,
    lat: [], p50: null, p95: null, fps: 0, objs: {}, areaByIndex: {}, errors: [], state: null, session: null,
    promptsSent: 0, server: null, drawTimes: [], redraws: 0, offset: null, rtt: null, pongs: 0,
    masksDecoded: 0, imageSize: null, view: null,
  };
  window.__vostream = stats;

  // DAVIS / PASCAL VOC palette, the same colours as the file outputs (sinks/overlay.py)
  function colorFor(id) {
    let r = 0, g = 0, b = 0, c = id;
    for (let shift = 7; shift >= 0; shift--) {
      r |= (c & 1) << shift; g |= ((c >> 1) & 1) << shift; b |= ((c >> 2) & 1) << shift; c >>= 3;
    }
    return [r, g, b];
  }
  const css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;

  // ---- connection ---------------------------------------------------------------------------------------------
  function send(msg) {
    if (S.ws && S.ws.readyState === WebSocket.OPEN) S.ws.send(MP.encode(msg));
  }
  const now = () => performance.timeOrigin + performance.now();

  // ---- figures (pure functions; window.__vostreamApi exposes them to the tests) -------------------------------
  // Clock offset (server − client, ms) from ping/pong samples {rtt, offset}: the sample with the smallest
  // round trip is the least disturbed by queueing (a busy server, a frame in the socket ahead of the pong).
  const CLOCK_SAMPLES = 16;  // a sliding window: the estimate follows drift as old samples leave it
  function clockOffset(samples) {
    let best = null;
    for (const s of samples) if (best === null || s.rtt < best.rtt) best = s;
    return best;
  }
  // Frames per second from the draw times (ms) of first-time draws while playing (the caller clears them on
  // every play/pause change, so a pause is never averaged in).
  function fpsOf(times) {
    return times.length > 1 ? (1000 * (times.length - 1)) / (times[times.length - 1] - times[0]) : 0;
  }
  // Glass-to-glass sample (ms) of a drawn frame, or null when it is none: a redraw of a frame already drawn,
  // a frame held from before we joined, no capture time, or no clock estimate yet.
  function latencySample(msg, first, drawMs, offset, offsetKnown) {
    if (!first || msg.held || !msg.capture_ms || !offsetKnown) return null;
    return drawMs + offset - msg.capture_ms;
  }

  function ping() {
    send({ t: "ping", id: S.pingId++, client_ms: now() });
  }

  function connect() {
    const proto = location.protocol === "https:" ? "wss:" : "ws:";
    const ws = new WebSocket(`${proto}//${location.host}/ws${token ? "?token=" + encodeURIComponent(token) : ""}`);
    ws.binaryType = "arraybuffer";
    S.ws = ws;
    ws.onopen = () => {
      stats.connected = true;
      setStatus("connected");
      send({ t: "hello", v: 1, client: "vostream-web", inflight: 2 });
      S.view = null;
      fitView();  // before any open: the first frame already comes at the display's size
      // pings spread over time, not in the busy first moments (hello, open, first frame): a few early ones,
      // then one every 2 s; the offset is re-estimated from the window of the last CLOCK_SAMPLES
      for (const ms of [300, 700, 1200]) setTimeout(ping, ms);
      S.pingTimer = setInterval(ping, 2000);
    };
    ws.onclose = (e) => {
      stats.connected = false;
      if (S.pingTimer) { clearInterval(S.pingTimer); S.pingTimer = null; }
      setStatus(`disconnected${e.reason ? ": " + e.reason : ""}`);
    };
    ws.onmessage = (e) => {
      let msg;
      try { msg = MP.decode(new Uint8Array(e.data)); } catch (err) { showError("bad message from server"); return; }
      const handler = handlers[msg.t];
      if (handler) handler(msg);  // unknown types are ignored (protocol versioning rule)
    };
  }

  const handlers = {
    hello(msg) {
      S.caps = msg.caps;
      const sel = $("sources");
      sel.innerHTML = "";
      for (const s of msg.sources) sel.add(new Option(s, s));
      const wanted = params.get("source") || msg.default_source;
      if (wanted && ![...sel.options].some((o) => o.value === wanted)) sel.add(new Option(wanted, wanted));
      if (wanted) sel.value = wanted;
      if (params.get("watch")) send({ t: "watch", session: params.get("watch") });
      else if (wanted) openSource(wanted);
    },
    opened(msg) {
      Object.assign(S, { session: msg.session, watcher: msg.watcher, width: msg.width, height: msg.height,
        frames: msg.frames, seekable: msg.seekable, index: -1 });
      stats.session = msg.session;
      if (!msg.watcher) S.objects.clear();
      maskCache.clear();
      canvas.width = msg.width; canvas.height = msg.height;
      fitView();
      $("seek").max = Math.max(0, (msg.frames || 1) - 1);
      $("seek").disabled = !msg.seekable || msg.watcher;
      setStatus(`${msg.source} ${msg.width}x${msg.height}${msg.watcher ? " (watching)" : ""}`);
      renderObjects();
    },
    frame(msg) {
      msg.recv_ms = now();
      stats.lastSeq = msg.seq;
      if (S.pending && !S.pending.drawn) stats.clientDrops++;  // a replaced redraw is no drop
      S.pending = msg;
      if (!S.drawing) drawLoop();
    },
    state(msg) {
      stats.state = msg;
      if (msg.playing !== S.playing) stats.drawTimes = [];  // fps counts playing time only
      S.playing = msg.playing; S.ended = msg.ended; S.index = msg.index;
      for (const id of msg.objects) ensureObject(id);
      $("play").textContent = msg.playing ? "❚❚ Pause" : "▶ Play";
      $("seek").value = Math.max(0, msg.index);
      renderObjects(); renderStats();
    },
    stats(msg) {
      stats.server = msg; stats.serverDrops = msg.drops;
      renderStats();
    },
    pong(msg) {
      const t = now(), rtt = t - msg.client_ms;
      S.clock.push({ rtt, offset: msg.server_ms - (msg.client_ms + t) / 2 });
      if (S.clock.length > CLOCK_SAMPLES) S.clock.shift();
      const best = clockOffset(S.clock);
      S.offset = best.offset; S.offsetKnown = true;
      stats.offset = best.offset; stats.rtt = best.rtt; stats.pongs++;
    },
    export(msg) {
      const a = document.createElement("a");
      a.href = msg.url; a.download = ""; document.body.appendChild(a); a.click(); a.remove();
      stats.lastExport = msg;
    },
    error(msg) {
      stats.errors.push(msg);
      if (stats.errors.length > 50) stats.errors.shift();
      showError(`${msg.code}: ${msg.message}`);
    },
    closed(msg) { setStatus(`session closed (${msg.reason})`); S.session = null; },
  };

  // ---- drawing ------------------------------------------------------------------------------------------------
  // Masks cost in proportion to the object, not the frame: each object's RLE is decoded into a buffer the size of
  // its bounding box, painted once into a small canvas, and that canvas is reused as long as the object's RLE
  // string is the same (a still object, a redraw after a click).  The frame itself is drawn at the size the
  // server sent (iw x ih: the display size the viewer asked for with `view`, never more than the source); masks
  // and prompts are drawn in source pixels through a scale transform.
  const maskCache = new Map();  // object id → {counts, x0, y0, canvas, area}

  function decodeCounts(s) {  // pycocotools rleFrString
    const cnts = [];
    let p = 0;
    while (p < s.length) {
      let x = 0, k = 0, more = 1, c = 0;
      while (more) {
        c = s.charCodeAt(p) - 48; x |= (c & 0x1f) << (5 * k); more = c & 0x20; p++; k++;
        if (!more && (c & 0x10)) x |= -1 << (5 * k);
      }
      if (cnts.length > 2) x += cnts[cnts.length - 2];
      cnts.push(x);
    }
    return cnts;
  }

  // One object's mask layer: its bounding box in source pixels and a canvas of that size with the mask painted
  // translucent and its contour opaque (a pixel is contour when a 4-neighbour is background or it lies on the
  // frame's border).  Runs are column-major over the whole frame (COCO); the work is per foreground pixel.
  function maskLayer(rle, rgb, w, h) {
    const cnts = decodeCounts(rle.counts);
    let x0 = w, x1 = -1, y0 = h, y1 = -1, area = 0;
    for (let i = 1, k = cnts[0] || 0; i < cnts.length; i += 2) {
      const n = cnts[i];
      if (n > 0) {
        const cx0 = (k / h) | 0, cx1 = ((k + n - 1) / h) | 0;
        if (cx0 < x0) x0 = cx0;
        if (cx1 > x1) x1 = cx1;
        if (cx0 !== cx1) { y0 = 0; y1 = h - 1; } else {
          const ya = k - cx0 * h, yb = ya + n - 1;
          if (ya < y0) y0 = ya;
          if (yb > y1) y1 = yb;
        }
        area += n;
      }
      k += n + (cnts[i + 1] || 0);
    }
    if (!area) return { x0: 0, y0: 0, canvas: null, area: 0 };
    const bw = x1 - x0 + 1, bh = y1 - y0 + 1;
    const m = new Uint8Array(bw * bh);
    for (let i = 1, k = cnts[0] || 0; i < cnts.length; i += 2) {
      const n = cnts[i];
      let x = (k / h) | 0, y = k - x * h;
      for (let j = 0; j < n; j++) {
        m[(y - y0) * bw + (x - x0)] = 1;
        if (++y === h) { y = 0; x++; }
      }
      k += n + (cnts[i + 1] || 0);
    }
    const img = new ImageData(bw, bh), data = img.data;
    for (let y = 0; y < bh; y++) {
      const row = y * bw, top = y === 0, bottom = y === bh - 1;
      const frameEdge = y + y0 === 0 || y + y0 === h - 1;
      for (let x = 0; x < bw; x++) {
        const i = row + x;
        if (!m[i]) continue;
        const edge = frameEdge || x + x0 === 0 || x + x0 === w - 1 ||
          x === 0 || !m[i - 1] || x === bw - 1 || !m[i + 1] ||
          top || !m[i - bw] || bottom || !m[i + bw];
        const o = i * 4;
        data[o] = rgb[0]; data[o + 1] = rgb[1]; data[o + 2] = rgb[2]; data[o + 3] = edge ? 255 : 115;
      }
    }
    const canvas = new OffscreenCanvas(bw, bh);
    canvas.getContext("2d").putImageData(img, 0, 0);
    return { x0, y0, canvas, area };
  }

  function layerFor(o, w, h) {
    const cached = maskCache.get(o.id);
    if (cached && cached.counts === o.rle.counts && cached.w === w && cached.h === h) return cached;
    const layer = maskLayer(o.rle, S.objects.get(o.id).color, w, h);
    Object.assign(layer, { counts: o.rle.counts, w, h });
    maskCache.set(o.id, layer);
    stats.masksDecoded++;
    return layer;
  }

  async function drawLoop() {
    S.drawing = true;
    while (S.pending) {
      const msg = S.pending; S.pending = null;
      try { await drawFrame(msg); } catch (err) { showError(`draw failed: ${err}`); }
    }
    S.drawing = false;
  }

  async function drawFrame(msg) {
    const first = !msg.drawn;  // a redraw (after a click) is no new frame: no ack, no latency or fps sample
    msg.drawn = true;
    if (!msg.bitmap) msg.bitmap = await createImageBitmap(new Blob([msg.jpeg], { type: "image/jpeg" }));
    const w = msg.w, h = msg.h, iw = msg.iw || w, ih = msg.ih || h;
    if (canvas.width !== iw || canvas.height !== ih) { canvas.width = iw; canvas.height = ih; }
    if (S.lastMsg && S.lastMsg !== msg && S.lastMsg.bitmap) { S.lastMsg.bitmap.close(); S.lastMsg.bitmap = null; }
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    ctx.drawImage(msg.bitmap, 0, 0);
    ctx.setTransform(iw / w, 0, 0, ih / h, 0, 0);  // from here on: source pixels
    ctx.imageSmoothingEnabled = iw < w;  // masks are shown at display size: smooth only when shrinking
    const areas = {};
    let drawn = 0;
    for (const o of msg.objs) {
      if (!o.present || !o.rle) { areas[o.id] = 0; continue; }
      ensureObject(o.id);
      const layer = layerFor(o, w, h);
      areas[o.id] = layer.area;
      if (layer.canvas) { ctx.drawImage(layer.canvas, layer.x0, layer.y0); drawn++; }
    }
    drawPrompts(msg.index);
    ctx.setTransform(1, 0, 0, 1, 0, 0);
    S.lastMsg = msg; S.index = msg.index;
    const drawMs = now();
    stats.objs = {};
    for (const o of msg.objs) stats.objs[o.id] = { area: areas[o.id], present: o.present, box: o.box, score: o.score };
    stats.areaByIndex[msg.index] = areas;
    stats.imageSize = [iw, ih];
    if (!first) { stats.redraws++; renderStats(true); return; }
    send({ t: "ack", seq: msg.seq, recv_ms: msg.recv_ms + S.offset, draw_ms: drawMs + S.offset });
    // stats for the overlay and the tests
    stats.frames++; stats.masksDrawn += drawn; stats.lastIndex = msg.index;
    const lat = latencySample(msg, first, drawMs, S.offset, S.offsetKnown);
    if (lat !== null) {
      stats.lat.push(lat);
      if (stats.lat.length > 600) stats.lat.shift();
    }
    if (S.playing) {
      stats.drawTimes.push(drawMs);
      if (stats.drawTimes.length > 60) stats.drawTimes.shift();
    }
    renderStats(false);
  }

  function drawPrompts(index) {
    for (const [id, obj] of S.objects) {
      const p = obj.prompts.get(index);
      if (!p) continue;
      ctx.lineWidth = Math.max(1, S.width / 400);  // source pixels (drawFrame's transform)
      p.points.forEach(([x, y], i) => {
        ctx.beginPath(); ctx.arc(x, y, Math.max(3, S.width / 160), 0, 2 * Math.PI);
        ctx.fillStyle = p.labels[i] ? "#2ecc40" : "#ff4136"; ctx.fill();
        ctx.strokeStyle = "#fff"; ctx.stroke();
      });
      if (p.box) { ctx.strokeStyle = css(obj.color); ctx.strokeRect(p.box[0], p.box[1], p.box[2] - p.box[0], p.box[3] - p.box[1]); }
    }
  }

  function redraw() {  // re-composite the last frame (after a click, before the server answers)
    if (S.lastMsg && !S.drawing) { S.pending = S.lastMsg; drawLoop(); }
  }

  function pct(arr, q) {
    if (!arr.length) return null;
    const s = [...arr].sort((a, b) => a - b);
    const pos = (s.length - 1) * q, lo = Math.floor(pos), hi = Math.ceil(pos);
    return s[lo] + (s[hi] - s[lo]) * (pos - lo);
  }

  // The figures are computed on every call; the overlay's text (and the frame number) are written at most every
  // STATS_EVERY_MS, plus once after the last call: a text change costs the page a style and layout pass, which at
  // 30 fps was a good part of the main thread's time per frame.
  const STATS_EVERY_MS = 250;
  let statsShown = 0, statsTimer = null;
  function renderStats(force = true) {
    stats.p50 = pct(stats.lat, 0.5); stats.p95 = pct(stats.lat, 0.95);
    stats.fps = S.playing ? fpsOf(stats.drawTimes) : 0;
    const t = performance.now();
    if (!force && t - statsShown < STATS_EVERY_MS) {
      if (!statsTimer) statsTimer = setTimeout(() => { statsTimer = null; renderStats(true); }, STATS_EVERY_MS);
      return;
    }
    statsShown = t;
    const f = (v) => (v == null || Number.isNaN(v) ? "–" : v.toFixed(1));
    const srv = stats.server;
    $("stats").textContent =
      `frame ${stats.lastIndex}  ${f(stats.fps)} fps\n` +
      `latency p50 ${f(stats.p50)} ms  p95 ${f(stats.p95)} ms\n` +
      `drops ${stats.serverDrops} server + ${stats.clientDrops} client\n` +
      (srv ? `track ${f(srv.fps.track)} fps  encode ${f(srv.server_ms.p50)} ms` : "");
    if (stats.lastIndex >= 0) $("frameno").textContent = `${stats.lastIndex}${S.frames ? " / " + (S.frames - 1) : ""}`;
  }

  // ---- objects ------------------------------------------------------------------------------------------------
  function ensureObject(id) {
    if (!S.objects.has(id)) S.objects.set(id, { color: colorFor(id), prompts: new Map() });
    if (S.selected == null) S.selected = id;
    return S.objects.get(id);
  }

  function newObject() {
    let id = 1;
    while (S.objects.has(id)) id++;
    if (S.caps && S.objects.size >= S.caps.max_objects) { showError(`at most ${S.caps.max_objects} objects`); return; }
    ensureObject(id); S.selected = id; renderObjects();
  }

  function renderObjects() {
    const ul = $("objects");
    ul.innerHTML = "";
    for (const [id, obj] of S.objects) {
      const li = document.createElement("li");
      li.dataset.id = id;
      if (id === S.selected) li.className = "selected";
      const sw = document.createElement("span");
      sw.className = "swatch"; sw.style.background = css(obj.color);
      const label = document.createElement("span");
      const st = stats.objs[id];
      label.textContent = `object ${id}${st ? (st.present ? "" : " (hidden)") : ""}`;
      const rm = document.createElement("button");
      rm.className = "remove"; rm.textContent = "×"; rm.title = "remove (Delete)";
      rm.onclick = (e) => { e.stopPropagation(); removeObject(id); };
      li.append(sw, label, rm);
      li.onclick = () => { S.selected = id; renderObjects(); };
      ul.appendChild(li);
    }
  }

  function removeObject(id) {
    if (!S.objects.has(id)) return;
    send({ t: "remove", obj: id });
    S.objects.delete(id);
    if (S.selected === id) S.selected = S.objects.size ? [...S.objects.keys()][0] : null;
    renderObjects();
  }

  // ---- input --------------------------------------------------------------------------------------------------
  function toSource(e) {  // CSS pixels → source pixels, at any window size and whatever size the image came in
    const r = canvas.getBoundingClientRect();
    const w = S.width || canvas.width, h = S.height || canvas.height;
    const x = ((e.clientX - r.left) * w) / r.width;
    const y = ((e.clientY - r.top) * h) / r.height;
    return [Math.min(w - 1, Math.max(0, x)), Math.min(h - 1, Math.max(0, y))];
  }

  function addPrompt(point, label, box) {
    if (!S.session || S.watcher || S.index < 0) return;
    if (S.selected == null) newObject();
    const id = S.selected, obj = ensureObject(id), frame = S.index;
    let p = obj.prompts.get(frame);
    if (!p) { p = { points: [], labels: [], box: null }; obj.prompts.set(frame, p); }
    if (point) { p.points.push(point.map((v) => Math.round(v * 10) / 10)); p.labels.push(label); }
    if (box) p.box = box.map((v) => Math.round(v * 10) / 10);
    const msg = { t: "prompt", obj: id, frame, points: p.points, labels: p.labels };
    if (p.box) msg.box = p.box;
    send(msg);
    stats.promptsSent++;
    renderObjects(); redraw();
  }

  canvas.addEventListener("contextmenu", (e) => e.preventDefault());
  canvas.addEventListener("mousedown", (e) => {
    canvas.focus();
    S.drag = { start: toSource(e), cssX: e.clientX, cssY: e.clientY, button: e.button, shift: e.shiftKey };
  });
  canvas.addEventListener("mouseup", (e) => {
    const d = S.drag; S.drag = null;
    if (!d) return;
    const end = toSource(e);
    const moved = Math.hypot(e.clientX - d.cssX, e.clientY - d.cssY);
    if (moved < 5) {
      addPrompt(d.start, d.button === 2 || d.shift ? 0 : 1, null);
    } else if (d.button === 0) {
      const box = [Math.min(d.start[0], end[0]), Math.min(d.start[1], end[1]),
        Math.max(d.start[0], end[0]) + 1, Math.max(d.start[1], end[1]) + 1];
      addPrompt(null, 1, box);
    }
  });

  // ---- display size ---------------------------------------------------------------------------------------------
  // The canvas is shown as large as the page allows (never larger than the source).  The server is told the box
  // the page has for it, in device pixels (`view`, at connect and after a resize): it fits the frame in that box
  // and encodes the JPEG at that size instead of the source's (docs/viewer.md § Display size).
  function fitView() {
    const stage = $("stage");
    const availW = Math.max(1, stage.clientWidth), availH = Math.max(1, window.innerHeight - 70);
    if (S.width && S.height) {
      const scale = Math.min(1, availW / S.width, availH / S.height);
      canvas.style.width = `${Math.floor(S.width * scale)}px`;
      canvas.style.height = `${Math.floor(S.height * scale)}px`;
    }
    const dpr = window.devicePixelRatio || 1;
    const vw = Math.min(16384, Math.round(availW * dpr)), vh = Math.min(16384, Math.round(availH * dpr));
    if (!S.view || S.view[0] !== vw || S.view[1] !== vh) {
      S.view = [vw, vh]; stats.view = S.view;
      send({ t: "view", w: vw, h: vh });
    }
  }
  let fitTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(fitTimer);
    fitTimer = setTimeout(fitView, 150);  // one message per resize gesture, not one per pixel
  });

  function openSource(src) { if (src) send({ t: "open", source: src }); }
  function togglePlay() { send({ t: S.playing ? "pause" : "play" }); }
  function doExport(format) { send({ t: "export", format }); }

  $("open").onclick = () => openSource($("sources").value);
  $("play").onclick = togglePlay;
  $("step").onclick = () => send({ t: "step" });
  $("reset").onclick = () => { send({ t: "reset" }); for (const o of S.objects.values()) o.prompts.clear(); };
  $("newobj").onclick = newObject;
  $("seek").onchange = (e) => send({ t: "seek", frame: Number(e.target.value) });
  $("export-json").onclick = () => doExport("json");
  $("export-png").onclick = () => doExport("png");

  document.addEventListener("keydown", (e) => {
    if (e.target instanceof HTMLInputElement || e.target instanceof HTMLSelectElement) return;
    const k = e.key;
    if (k === " ") { togglePlay(); e.preventDefault(); }
    else if (k === "." || k === "ArrowRight") send({ t: "step" });
    else if (k === "n") newObject();
    else if (k === "r") { send({ t: "reset" }); for (const o of S.objects.values()) o.prompts.clear(); }
    else if (k === "s") $("stats").classList.toggle("hidden");
    else if (k === "e") doExport("json");
    else if (k === "Delete" || k === "Backspace") { if (S.selected != null) removeObject(S.selected); }
    else if (k >= "1" && k <= "9") { const id = Number(k); if (S.objects.has(id)) { S.selected = id; renderObjects(); } }
    else if (k === "Home" && S.seekable) send({ t: "seek", frame: 0 });
  });

  function setStatus(text) { $("status").textContent = text; }
  function showError(text) { $("error").textContent = text; }

  window.__vostreamApi = {
    newObject, removeObject, send, select: (id) => { S.selected = id; renderObjects(); },
    clockOffset, fpsOf, latencySample, pct,  // the figures' computations, for the tests
    maskLayer, decodeCounts,  // the mask decoder and painter, for the tests
  };
  connect();
})();
