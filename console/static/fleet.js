// Ferry console, the fleet view: one table row per pipeline from one
// request (GET /api/v1/summary), with search, filters, counts per state,
// sort by any column (unhealthy first by default) and pages of PAGE rows,
// so only what is on screen is drawn however large the fleet. The view
// (filters, sort, page) lives in the URL's hash (app.js), so it can be
// shared and bookmarked. Keyboard: / search, ↓/j ↑/k move, Enter opens.
'use strict';
(() => {
  const F = window.Ferry;
  const { $, num, dur, cell } = F;
  const PAGE = 50;
  // Columns: key, heading, how a row shows it (a cell's text), its sort key.
  const COLUMNS = [
    ['name', 'Name', (r) => r.name],
    ['tenant', 'Tenant', (r) => r.tenant || '—'],
    ['state', 'State', (r) => F.stateText(r.state) + ' · ' + F.ago(r.in_state), (r) => F.severity(r.state, r.error) * 1e12 - r.in_state],
    ['owner', 'Runs on', (r) => r.owner || F.here(r.state)],
    ['backlog', 'Backlog', (r) => (r.backlog == null ? '—' : num(r.backlog) + (r.backlog_unit === 'bytes' ? ' B' : '')), (r) => r.backlog ?? -1],
    ['oldest', 'Oldest', (r) => dur(r.oldest), (r) => r.oldest ?? -1],
    ['p99', 'p99 commit→ack', (r) => dur(r.p99), (r) => r.p99 ?? -1],
    ['dead', 'Dead letters', (r) => num(r.dead), (r) => r.dead],
    ['error', 'Last error', (r) => r.error || ''],
  ];
  const byKey = new Map(COLUMNS.map((c) => [c.key = c[0], c]));
  const FILTERS = ['tenant', 'state', 'source', 'sink'];

  let rows = [], shown = [], selected = '', searchTimer = 0, typed = null;

  // search applies what was typed into the search box.
  function search() {
    clearTimeout(searchTimer);
    if (typed === null) return;
    const q = typed;
    typed = null;
    F.setView({ q: q || undefined, page: undefined });
  }

  // setData takes a summary answer: rows as arrays, named by fields.
  function setData(s) {
    const at = s.fields.reduce((m, f, i) => (m[f] = i, m), {});
    rows = s.rows.map((a) => ({
      name: a[at.name], tenant: a[at.tenant], state: a[at.state], in_state: a[at.in_state_seconds], owner: a[at.owner],
      source: a[at.source], sink: a[at.sink], backlog: a[at.backlog], backlog_unit: a[at.backlog_unit],
      oldest: a[at.oldest_age_seconds], p99: a[at.p99_commit_to_ack_seconds], dead: a[at.dead_letters], error: a[at.last_error],
    }));
  }

  function matches(r, v, except) {
    if (v.q && !r.name.toLowerCase().includes(v.q.toLowerCase())) return false;
    for (const f of FILTERS) if (f !== except && v[f] && r[f] !== v[f]) return false;
    return !(v.unhealthy && !F.unhealthy(r.state, r.error));
  }

  function sorted(list, v) {
    const col = byKey.get(v.sort);
    const dir = v.dir === 'desc' ? -1 : 1;
    if (!col) { // the default: the worst first, then the oldest waiting, then by name
      return list.sort((a, b) => F.severity(a.state, a.error) - F.severity(b.state, b.error) ||
        (b.oldest ?? -1) - (a.oldest ?? -1) || a.name.localeCompare(b.name));
    }
    const key = col[3] || col[2];
    return list.sort((a, b) => {
      const x = key(a), y = key(b);
      const c = typeof x === 'number' && typeof y === 'number' ? x - y : String(x).localeCompare(String(y));
      return dir * c || a.name.localeCompare(b.name);
    });
  }

  // render draws the table for view v; F.renderMS is what the last draw
  // took in the page (filter, sort, one page of rows), for the tests.
  function render(v) {
    const t0 = performance.now();
    try { draw(v); } finally { F.renderMS = performance.now() - t0; }
  }

  function draw(v) {
    drawCounts(v);
    drawOptions(v);
    shown = sorted(rows.filter((r) => matches(r, v)), v);
    const pages = Math.max(1, Math.ceil(shown.length / PAGE));
    const page = Math.min(Math.max(1, v.page || 1), pages);
    if (selected && !shown.some((r) => r.name === selected)) selected = '';
    const body = $('#fleet-table tbody');
    body.replaceChildren(...shown.slice((page - 1) * PAGE, page * PAGE).map((r) => drawRow(r, v)));
    $('#page-of').textContent = shown.length ? `${(page - 1) * PAGE + 1}–${Math.min(page * PAGE, shown.length)} of ${num(shown.length)}` +
      (shown.length !== rows.length ? ` (${num(rows.length)} in all)` : '') : 'No pipeline matches.';
    $('#prev').disabled = page <= 1;
    $('#next').disabled = page >= pages;
    for (const th of document.querySelectorAll('#fleet-table th[data-sort]')) {
      const on = th.dataset.sort === (v.sort || '');
      th.setAttribute('aria-sort', on ? (v.dir === 'desc' ? 'descending' : 'ascending') : 'none');
    }
    if (!rows.length) $('#page-of').textContent = 'No pipeline this token may see.';
  }

  function drawRow(r, v) {
    const tr = document.createElement('tr');
    tr.dataset.pipeline = r.name;
    tr.className = 's-' + r.state + (F.unhealthy(r.state, r.error) ? ' unhealthy' : '') + (r.name === selected ? ' selected' : '');
    if (r.name === selected) tr.setAttribute('aria-selected', 'true');
    for (const col of COLUMNS) {
      const td = cell('td', '');
      td.className = 'c-' + col.key;
      td.dataset.label = col[1];
      if (col.key === 'name') {
        const a = cell('a', r.name);
        a.href = F.hashFor(Object.assign({}, v, { p: r.name }));
        td.append(a);
      } else {
        td.textContent = col[2](r);
        if (col.key === 'error' && r.error) td.title = r.error;
      }
      tr.append(td);
    }
    return tr;
  }

  function drawCounts(v) {
    const by = new Map();
    let bad = 0;
    for (const r of rows) {
      by.set(r.state, (by.get(r.state) || 0) + 1);
      if (F.unhealthy(r.state, r.error)) bad++;
    }
    const buttons = [...by.keys()].sort((a, b) => F.severity(a, '') - F.severity(b, '') || a.localeCompare(b)).map((s) => {
      const b = cell('button', num(by.get(s)) + ' ' + F.stateText(s));
      b.type = 'button';
      b.dataset.state = s;
      b.className = 'count s-' + s;
      b.setAttribute('aria-pressed', String(v.state === s));
      return b;
    });
    const u = cell('button', num(bad) + ' unhealthy');
    u.type = 'button';
    u.dataset.unhealthy = 'true';
    u.className = 'count' + (bad ? ' bad' : '');
    u.setAttribute('aria-pressed', String(!!v.unhealthy));
    $('#counts').replaceChildren(cell('span', num(rows.length) + ' pipelines'), u, ...buttons);
  }

  // Each filter offers the values the rows have, counting the other filters.
  function drawOptions(v) {
    for (const f of FILTERS) {
      const sel = $('#f-' + f);
      const values = [...new Set(rows.filter((r) => matches(r, v, f)).map((r) => r[f]).concat(v[f] ? [v[f]] : []))].sort();
      const want = ['', ...values].join('\n');
      if (sel.dataset.values !== want) {
        sel.replaceChildren(cell('option', 'any ' + f), ...values.map((x) => Object.assign(cell('option', f === 'state' ? F.stateText(x) : x || '(none)'), { value: x })));
        sel.firstChild.value = '';
        sel.dataset.values = want;
      }
      sel.value = v[f] || '';
    }
    $('#unhealthy').checked = !!v.unhealthy;
    // Not while it has the focus or holds what is not applied yet.
    if (document.activeElement !== $('#q') && typed === null) $('#q').value = v.q || '';
  }

  // move selects the row `by` away from the selected one (the first when
  // none is), turning the page when it leaves this one.
  function move(by, v) {
    if (!shown.length) return;
    let i = shown.findIndex((r) => r.name === selected);
    i = i < 0 ? (by > 0 ? 0 : shown.length - 1) : Math.min(Math.max(i + by, 0), shown.length - 1);
    selected = shown[i].name;
    const page = Math.floor(i / PAGE) + 1;
    if (page !== (v.page || 1)) F.setView({ page: page > 1 ? page : undefined });
    else render(v);
    const tr = document.querySelector(`#fleet-table tr[data-pipeline="${CSS.escape(selected)}"]`);
    if (tr) tr.scrollIntoView({ block: 'nearest' });
  }

  function wire() {
    $('#counts').addEventListener('click', (ev) => {
      const b = ev.target.closest('button');
      if (!b) return;
      const v = F.view();
      if (b.dataset.unhealthy) F.setView({ unhealthy: v.unhealthy ? undefined : '1', page: undefined });
      else F.setView({ state: v.state === b.dataset.state ? undefined : b.dataset.state, page: undefined });
    });
    for (const f of FILTERS) $('#f-' + f).addEventListener('change', (ev) => F.setView({ [f]: ev.target.value || undefined, page: undefined }));
    $('#unhealthy').addEventListener('change', (ev) => F.setView({ unhealthy: ev.target.checked ? '1' : undefined, page: undefined }));
    // Typing redraws once it pauses, not on every key: a thousand rows
    // are filtered and sorted on each draw.
    $('#q').addEventListener('input', (ev) => {
      typed = ev.target.value;
      clearTimeout(searchTimer);
      searchTimer = setTimeout(search, 120);
    });
    $('#filters').addEventListener('submit', (ev) => ev.preventDefault());
    $('#fleet-table thead').addEventListener('click', (ev) => {
      const th = ev.target.closest('th[data-sort]');
      if (!th) return;
      const v = F.view(), key = th.dataset.sort || undefined;
      const dir = v.sort === key && v.dir !== 'desc' ? 'desc' : undefined;
      F.setView({ sort: key, dir: key ? dir : undefined, page: undefined });
    });
    $('#prev').addEventListener('click', () => F.setView({ page: Math.max(1, (F.view().page || 1) - 1) }));
    $('#next').addEventListener('click', () => F.setView({ page: (F.view().page || 1) + 1 }));
    document.addEventListener('keydown', (ev) => {
      if ($('#fleet').hidden || ev.ctrlKey || ev.metaKey || ev.altKey || document.activeElement.tagName === 'A') return;
      if (ev.key === 'Enter' && document.activeElement.matches('th[data-sort]')) { ev.preventDefault(); document.activeElement.click(); return; }
      const typing = /^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName);
      if (ev.key === '/' && !typing) { ev.preventDefault(); $('#q').focus(); $('#q').select(); return; }
      if (ev.key === 'Escape' && typing) { document.activeElement.blur(); return; }
      if (typing && ev.key !== 'ArrowDown' && ev.key !== 'ArrowUp' && ev.key !== 'Enter') return;
      if (typing && ev.key === 'Enter' && document.activeElement !== $('#q')) return;
      if (ev.key === 'Enter' && document.activeElement === $('#q')) search();
      const v = F.view();
      if (ev.key === 'ArrowDown' || (!typing && ev.key === 'j')) { ev.preventDefault(); move(1, v); }
      else if (ev.key === 'ArrowUp' || (!typing && ev.key === 'k')) { ev.preventDefault(); move(-1, v); }
      else if (ev.key === 'Enter' && (selected || shown.length)) { ev.preventDefault(); F.setView({ p: selected || shown[0].name }, true); }
    });
  }

  F.Fleet = { setData, render, wire, columns: COLUMNS };
})();
