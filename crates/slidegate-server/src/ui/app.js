// slidegate dashboard. Reads /v1/stats and /v1/rules every 2 s and /v1/keys/{rule}/{key} on
// demand; draws with SVG; builds every element with textContent (keys are whatever callers
// sent, never markup). No library, nothing fetched from anywhere but this service.
'use strict';

// Errors the page meets, for people and for the browser tests to read.
window.slidegateErrors = [];
window.addEventListener('error', (e) => {
  const t = e.target;
  window.slidegateErrors.push(String(e.message || (t && (t.src || t.href)) || 'error'));
}, true);
window.addEventListener('unhandledrejection', (e) => {
  window.slidegateErrors.push('unhandled rejection: ' + String((e.reason && e.reason.message) || e.reason));
});

const POLL_MS = 2000;
const TOKEN_KEY = 'slidegate.admin_token';
const SVG_NS = 'http://www.w3.org/2000/svg';
const $ = (id) => document.getElementById(id);

let adminEnabled = null;
let statsNeedToken = false;
let rulesText = '';

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'class') e.className = v; else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : String(c));
  return e;
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function fmtDur(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return Math.round(ms) + ' ms';
  const s = ms / 1000;
  if (s < 60) return (s < 10 ? s.toFixed(1) : Math.round(s)) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min ' + Math.round(s % 60) + ' s';
  if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.round((s % 3600) / 60) + ' min';
  return Math.floor(s / 86400) + ' d ' + Math.round((s % 86400) / 3600) + ' h';
}

function fmtUs(us) {
  if (us === null || us === undefined) return '—';
  return us < 1000 ? us + ' µs' : (us / 1000).toFixed(us < 10000 ? 1 : 0) + ' ms';
}

const sum = (xs) => xs.reduce((a, b) => a + b, 0);
const token = () => sessionStorage.getItem(TOKEN_KEY);

async function api(path, method) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  const r = await fetch(path, { method: method || 'GET', headers, cache: 'no-store' });
  let body = null;
  try { body = await r.json(); } catch (_) { body = null; }
  return { status: r.status, body };
}

function errorText(res) {
  const e = res.body && res.body.error;
  return e ? e.code + ': ' + e.message : 'HTTP ' + res.status;
}

function setStatus(text, bad) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('error', !!bad);
}

// ---- the admin token -------------------------------------------------------------------------

function askToken(why) {
  $('token-why').textContent = why;
  $('token-form').hidden = false;
  $('token-open').setAttribute('aria-expanded', 'true');
  $('token-input').focus();
}

function forgetToken() {
  sessionStorage.removeItem(TOKEN_KEY);
}

function setupToken() {
  $('token-open').addEventListener('click', () => {
    const form = $('token-form');
    if (form.hidden) askToken(token() ? 'A token is set for this tab.' : 'No token is set for this tab.');
    else { form.hidden = true; $('token-open').setAttribute('aria-expanded', 'false'); }
  });
  $('token-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const value = $('token-input').value;
    if (!value) return;
    sessionStorage.setItem(TOKEN_KEY, value);
    $('token-input').value = '';
    $('token-form').hidden = true;
    $('token-open').setAttribute('aria-expanded', 'false');
    statsNeedToken = false;
    setStatus('Token set for this tab.');
  });
  $('token-forget').addEventListener('click', () => {
    forgetToken();
    $('token-why').textContent = 'Token forgotten.';
  });
}

// ---- traffic ---------------------------------------------------------------------------------

function chart(series, label) {
  const n = series.allowed.length;
  const w = 4;
  const totals = series.allowed.map((a, i) => a + series.denied[i] + series.degraded[i]);
  const max = Math.max(1, ...totals);
  const s = svgEl('svg', { class: 'chart', viewBox: `0 0 ${n * w} 100`, preserveAspectRatio: 'none', role: 'img' });
  s.append(svgEl('title', {}, label));
  for (let i = 0; i < n; i++) {
    let y = 100;
    for (const kind of ['allowed', 'denied', 'degraded']) {
      const v = series[kind][i];
      if (!v) continue;
      const h = Math.max(1, (v / max) * 98);
      y -= h;
      s.append(svgEl('rect', { class: 'bar ' + kind, x: i * w + 0.5, y, width: w - 1, height: h }));
    }
  }
  return { svg: s, max };
}

