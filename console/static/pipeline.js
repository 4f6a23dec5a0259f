// Ferry console, a pipeline's page (opened from a row of the fleet view):
// the card with its facts, lag charts, stages and actions (pause, resume,
// restart, config edit with validate, doctor, offsets, dead letters), and
// the flow picture (flow.js). It reads GET /api/v1/pipelines/{name} and its
// history; nothing else is polled while it is open.
'use strict';
(() => {
  const F = window.Ferry;
  const { $, api, num, dur, cell, AuthError, errorText } = F;
  const SEGMENTS = [
    ['commit_to_read', 'commit → read'],
    ['read_to_ack', 'read → broker ack'],
    ['commit_to_ack', 'commit → broker ack'],
    ['ack_to_consumed', 'ack → consumed (canary)'],
  ];
  const HISTORY_MS = 5000;
  const SVG = 'http://www.w3.org/2000/svg';
  const placement = F.placement;
  const refresh = () => F.refresh();

  // ---- cards -----------------------------------------------------------
  function makeCard(p) {
    const el = $('#card').content.firstElementChild.cloneNode(true);
    el.dataset.pipeline = p.name;
    const charts = $('.charts', el);
    for (const [seg, title] of SEGMENTS) {
      const box = document.createElement('div');
      box.className = 'chart';
      box.dataset.segment = seg;
      const head = document.createElement('div');
      head.className = 'title';
      const t = document.createElement('span');
      t.textContent = title;
      const now = document.createElement('span');
      now.className = 'now';
      head.append(t, now);
      const svg = document.createElementNS(SVG, 'svg');
      svg.setAttribute('viewBox', '0 0 300 48');
      svg.setAttribute('preserveAspectRatio', 'none');
      svg.setAttribute('role', 'img');
      svg.setAttribute('aria-label', title + ' lag, p50 and p99, last 15 minutes');
      for (const cls of ['area', 'p99', 'p50']) {
        const path = document.createElementNS(SVG, 'path');
        path.setAttribute('class', cls);
        path.setAttribute('vector-effect', 'non-scaling-stroke');
        svg.append(path);
      }
      const legend = document.createElement('div');
      legend.className = 'legend';
      legend.innerHTML = '<span class="k50">— p50</span> <span class="k99">— p99</span> <span class="max"></span>';
      box.append(head, svg, legend);
      charts.append(box);
    }
    const card = { el, p, hist: null, version: 0 };
    el.addEventListener('click', (ev) => {
      const b = ev.target.closest('button[data-action]');
      if (b) act(card, b.dataset.action, b);
    });
    $('.editor', el).addEventListener('submit', (ev) => { ev.preventDefault(); apply(card); });
    const rf = $('.reset', el);
    rf.addEventListener('submit', (ev) => { ev.preventDefault(); reset(card, true).catch(() => {}); });
    rf.elements.to.addEventListener('change', () => {
      rf.elements.time.hidden = rf.elements.to.value !== 'time';
      $('button[data-action="reset-apply"]', el).hidden = true; // the dry run was for another target
    });
    rf.elements.time.addEventListener('input', () => { $('button[data-action="reset-apply"]', el).hidden = true; });
    return card;
  }

  function update(c) {
    const p = c.p, el = c.el, where = placement(p);
    el.className = 'pipeline s-' + where.state;
    $('.name', el).textContent = p.name;
    const state = where.state.replace('_', ' ');
    $('.state', el).textContent = p.state === 'standby' && where.state !== 'standby' ? state + ' (standby here)' : state;
    $('.path', el).textContent = (p.source || '?') + ' → ' + (p.sink || '?') + (p.managed_by ? ' · ' + p.managed_by : '');
    $('.owner', el).textContent = where.owner;
    const h = p.health;
    const measured = h && h.checked_at && !h.checked_at.startsWith('0001');
    $('.backlog', el).textContent = h && h.measure_error ? 'cannot be measured: ' + h.measure_error
      : measured ? num(h.backlog) + ' ' + (h.backlog_unit || '') : '—';
    const pr = p.progress;
    $('.drain', el).textContent = !pr ? '—'
      : num(Math.round(pr.delivered_per_second)) + '/s' + (pr.eta_seconds != null ? ' · ETA ' + dur(pr.eta_seconds) : '');
    $('.oldest', el).textContent = measured && !h.measure_error ? dur(h.oldest_age_seconds) : '—';
    $('.inflight', el).textContent = p.flow ? num(p.flow.in_flight) : '—';
    // Only a broker that says so is counted (NATS); '—' where it cannot.
    $('.duplicates', el).textContent = p.duplicates_total == null ? '—' : num(p.duplicates_total);
    const dead = c.hist ? c.hist.dead_lettered_events : null;
    const parked = p.flow && p.flow.given_up ? ' (+' + num(p.flow.given_up) + ' parked)' : '';
    $('.dead', el).textContent = (dead == null ? '—' : num(dead)) + parked;
    const canary = p.lag && p.lag.ack_to_consumed;
    $('.canary', el).textContent = canary && canary.count ? dur(canary.p50_seconds) + ' (p50, 1 min)' : 'none in the last minute';
    $('.lasterror', el).textContent = where.error;
    const paused = p.state === 'paused' || p.desired_state === 'paused';
    $('button[data-action="pause"]', el).disabled = paused;
    $('button[data-action="resume"]', el).disabled = !paused;
    // File pipelines are read-only; every other action works on both,
    // with or without --store.
    $('button[data-action="edit"]', el).hidden = p.managed_by !== 'api';
    drawCharts(c);
    drawStages(c);
  }

  // Lag charts: the history's samples plus the status's current minute,
  // over the history's window; a gap where a sample saw no event.
  function drawCharts(c) {
    const now = Date.now();
    // The time axis is what the history holds when full: 15 minutes by
    // default (90 samples 10 s apart).
    const WINDOW_MS = ((c.hist && c.hist.window_seconds) || 900) * 1000;
    const pts = ((c.hist && c.hist.points) || []).map((pt) => ({ t: Date.parse(pt.at), lag: pt.lag || {} }));
    pts.push({ t: now, lag: c.p.lag || {} });
    for (const box of c.el.querySelectorAll('.chart')) {
      const seg = box.dataset.segment;
      const series = pts.filter((pt) => pt.t >= now - WINDOW_MS).map((pt) => ({ t: pt.t, s: pt.lag[seg] || { count: 0 } }));
      // A log scale from 1 ms: lag spans microseconds to minutes, and a
      // spike must not flatten the rest of the line.
      let max = 0;
      for (const { s } of series) if (s.count) max = Math.max(max, s.p99_seconds, s.p50_seconds);
      const floor = 0.001;
      const top = Math.max(max * 1.5, floor * 10);
      const x = (t) => (300 * (t - (now - WINDOW_MS)) / WINDOW_MS).toFixed(1);
      const y = (v) => (46 - 44 * Math.min(Math.log(Math.max(v, floor) / floor) / Math.log(top / floor), 1)).toFixed(1);
      const line = (key) => {
        let d = '', run = 0;
        for (const { t, s } of series) {
          if (!s.count) { run = 0; continue; }
          d += (run ? ' L' : ' M') + x(t) + ' ' + y(s[key]);
          if (!run) d += ' h2'; // a lone sample still shows
          run++;
        }
        return d.trim();
      };
      const p50 = line('p50_seconds');
      $('.p50', box).setAttribute('d', p50);
      $('.p99', box).setAttribute('d', line('p99_seconds'));
      let area = '';
      for (const part of p50.split('M').filter(Boolean)) {
        const xs = part.match(/[\d.]+(?= )/g) || [];
        area += 'M' + part + ' V47 H' + xs[0] + ' Z ';
      }
      $('.area', box).setAttribute('d', p50.includes('L') ? area : '');
      const cur = (c.p.lag || {})[seg];
      $('.now', box).textContent = cur && cur.count ? dur(cur.p50_seconds) + ' / ' + dur(cur.p99_seconds) : 'no events';
      $('.max', box).textContent = max > 0 ? 'log scale, 1 ms – ' + dur(top) : '';
    }
  }

  function drawStages(c) {
    const body = $('.stages tbody', c.el);
    const stages = (c.hist && c.hist.stages) || [];
    $('.stages-box', c.el).hidden = !stages.length;
    body.replaceChildren(...stages.map((s) => {
      const tr = document.createElement('tr');
      for (const v of [s.stage, s.events.ok, s.events.dropped, s.events.dead_lettered, s.events.error]) {
        const td = document.createElement('td');
        td.textContent = typeof v === 'string' ? v : num(v || 0);
        tr.append(td);
      }
      return tr;
    }));
  }

  // ---- actions ---------------------------------------------------------
  const enc = encodeURIComponent;

  async function act(c, action, button) {
    const out = $('.action-result', c.el);
    const name = c.p.name;
    try {
      if (['pause', 'resume', 'restart'].includes(action)) {
        button.disabled = true;
        out.textContent = action + '…';
        const r = await api('POST', `/api/v1/pipelines/${enc(name)}/${action}`);
        out.textContent = r.status < 300 ? action + ': done' : action + ': ' + errorText(r);
        if (r.status < 300) refresh();
        else button.disabled = false;
      } else if (action === 'edit') {
        const r = await api('GET', `/api/v1/pipelines/${enc(name)}/config`);
        if (r.status !== 200) { out.textContent = 'config: ' + errorText(r); return; }
        c.version = r.data.version || 0;
        const ed = $('.editor', c.el);
        ed.elements.config.value = r.data.config;
        $('.problems', ed).replaceChildren();
        ed.hidden = false;
      } else if (action === 'doctor') {
        button.disabled = true;
        out.textContent = 'doctor: walking the pipeline…';
        const r = await api('GET', `/api/v1/pipelines/${enc(name)}/doctor`);
        button.disabled = false;
        if (r.status !== 200) { out.textContent = 'doctor: ' + errorText(r); return; }
        out.textContent = r.data.healthy ? 'doctor: healthy' : 'doctor: first unhealthy stage ' + r.data.stage;
        showDiagnosis(c, r.data);
      } else if (action === 'offsets') {
        const box = $('.offsets', c.el);
        box.hidden = !box.hidden;
        if (!box.hidden) await showOffsets(c);
      } else if (action === 'reset-apply') {
        await reset(c, false);
      } else if (action === 'deadletters') {
        const box = $('.deadletters', c.el);
        box.hidden = !box.hidden;
        if (!box.hidden) await showDeadLetters(c);
      } else if (action === 'replay') {
        await replay(c, button);
      } else if (action === 'cancel') {
        $('.editor', c.el).hidden = true;
      } else if (action === 'validate') {
        const ed = $('.editor', c.el);
        const r = await api('POST', '/api/v1/validate', ed.elements.config.value);
        if (r.status !== 200) { showProblems(c, [{ message: errorText(r) }].concat((r.data && r.data.details) || [])); return; }
        showProblems(c, r.data.valid ? [] : r.data.errors, r.data.valid ? 'valid' : '');
      }
    } catch (e) {
      if (!(e instanceof AuthError)) out.textContent = action + ': ' + e.message;
    }
  }

  async function apply(c) {
    const ed = $('.editor', c.el);
    try {
      const headers = c.version ? { 'If-Match': '"' + c.version + '"' } : {};
      const r = await fetch(`/api/v1/pipelines/${enc(c.p.name)}/config`, {
        method: 'PUT', credentials: 'omit', cache: 'no-store', body: ed.elements.config.value,
        headers: Object.assign({ Accept: 'application/json', 'Content-Type': 'application/yaml', Authorization: 'Bearer ' + F.state.token }, headers),
      });
      const data = await r.json().catch(() => ({}));
      if (r.status === 401) { F.showLogin(data.error); return; }
      if (r.status >= 300) { showProblems(c, [{ message: data.error || 'HTTP ' + r.status }].concat(data.details || [])); return; }
      ed.hidden = true;
      $('.action-result', c.el).textContent = data.changed ? 'applied: version ' + data.pipeline.version : 'unchanged';
      refresh();
    } catch (e) {
      showProblems(c, [{ message: e.message }]);
    }
  }

  // ---- offsets and dead letters ---------------------------------------
  const show = (v) => (v == null ? '—' : typeof v === 'object' ? JSON.stringify(v) : String(v));

  // The source's position in its own terms, as GET …/offsets gives it.
  async function showOffsets(c) {
    const dl = $('.position', c.el);
    const r = await api('GET', `/api/v1/pipelines/${enc(c.p.name)}/offsets`);
    if (r.status !== 200) {
      dl.replaceChildren(cell('dd', 'offsets: ' + errorText(r)));
      dl.firstChild.className = 'error';
      return;
    }
    const rows = Object.entries(r.data.position || {});
    rows.push(['newest delivered created_at', r.data.newest_delivered_created_at || 'unknown']);
    if (r.data.note) rows.push(['note', r.data.note]);
    dl.replaceChildren(...rows.map(([k, v]) => {
      const d = document.createElement('div');
      d.append(cell('dt', k), cell('dd', show(v)));
      return d;
    }));
  }

  // A reset is always a dry run first; its counts are shown and Apply
  // sends the same request for real (the API refuses it with 409 unless
  // the pipeline is paused).
  async function reset(c, dry) {
    const f = $('.reset', c.el), out = $('.reset-result', c.el), again = $('button[data-action="reset-apply"]', c.el);
    let body = c.resetReq;
    if (dry) {
      body = { to: f.elements.to.value };
      if (body.to === 'time') body.time = f.elements.time.value.trim();
    }
    again.hidden = true;
    out.classList.remove('error');
    out.textContent = dry ? 'dry run…' : 'resetting…';
    try {
      const r = await api('PATCH', `/api/v1/pipelines/${enc(c.p.name)}/offsets` + (dry ? '?dry_run=true' : ''), body);
      if (r.status !== 200) {
        out.classList.add('error');
        out.textContent = (dry ? 'dry run: ' : 'reset: ') + errorText(r);
        return;
      }
      const d = r.data;
      const counts = num(d.resend_events) + ' re-sent, ' + num(d.skip_events) + ' skipped' + (d.note ? ' (' + d.note + ')' : '');
      if (dry) {
        c.resetReq = body;
        out.textContent = 'dry run: ' + counts + '. Apply to do it.';
        again.hidden = false;
      } else {
        c.resetReq = null;
        out.textContent = 'reset: ' + counts + '. Resume the pipeline to deliver from there.';
        await showOffsets(c);
      }
    } catch (e) {
      if (!(e instanceof AuthError)) { out.classList.add('error'); out.textContent = 'reset: ' + e.message; }
    }
  }

  // Events the source parked (poll): id, reason, attempts.
  async function showDeadLetters(c) {
    const sum = $('.dl-summary', c.el), table = $('.dl-list', c.el);
    const r = await api('GET', `/api/v1/pipelines/${enc(c.p.name)}/dead-letters`);
    sum.classList.toggle('error', r.status !== 200);
    const list = (r.status === 200 && r.data.dead_letters) || [];
    table.hidden = !list.length;
    $('tbody', table).replaceChildren(...list.map((d) => {
      const tr = document.createElement('tr');
      tr.append(cell('td', show(d.outbox_id)), cell('td', d.reason || ''), cell('td', num(d.attempts)));
      return tr;
    }));
    if (r.status !== 200) sum.textContent = 'dead letters: ' + errorText(r);
    else if (r.data.note) sum.textContent = r.data.note;
    else sum.textContent = num(r.data.total) + ' parked' + (r.data.total > list.length ? ', the oldest ' + list.length + ' shown' : '');
  }

  async function replay(c, button) {
    const out = $('.replay-result', c.el);
    button.disabled = true;
    out.classList.remove('error');
    out.textContent = 'replaying…';
    try {
      const r = await api('POST', `/api/v1/pipelines/${enc(c.p.name)}/dead-letters/replay`);
      if (r.status !== 200) { out.classList.add('error'); out.textContent = 'replay: ' + errorText(r); return; }
      out.textContent = num(r.data.replayed_events) + ' replayed';
      await showDeadLetters(c);
    } finally {
      button.disabled = false;
    }
  }

  // The doctor's walk, database to consumer, the first unhealthy stage
  // marked with its suggested fix.
  function showDiagnosis(c, d) {
    const ol = $('.doctor', c.el);
    ol.replaceChildren(...(d.checks || []).map((ch) => {
      const li = document.createElement('li');
      li.className = ch.status === 'unhealthy' ? 'unhealthy first' : ch.status === 'ok' ? 'ok' : '';
      const st = document.createElement('span');
      st.className = 'st';
      st.textContent = ch.stage + ': ' + ch.status;
      li.append(st);
      for (const e of ch.evidence || []) li.append(Object.assign(document.createElement('span'), { className: 'evidence', textContent: e }));
      if (ch.action) li.append(Object.assign(document.createElement('span'), { className: 'action', textContent: '→ ' + ch.action }));
      return li;
    }));
    ol.hidden = false;
  }

  function showProblems(c, list, ok) {
    const ul = $('.problems', c.el);
    ul.classList.toggle('error', !ok);
    const items = list.map((d) => {
      const li = document.createElement('li');
      li.textContent = (d.line ? 'line ' + d.line + ': ' : '') + (d.path ? d.path + ': ' : '') + d.message;
      return li;
    });
    if (ok) items.push(Object.assign(document.createElement('li'), { textContent: ok }));
    ul.replaceChildren(...items);
  }

  // ---- the page -----------------------------------------------------
  let card = null, lastHistory = 0;

  // load reads the open pipeline's view (and, every HISTORY_MS, its
  // history) and draws the page; false when the pipeline cannot be read.
  async function load(name, force) {
    const r = await api('GET', `/api/v1/pipelines/${enc(name)}`);
    if (r.status !== 200) {
      close();
      const p = cell('p', r.status === 404 ? 'No pipeline ' + name + ' that this token may see.' : 'pipeline ' + name + ': ' + errorText(r));
      p.className = 'error';
      $('#pipeline-card').replaceChildren(p);
      $('#flow').replaceChildren();
      return false;
    }
    F.banner(r.data.stale ? 'The store is unavailable: this is the last state read.' : '');
    if (!card || card.p.name !== name) {
      card = makeCard(r.data);
      $('#pipeline-card').replaceChildren(card.el);
      lastHistory = 0;
    }
    card.p = r.data;
    if (force || Date.now() - lastHistory >= HISTORY_MS) {
      lastHistory = Date.now();
      const h = await api('GET', `/api/v1/pipelines/${enc(name)}/history`);
      if (h.status === 200) card.hist = h.data;
    }
    $('#page-title').textContent = name;
    update(card);
    F.drawFlow($('#flow'), card.p, card.hist);
    return true;
  }

  function close() {
    if (card) card.el.remove();
    card = null;
  }

  F.Pipeline = { load, close };
})();
