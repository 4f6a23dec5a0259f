// Ferry console: signs in, keeps the view in the URL's hash and refreshes
// what is on screen every 2 s — the fleet view (fleet.js) with one request
// for every pipeline, or one pipeline's page (pipeline.js, flow.js). The
// hash holds the filters, the sort, the page and the open pipeline
// (#state=backing_off&sort=oldest&dir=desc&p=orders), so a view can be
// shared and bookmarked.
'use strict';
(() => {
  const F = window.Ferry;
  const { $, api, AuthError } = F;
  const REFRESH_MS = 2000;
  const KEYS = ['q', 'tenant', 'state', 'source', 'sink', 'unhealthy', 'sort', 'dir', 'page', 'p'];
  let rendered = false;

  // ---- the view in the URL ---------------------------------------------
  F.view = () => {
    const h = new URLSearchParams(location.hash.slice(1));
    const v = {};
    for (const k of KEYS) if (h.get(k)) v[k] = h.get(k);
    if (v.page) v.page = Number(v.page) || undefined;
    return v;
  };
  F.hashFor = (v) => {
    const h = new URLSearchParams();
    for (const k of KEYS) if (v[k] != null && v[k] !== '') h.set(k, v[k]);
    const s = h.toString();
    return s ? '#' + s : '#';
  };
  // setView changes part of the view: a new history entry when it opens or
  // leaves a pipeline (so Back returns), else in place (typing a search).
  F.setView = (patch, push) => {
    const v = Object.assign(F.view(), patch);
    const hash = F.hashFor(v);
    if (push || ('p' in patch)) location.hash = hash;
    else { history.replaceState(null, '', hash === '#' ? location.pathname : hash); show(false); }
  };
  window.addEventListener('hashchange', () => show(true));
  document.addEventListener('keydown', (ev) => {
    if (ev.key === 'Escape' && !$('#page').hidden && !/^(INPUT|SELECT|TEXTAREA)$/.test(document.activeElement.tagName)) location.hash = $('#back').getAttribute('href');
  });

  // show draws the section the view asks for; fetch: read the API first.
  function show(fetch) {
    const v = F.view();
    if (rendered && !F.state.signedOut) {
      $('#fleet').hidden = !!v.p;
      $('#page').hidden = !v.p;
    }
    $('#back').href = F.hashFor(Object.assign({}, v, { p: undefined }));
    if (v.p) { if (fetch) refresh(true); return; }
    F.Pipeline.close();
    document.title = 'Ferry console';
    F.Fleet.render(v);
    if (fetch) refresh(true);
  }

  // ---- sign in / out -------------------------------------------------
  F.showLogin = (msg) => {
    F.state.signedOut = true;
    F.Pipeline.close();
    $('#fleet-table tbody').replaceChildren();
    $('#counts').replaceChildren();
    $('#pipeline-card').replaceChildren();
    $('#flow').replaceChildren();
    $('#fleet').hidden = $('#page').hidden = true;
    $('#login').hidden = false;
    $('#login-error').textContent = msg || '';
    $('#logout').hidden = !F.state.token;
    $('#token').focus();
  };

  $('#login').addEventListener('submit', (ev) => {
    ev.preventDefault();
    F.setToken($('#token').value.trim());
    $('#token').value = '';
    F.state.signedOut = false;
    $('#login').hidden = true;
    refresh(true);
  });

  $('#logout').addEventListener('click', () => {
    F.setToken('');
    F.showLogin('');
    refresh(true);
  });

  // ---- polling ---------------------------------------------------------
  let busy = false;

  F.refresh = refresh;
  async function refresh(force) {
    if (busy && !force) return;
    busy = true;
    try {
      const v = F.view();
      let ok;
      if (v.p) ok = await F.Pipeline.load(v.p, force);
      else ok = await loadFleet(v);
      if (ok === null) return;
      F.state.signedOut = false;
      $('#login').hidden = true;
      $('#logout').hidden = !F.state.token;
      $('#fleet').hidden = !!v.p;
      $('#page').hidden = !v.p;
      $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
      if (!rendered) {
        rendered = true;
        performance.mark('ferry-rendered');
        document.body.dataset.rendered = 'true';
      }
    } catch (e) {
      if (!(e instanceof AuthError)) F.banner('The API does not answer: ' + e.message);
    } finally {
      busy = false;
    }
  }

  // loadFleet reads the summary and draws the table; null when it could
  // not (the banner says why).
  async function loadFleet(v) {
    const r = await api('GET', '/api/v1/summary');
    if (r.status !== 200) { F.banner(F.errorText(r)); return null; }
    F.banner(r.data.stale ? 'The store is unavailable: this is the last state read.' : '');
    F.Fleet.setData(r.data);
    if (!F.view().p) F.Fleet.render(F.view());
    return true;
  }

  F.Fleet.wire();
  show(false);
  refresh(true);
  setInterval(() => { if (!F.state.signedOut) refresh(); }, REFRESH_MS);
})();
