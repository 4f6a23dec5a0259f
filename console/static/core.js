// Ferry console, shared parts: the API client with the bearer token kept in
// this tab's sessionStorage, and formatting. Every request carries the token
// in the Authorization header and no cookie, so another site cannot act for
// the user (no CSRF), and all text goes in through textContent (no markup
// from the API is ever interpreted). The other scripts (fleet.js,
// pipeline.js, app.js) reach these through window.Ferry.
'use strict';
(() => {
  const KEY = 'ferry.token';
  const F = window.Ferry = {};
  const $ = F.$ = (sel, root = document) => root.querySelector(sel);
  F.state = { token: sessionStorage.getItem(KEY) || '', signedOut: false };

  class AuthError extends Error {}
  F.AuthError = AuthError;

  F.api = async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    if (F.state.token) headers.Authorization = 'Bearer ' + F.state.token;
    if (body !== undefined && typeof body !== 'string') { body = JSON.stringify(body); headers['Content-Type'] = 'application/json'; }
    else if (body !== undefined) headers['Content-Type'] = 'application/yaml';
    const r = await fetch(path, { method, headers, body, credentials: 'omit', cache: 'no-store' });
    let data = null;
    try { data = await r.json(); } catch (_) { /* not JSON */ }
    if (r.status === 401) {
      F.showLogin(F.state.token ? (data && data.error) || 'the token was refused' : '');
      throw new AuthError('unauthorized');
    }
    return { status: r.status, data };
  };

  F.setToken = (t) => {
    F.state.token = t;
    if (t) sessionStorage.setItem(KEY, t); else sessionStorage.removeItem(KEY);
  };

  F.errorText = (res) => {
    const d = res.data || {};
    return d.error || ('HTTP ' + res.status);
  };

  F.banner = (msg) => {
    const b = $('#banner');
    b.textContent = msg;
    b.hidden = !msg;
  };

  // ---- formatting ----------------------------------------------------
  F.dur = (seconds) => {
    if (seconds == null || isNaN(seconds)) return '—';
    if (seconds === 0) return '0 s';
    if (seconds < 0.001) return (seconds * 1e6).toFixed(0) + ' µs';
    if (seconds < 1) return (seconds * 1000).toFixed(seconds < 0.01 ? 1 : 0) + ' ms';
    if (seconds < 120) return seconds.toFixed(seconds < 10 ? 2 : 0) + ' s';
    if (seconds < 7200) return (seconds / 60).toFixed(0) + ' min';
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + ' h';
    return (seconds / 86400).toFixed(0) + ' d';
  };
  // ago is how long a state has lasted, coarsely: a table cell's worth.
  F.ago = (s) => (s == null ? '—' : s < 60 ? s + 's' : s < 3600 ? Math.floor(s / 60) + 'm' : s < 172800 ? Math.floor(s / 3600) + 'h' : Math.floor(s / 86400) + 'd');
  F.num = (n) => (n == null ? '—' : Number(n).toLocaleString('en-US'));
  F.cell = (tag, text) => Object.assign(document.createElement(tag), { textContent: text });
  F.stateText = (s) => String(s || '').replace('_', ' ');

  // A pipeline needs someone when it does not run as it should, or says
  // why not; paused, standby and pending are states people chose or wait on.
  const BAD = { failed: 0, stopped: 1, stalled: 2, backing_off: 3 };
  F.severity = (state, error) => (state in BAD ? BAD[state] : error ? 4 : 9);
  F.unhealthy = (state, error) => F.severity(state, error) < 9;

  // Where it runs: with HA, the owner every instance names (its status is
  // the owner's, whichever instance serves the page); else the instances
  // that reported it through the store, or this instance (without a
  // store, or when none reported it).
  F.placement = (p) => {
    if (p.owner) return { state: p.state, owner: p.owner, error: p.last_error || '' };
    const on = p.running_on || [];
    if (on.length) {
      const first = on[0];
      const where = on.map((i) => i.instance).join(', ');
      // This instance holds it in standby: show the owner's state.
      if (p.state === 'standby' || p.state === 'pending') {
        return { state: first.state, owner: where, error: p.last_error || first.last_error || '' };
      }
      return { state: p.state, owner: where, error: p.last_error || '' };
    }
    return { state: p.state, owner: F.here(p.state), error: p.last_error || p.problem || '' };
  };
  F.here = (state) => (['running', 'backing_off', 'stalled', 'starting'].includes(state) ? 'this instance' : '—');
})();