function sums(series) {
  const p = el('p', { class: 'sums' });
  const lat = series.latency_us;
  const parts = [['allowed', sum(series.allowed)], ['denied', sum(series.denied)], ['degraded', sum(series.degraded)]];
  parts.forEach(([name, v], i) => {
    if (i) p.append(' · ');
    p.append(name + ' ', el('b', {}, v));
  });
  p.append(' · latency p50 ', el('b', {}, fmtUs(lat && lat.p50)), ' p99 ', el('b', {}, fmtUs(lat && lat.p99)));
  return p;
}

function topKeys(top, what) {
  const box = el('div', { class: 'top' });
  if (!top.keys.length) {
    box.append(el('p', { class: 'sums' }, 'No denials in the last 15 minutes.'));
    return box;
  }
  const note = top.max_error ? ` (counts at most ${top.max_error} over)` : '';
  box.append(el('p', { class: 'sums' }, `Top denied ${what} of ${top.denials} denials${note}:`));
  const ol = el('ol', { class: 'top-keys' });
  for (const k of top.keys) {
    const pct = Math.round(k.share * 1000) / 10;
    // A style set through the CSSOM: the page's policy forbids inline style attributes.
    const bar = el('span', { class: 'share', 'aria-hidden': 'true' });
    bar.style.width = Math.max(2, k.share * 80) + 'px';
    ol.append(el('li', { 'data-key': k.key },
      el('span', { class: 'key' }, k.key), ' ', el('span', { class: 'count' }, `${k.count} · ${pct}%`), bar));
  }
  box.append(ol);
  return box;
}

function card(name, attr, t, what) {
  const c = el('article', { class: 'card', [attr]: name,
    'data-allowed': sum(t.allowed), 'data-denied': sum(t.denied), 'data-degraded': sum(t.degraded) });
  c.append(el('h3', {}, name));
  const label = `${name}: ${sum(t.allowed)} allowed, ${sum(t.denied)} denied, ${sum(t.degraded)} degraded in the last 15 minutes`;
  const { svg, max } = chart(t, label);
  c.append(svg, el('p', { class: 'sums' }, `−15 min … now; tallest bar ${max} per 10 s`), sums(t));
  if (t.top_denied) c.append(topKeys(t.top_denied, what));
  return c;
}

function renderStats(s) {
  adminEnabled = s.admin_enabled;
  const totals = el('article', { class: 'card', 'data-total': '' }, el('h3', {}, 'All rules and domains'));
  const { svg, max } = chart(s.totals, 'All decisions in the last 15 minutes');
  totals.append(svg, el('p', { class: 'sums' }, `−15 min … now; tallest bar ${max} per 10 s`), sums(s.totals));
  $('totals').replaceChildren(totals);
  $('traffic').replaceChildren(...s.rules.map((r) => card(r.rule, 'data-rule', r, 'keys')));
  $('envoy-traffic').replaceChildren(...s.envoy.map((d) => card(d.domain, 'data-domain', d, 'descriptors')));
  $('envoy-traffic-h').hidden = s.envoy.length === 0;
  if (s.truncated) $('traffic').append(el('p', { class: 'hint' }, 'More rules than are listed; the totals count them all.'));
  renderBackend(s.backend);
  renderResetAvailability();
}

function fact(dl, name, value, cls) {
  dl.append(el('dt', {}, name), el('dd', cls ? { class: cls } : {}, value));
}

