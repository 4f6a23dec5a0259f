// Ferry console, the flow picture of a pipeline's page: source → each
// transform → sink as boxes, each with its stage's event counts as the
// history gives them (ferry_stage_events_total) and its p99 over the
// last window (ferry_stage_duration_seconds), the lag segments along it
// (commit → read before the source, ack → consumed after the sink, read →
// ack and commit → ack beneath), and the first unhealthy stage marked —
// the one the last error names, or a transform that dead-letters or
// fails events.
'use strict';
(() => {
  const F = window.Ferry;
  const { num, cell } = F;

  // stageOfError reads which stage an error comes from: the engine says
  // "stage <name>: …" for an event's failure and "start sink …" /
  // "start source …" for a start that failed.
  function stageOfError(err, names) {
    if (!err) return null;
    const m = /\bstage ([\w.:-]+): /.exec(err);
    if (m && names.includes(m[1])) return m[1];
    if (/\bsink\b|\bpublish|\bbroker/i.test(err)) return 'publish';
    if (/\bsource\b|\bdatabase\b|postgres|\bslot\b|\bdsn\b/i.test(err)) return 'read';
    return null;
  }

  // firstUnhealthy is the first stage, in the order events pass them, that
  // is in trouble: named by a current error, or dead-lettering or failing
  // events. Answers {stage, why}, or null when all look well.
  F.firstUnhealthy = (p, names, counts) => {
    const where = F.placement(p);
    const bad = new Map();
    const named = F.unhealthy(where.state, where.error) ? stageOfError(where.error, names) : null;
    if (named) bad.set(named, where.error.split('\n')[0]);
    for (const n of names) {
      const e = counts[n] || {};
      if (n === 'read' || n === 'publish' || bad.has(n)) continue;
      if (e.dead_lettered > 0) bad.set(n, 'dead-lettered ' + num(e.dead_lettered) + ' events');
      else if (e.error > 0) bad.set(n, num(e.error) + ' events failed');
    }
    const stage = names.find((n) => bad.has(n));
    return stage ? { stage, why: bad.get(stage) } : null;
  };

  F.drawFlow = (root, p, hist) => {
    const counts = {}, lat = {};
    for (const s of (hist && hist.stages) || []) { counts[s.stage] = s.events; lat[s.stage] = s; }
    const names = p.stages && p.stages.length ? p.stages : ['read', 'publish'];
    const found = F.firstUnhealthy(p, names, counts);
    const first = found && found.stage;
    const boxes = names.map((n, i) => {
      const box = document.createElement('div');
      box.className = 'stage-box';
      box.dataset.stage = n;
      let kind = 'transform', title = n.replace(/^\d+:/, '');
      if (n === 'read') { kind = 'source'; title = p.source || 'source'; }
      if (n === 'publish') { kind = 'sink'; title = p.sink || 'sink'; }
      box.append(cell('span', kind), cell('strong', title));
      const e = counts[n] || {};
      const facts = [['ok', e.ok], ['dropped', e.dropped], ['dead-lettered', e.dead_lettered], ['error', e.error]]
        .filter(([k, v]) => k === 'ok' || v);
      const dl = document.createElement('dl');
      for (const [k, v] of facts) dl.append(cell('dt', k), cell('dd', num(v || 0)));
      if (n === 'read' && p.health && p.health.checked_at && !p.health.checked_at.startsWith('0001')) {
        dl.append(cell('dt', 'backlog'), cell('dd', num(p.health.backlog)));
      }
      const l = lat[n];
      if (l && l.p99_seconds != null) {
        const dd = cell('dd', F.dur(l.p99_seconds));
        dd.title = 'mean ' + F.dur(l.mean_seconds) + ', over ' + Math.round(l.window_seconds) + ' s ending ' + new Date(l.latency_at).toLocaleTimeString();
        dl.append(cell('dt', 'p99'), dd);
      }
      box.append(dl);
      if (n === first) {
        box.classList.add('bad');
        const why = cell('p', 'first unhealthy stage: ' + found.why);
        why.className = 'why';
        box.append(why);
      }
      box.setAttribute('aria-label', kind + ' ' + title + (n === first ? ', first unhealthy stage' : ''));
      return i ? [Object.assign(cell('span', '→'), { className: 'arrow' }), box] : [box];
    }).flat();
    const seg = (key, label) => {
      const l = (p.lag || {})[key];
      const el = cell('span', label + ' ' + (l && l.count ? F.dur(l.p99_seconds) : '—'));
      el.className = 'segment';
      el.dataset.segment = key;
      el.title = label + ', p99 over the last minute' + (l && l.count ? ' (p50 ' + F.dur(l.p50_seconds) + ')' : ': no event');
      return el;
    };
    const arrow = () => Object.assign(cell('span', '→'), { className: 'arrow' });
    const along = cell('p', '');
    along.className = 'segments';
    along.append(seg('read_to_ack', 'read → ack'), seg('commit_to_ack', 'commit → ack'));
    root.replaceChildren(seg('commit_to_read', 'commit → read'), arrow(), ...boxes, arrow(), seg('ack_to_consumed', 'ack → consumed'), along);
    root.dataset.unhealthy = first || '';
  };
})();