function renderBackend(b) {
  const dl = $('backend');
  dl.replaceChildren();
  fact(dl, 'Kind', b.kind);
  fact(dl, 'Engine', b.engine);
  fact(dl, 'Reachable', b.reachable ? 'yes' : 'no' + (b.error ? ': ' + b.error : ''), b.reachable ? 'ok' : 'bad');
  fact(dl, 'Circuit breaker', b.circuit_open ? 'open (backend not called)' : 'closed', b.circuit_open ? 'bad' : 'ok');
  if (b.near_cache) {
    const c = b.near_cache;
    fact(dl, 'Near-cache', `${c.keys} of ${c.capacity} keys; hit rate ${(c.hit_rate * 100).toFixed(1)}% (${c.hits} of ${c.lookups})`);
  } else {
    fact(dl, 'Near-cache', 'off');
  }
  fact(dl, 'Degraded, 15 min', b.degraded, b.degraded ? 'warn' : '');
}

// ---- rules -----------------------------------------------------------------------------------

function quotaCells(q) {
  let algorithm = q.algorithm;
  if (q.buckets !== undefined) algorithm += ` (${q.buckets} buckets)`;
  if (q.burst !== undefined) algorithm += ` (burst ${q.burst})`;
  const warm = q.warm_up ? `${q.warm_up} from ${Math.round(q.cold_fraction * 100)}%` : '—';
  return [q.limit, q.window, algorithm, warm, q.failure_policy || 'backend default'];
}

function renderRules(r) {
  const body = $('rules').tBodies[0];
  body.replaceChildren();
  for (const rule of r.rules) {
    const rows = [['', rule], ...Object.entries(rule.tiers || {})];
    for (const [tier, q] of rows) {
      const tr = el('tr', { 'data-rule': rule.name, 'data-tier': tier });
      tr.append(el(tier ? 'td' : 'th', tier ? {} : { scope: 'row' }, tier ? '' : rule.name), el('td', {}, tier || '—'));
      for (const cell of quotaCells(q)) tr.append(el('td', {}, cell));
      body.append(tr);
    }
  }
  if (!r.rules.length) body.append(el('tr', {}, el('td', { colspan: 7 }, 'No rules: only inline checks.')));
  const inline = $('inline');
  inline.replaceChildren();
  const i = r.inline;
  fact(inline, 'Served', i.enabled ? 'yes' : 'no ([inline] enabled = false)');
  if (i.enabled) {
    fact(inline, 'Largest limit', i.max_limit);
    fact(inline, 'Longest window', i.max_window);
    fact(inline, 'Largest cost', i.max_cost);
    fact(inline, 'Algorithms', i.algorithms ? i.algorithms.join(', ') : 'all');
  }
  const envoy = r.envoy || { limits: [] };
  $('envoy-rules').hidden = envoy.limits.length === 0;
  const eb = $('envoy-rules').querySelector('tbody');
  eb.replaceChildren(...envoy.limits.map((l) => {
    const limit = l.unlimited ? 'unlimited' : `${l.requests_per_unit} per ${l.unit}`;
    const notes = [l.shadow_mode ? 'shadow mode' : '', l.name ? 'name ' + l.name : '',
      l.replaces.length ? 'replaces ' + l.replaces.join(', ') : ''].filter(Boolean).join('; ') || '—';
    return el('tr', { 'data-domain': l.domain }, el('td', {}, l.domain), el('td', {}, l.descriptor),
      el('td', {}, limit), el('td', {}, l.algorithm || '—'), el('td', {}, notes));
  }));
  renderRuleChoices(r.rules);
}

function renderRuleChoices(rules) {
  const select = $('inspect-rule');
  const chosen = select.value;
  select.replaceChildren(...rules.map((r) => el('option', { value: r.name }, r.name)));
  if (rules.some((r) => r.name === chosen)) select.value = chosen;
  renderTierChoices(rules);
  select.onchange = () => renderTierChoices(rules);
}

function renderTierChoices(rules) {
  const rule = rules.find((r) => r.name === $('inspect-rule').value);
  const select = $('inspect-tier');
  const chosen = select.value;
  const tiers = rule ? Object.keys(rule.tiers || {}) : [];
  select.replaceChildren(el('option', { value: '' }, '(none)'), ...tiers.map((t) => el('option', { value: t }, t)));
  if (tiers.includes(chosen)) select.value = chosen;
}

// ---- the key inspector -----------------------------------------------------------------------

function keyPath() {
  const rule = $('inspect-rule').value;
  const key = $('inspect-key').value;
  return `/v1/keys/${encodeURIComponent(rule)}/${encodeURIComponent(key)}`;
}

function adminDisabledText(what) {
  return `${what} needs the admin routes, which are disabled: set admin_token in the rules file.`;
}

function renderResetAvailability() {
  const button = $('reset');
  if (adminEnabled === false) {
    button.disabled = true;
    $('reset-msg').textContent = adminDisabledText('Reset');
  } else {
    button.disabled = !$('inspect-key').value;
    if ($('reset-msg').textContent === adminDisabledText('Reset')) $('reset-msg').textContent = '';
  }
}

async function inspect() {
  const msg = $('inspect-msg');
  if (adminEnabled === false) { msg.textContent = adminDisabledText('Inspecting a key'); return; }
  if (!token()) {
    msg.textContent = 'Inspecting a key needs the admin token.';
    askToken('Inspecting a key needs the admin token.');
    return;
  }
  const tier = $('inspect-tier').value;
  const res = await api(keyPath() + (tier ? '?tier=' + encodeURIComponent(tier) : ''));
  if (res.status === 401) {
    forgetToken();
    msg.textContent = 'The admin token was refused.';
    askToken('The admin token was refused: enter it again.');
    return;
  }
  if (res.status !== 200) { msg.textContent = 'Not inspected: ' + errorText(res); return; }
  const inspected = res.body;
  $('reset-msg').textContent = '';
  msg.textContent = `Key ${inspected.key} as of ${new Date(inspected.now_ms).toLocaleTimeString()}.`;
  drawKey(inspected);
}

function drawKey(k) {
  const w = k.window_ms;
  const now = k.now_ms;
  const log = k.algorithm === 'sliding_log';
  const [x0, x1] = [20, 580];
  const x = (t) => x0 + ((t - (now - w)) / (2 * w)) * (x1 - x0);
  const s = $('timeline');
  const title = $('timeline-title');
  s.replaceChildren(title);
  s.append(svgEl('rect', { class: 'frame', x: x0, y: 18, width: x1 - x0, height: 80 }));
  s.append(svgEl('line', { class: 'edge', x1: x0, x2: x0, y1: 14, y2: 102 }));
  s.append(svgEl('text', { x: x0, y: 116 }, `window edge (−${fmtDur(w)})`));
  s.append(svgEl('line', { class: 'now', x1: x(now), x2: x(now), y1: 14, y2: 102 }));
  s.append(svgEl('text', { x: x(now) - 10, y: 116 }, 'now'));
  // A label beside its line, on the side with room.
  const label = (at, y, text) => s.append(svgEl('text',
    at > x1 - 90 ? { x: at - 3, y, 'text-anchor': 'end' } : { x: at + 3, y }, text));
  const lines = [];
  let next = null;
  if (log) {
    for (const t of k.admissions_ms) {
      s.append(svgEl('line', { class: 'tick', x1: x(t), x2: x(t), y1: 30, y2: 98, 'data-ms': t }));
    }
    const drawn = k.admissions_ms.length < k.count ? ` (the newest ${k.admissions_ms.length} drawn)` : '';
    lines.push(`${k.count} admission${k.count === 1 ? '' : 's'} in the last ${fmtDur(w)}${drawn}`);
    if (k.remaining === 0 && k.oldest_ms !== null) next = k.oldest_ms + w - now;
  } else {
    const level = Math.min(1, k.count / Math.max(1, k.limit));
    s.append(svgEl('rect', { class: 'level', x: x0, y: 4, width: level * (x1 - x0), height: 10 }));
    lines.push(`${k.count} of ${k.limit} used (${k.algorithm})`);
    if (k.algorithm === 'fixed_window' && k.reset_after_ms > 0) {
      const start = now + k.reset_after_ms - w;
      s.append(svgEl('line', { class: 'edge', x1: x(start), x2: x(start), y1: 18, y2: 98 }));
      label(x(start), 30, 'window start');
    }
    if (k.remaining === 0) next = k.reset_after_ms;
  }
  if (next !== null) {
    s.append(svgEl('line', { class: 'next', x1: x(now + next), x2: x(now + next), y1: 18, y2: 98 }));
    label(x(now + next), 44, 'next permit');
    lines.push(`the next permit frees in ${fmtDur(next)}`);
  }
  if (k.reset_after_ms > 0) {
    const at = x(now + k.reset_after_ms);
    s.append(svgEl('line', { class: 'reset', x1: at, x2: at, y1: 18, y2: 98 }));
    label(at, 60, k.algorithm === 'gcra' ? 'TAT' : 'empty');
    lines.push(`${k.algorithm === 'gcra' ? 'its theoretical arrival time is' : 'it is empty'} in ${fmtDur(k.reset_after_ms)}`);
  }
  const text = lines.join('; ') + '.';
  title.textContent = text;
  $('timeline-caption').textContent = text;
  $('timeline-figure').hidden = false;
  const dl = $('key-facts');
  dl.replaceChildren();
  fact(dl, 'Used', `${k.count} of ${k.limit}`);
  fact(dl, 'Remaining', k.remaining, k.remaining ? 'ok' : 'bad');
  fact(dl, 'Reset in', fmtDur(k.reset_after_ms));
  fact(dl, 'Retry in', k.remaining ? 'now' : next === null ? '—' : fmtDur(next));
}

async function reset() {
  const msg = $('reset-msg');
  if (adminEnabled === false) { msg.textContent = adminDisabledText('Reset'); return; }
  if (!token()) {
    msg.textContent = 'Not reset: resetting a key needs the admin token.';
    askToken('Resetting a key needs the admin token.');
    return;
  }
  const res = await api(keyPath(), 'DELETE');
  if (res.status === 401) {
    forgetToken();
    msg.textContent = 'Refused: the admin token was not accepted.';
    askToken('The admin token was refused: enter it again.');
    return;
  }
  if (res.status !== 200) { msg.textContent = 'Not reset: ' + errorText(res); return; }
  await inspect();
  msg.textContent = `Reset: ${res.body.key} holds nothing now.`;
}

// ---- polling ---------------------------------------------------------------------------------

async function refresh() {
  try {
    const rules = await api('/v1/rules');
    if (rules.status === 200) {
      const text = JSON.stringify(rules.body);
      if (text !== rulesText) { rulesText = text; renderRules(rules.body); }
    }
    if (!statsNeedToken || token()) {
      const stats = await api('/v1/stats');
      if (stats.status === 200) {
        statsNeedToken = false;
        renderStats(stats.body);
        setStatus('Updated ' + new Date().toLocaleTimeString());
      } else if (stats.status === 401) {
        statsNeedToken = true;
        forgetToken();
        setStatus('The stats need the admin token ([ui] require_token).', true);
        askToken('Reading the stats needs the admin token.');
      } else {
        setStatus('Stats unavailable: ' + errorText(stats), true);
      }
    }
  } catch (e) {
    setStatus('Cannot reach the service (' + e.message + '); retrying.', true);
  }
  setTimeout(refresh, POLL_MS);
}

function start() {
  setupToken();
  $('inspect-form').addEventListener('submit', (e) => { e.preventDefault(); inspect(); });
  $('inspect-key').addEventListener('input', renderResetAvailability);
  $('reset').addEventListener('click', reset);
  refresh();
}

start();
