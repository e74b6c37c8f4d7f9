// app.js: kcached's page, plain JS over the JSON API (DESIGN.md, HTTP API).
// Everything that comes from the store goes into the DOM as text
// (textContent, attributes), never as HTML: a model named
// <img src=x onerror=alert(1)> shows as those characters.
'use strict';

const REFRESH_MS = 5000;
const TOKEN_KEY = 'kcache.token';
const state = {models: [], sort: 'name', desc: false, selected: null,
               role: null, timer: null};

const $ = (id) => document.getElementById(id);

// el('td', {class: 'x', title: 't'}, 'text', child...): text children
// become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {}))
    if (v !== undefined && v !== null) e.setAttribute(k, String(v));
  for (const k of kids)
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class HttpError extends Error {
  constructor(status, body) {
    super((body && body.message) || ('HTTP ' + status));
    this.status = status;
  }
}

async function api(path, opts) {
  const headers = {Accept: 'application/json'};
  const t = token();
  if (t) headers.Authorization = 'Bearer ' + t;
  const r = await fetch(path, Object.assign({headers, cache: 'no-store',
                                             credentials: 'omit'}, opts));
  const body = r.status === 204 ? null : await r.json().catch(() => null);
  if (!r.ok) throw new HttpError(r.status, body);
  return body;
}

// ---- formatting ----

function fmtBytes(n) {
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + ' ' + u[i];
}

function fmtAgo(t, now) {
  if (!t) return 'never';
  const s = Math.max(0, now - t);
  if (s < 60) return s + ' s ago';
  if (s < 3600) return Math.floor(s / 60) + ' min ago';
  if (s < 86400) return Math.floor(s / 3600) + ' h ago';
  return Math.floor(s / 86400) + ' d ago';
}

const iso = (t) => t ? new Date(t * 1000).toISOString() : 'never';
const bucketText = (b) =>
  Object.keys(b || {}).sort().map((k) => k + '=' + b[k]).join(',');

// ---- cards ----

function card(id, label, value, title) {
  return el('div', {class: 'card', id: 'card-' + id},
            el('div', {class: 'label'}, label),
            el('div', {class: 'value', 'data-value': value.raw, title},
               value.text));
}

const num = (n) => ({raw: n, text: String(n)});

function renderCards(stats, hist) {
  const g = hist.gauges || {};
  const total = stats.hits + stats.misses;
  const ratio = total ? (100 * stats.hits / total).toFixed(1) + ' %' : '–';
  const limit = stats.max_bytes ? fmtBytes(stats.max_bytes) : 'no limit';
  const pct = stats.max_bytes ? stats.bytes_used / stats.max_bytes : 0;
  const bar = svg('svg', {viewBox: '0 0 100 6', class: 'bar',
                         preserveAspectRatio: 'none'});
  bar.append(svg('rect', {width: 100, height: 6, class: 'track'}),
             svg('rect', {width: Math.min(100, 100 * pct).toFixed(1),
                          height: 6, class: pct > 0.9 ? 'fill hot' : 'fill'}));
  const use = el('div', {class: 'card wide', id: 'card-store'},
                 el('div', {class: 'label'}, 'Store use'),
                 el('div', {class: 'value', 'data-value': stats.bytes_used},
                    fmtBytes(stats.bytes_used) + ' of ' + limit),
                 bar);
  const cards = [use,
    card('bundles', 'Bundles', num(stats.bundles)),
    card('blobs', 'Blobs', num(stats.blobs)),
    card('hits', 'Hits', num(stats.hits)),
    card('misses', 'Misses', num(stats.misses)),
    card('ratio', 'Hit ratio', {raw: total ? stats.hits / total : '',
                                text: ratio}),
    card('evicted', 'Evicted', num(stats.evicted_bundles + stats.evicted_blobs),
         stats.evicted_bundles + ' bundles, ' + stats.evicted_blobs + ' blobs'),
    card('leases', 'Leases in flight', num(stats.leases))];
  if (g.s3)
    cards.push(card('s3', 'S3 queue / errors',
                    {raw: g.s3.queue_depth, text: g.s3.queue_depth + ' / ' +
                     g.s3.errors}, g.s3.up ? 'S3 up' : 'S3 down'));
  if (g.resp) {
    const cmds = (hist.points || []).reduce((n, p) => n + p.resp_commands, 0);
    cards.push(card('resp', 'RESP keys', {raw: g.kv_keys, text: g.kv_keys +
                    ' (' + fmtBytes(g.kv_bytes) + ')'},
                    cmds + ' RESP commands in the last hour' +
                    (g.kv_max_bytes ? ', limit ' + fmtBytes(g.kv_max_bytes) :
                     '')));
  }
  $('cards').replaceChildren(...cards);
}

// ---- RESP key families (only with --resp-listen) ----

// fams: /v1/stats's resp_families, [{family, hits, misses}], "other" last.
// A family is a prefix of a client's keys: text only, like model names.
function renderFamilies(fams) {
  $('families-section').hidden = !fams;
  if (!fams) return;
  const rows = fams.map((f) => {
    const n = f.hits + f.misses;
    return el('tr', {'data-family': f.family},
      el('td', {class: 'family'}, f.family),
      el('td', {class: 'hits num', 'data-value': f.hits}, f.hits),
      el('td', {class: 'misses num', 'data-value': f.misses}, f.misses),
      el('td', {class: 'ratio num'},
         n ? (100 * f.hits / n).toFixed(1) + ' %' : '–'));
  });
  $('families').tBodies[0].replaceChildren(...rows);
}

// ---- charts: inline SVG ----

const SVGNS = 'http://www.w3.org/2000/svg';

function svg(tag, attrs) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  return e;
}

// The time axis both charts share: it ends now and spans the last hour, or
// less while kcached has been up less than that (the history starts empty).
function timeAxis(hist) {
  const pts = hist.points || [];
  const span = Math.min(3600, Math.max(60, pts.length ?
                                       hist.now - pts[0].t : 3600));
  return {now: hist.now, span};
}

// points: [[t, y]...] on the time axis ax; none: "no data yet", and no
// value on the y axis.
function chart(box, points, ax, fmtY, maxY) {
  const W = 560, H = 120, P = 28;
  const s = svg('svg', {viewBox: `0 0 ${W} ${H}`, class: 'chart',
                        role: 'img'});
  const top = maxY || Math.max(1e-9, ...points.map((p) => p[1]));
  const x = (t) => P + (W - 2 * P) * (1 - (ax.now - t) / ax.span);
  const y = (v) => H - P / 2 - (H - P) * (v / top);
  s.append(svg('line', {x1: P, y1: y(0), x2: W - P, y2: y(0),
                        class: 'axis'}));
  const text = (x0, y0, cls, str) => {
    const t = svg('text', {x: x0, y: y0, class: cls});
    t.textContent = str;
    s.append(t);
  };
  text(P, H - 2, 'tick', '-' + Math.round(ax.span / 60) + ' min');
  text(W - P, H - 2, 'tick end', 'now');
  if (!points.length) {
    text(W / 2, H / 2, 'empty', 'no data yet: the history starts with kcached');
  } else {
    text(2, 12, 'tick', fmtY(top));
    const pts = points.map((p) => x(p[0]).toFixed(1) + ',' +
                                  y(p[1]).toFixed(1)).join(' ');
    s.append(svg('polyline', {points: pts, class: 'line'}));
    for (const p of points) {
      const c = svg('circle', {cx: x(p[0]), cy: y(p[1]), r: 2,
                               class: 'dot'});
      const tt = svg('title', {});
      tt.textContent = iso(p[0]) + ': ' + fmtY(p[1]);
      c.append(tt);
      s.append(c);
    }
  }
  box.replaceChildren(s);
}

// A slot without lookups has no hit ratio; a history without any request
// has no rate to show: both are "no data yet", not a flat line at 0.
function renderCharts(hist) {
  const pts = hist.points || [];
  const ax = timeAxis(hist);
  const hits = pts.filter((p) => p.hits + p.misses > 0)
                  .map((p) => [p.t, p.hits / (p.hits + p.misses)]);
  const rate = pts.some((p) => p.requests > 0) ?
    pts.map((p) => [p.t, p.requests / hist.step_s]) : [];
  chart($('chart-hits'), hits, ax, (v) => (100 * v).toFixed(0) + ' %', 1);
  chart($('chart-rate'), rate, ax, (v) => v.toFixed(1) + '/s');
}

// ---- models table ----

function covText(c) { return c ? c.present + '/' + c.expected : '–'; }

function sortKey(m, k) {
  if (k === 'name') return (m.name || m.model).toLowerCase();
  if (k === 'coverage')
    return m.coverage && m.coverage.expected ?
      m.coverage.present / m.coverage.expected : -1;
  return m[k];
}

function visibleModels() {
  const f = $('filter').value.trim().toLowerCase();
  const list = state.models.filter((m) => !f ||
    (m.name || '').toLowerCase().includes(f) || m.model.includes(f));
  const k = state.sort, d = state.desc ? -1 : 1;
  return list.sort((a, b) => {
    const x = sortKey(a, k), y = sortKey(b, k);
    return x < y ? -d : x > y ? d : 0;
  });
}

function purgeButton(m) {
  const b = el('button', {type: 'button', class: 'purge'}, 'Purge');
  b.addEventListener('click', async (ev) => {
    ev.stopPropagation();
    // Confirmed with the hash: a name comes from a warmup manifest, which
    // is not proof of which model it is.
    const typed = prompt('Purge every bundle (' + m.bundles + ') of model\n' +
      m.model + (m.name ? '\n(its manifest names it ' + m.name + ')' : '') +
      '?\nType the first 12 hex digits of the hash to confirm:');
    if (typed === null) return;
    const t = typed.trim();
    if (t.length < 12 || !m.model.startsWith(t)) {
      $('error').textContent = 'purge: not confirmed (the hash is ' +
        m.model + '); nothing deleted';
      return;
    }
    try {
      const r = await api('/v1/models/' + m.model, {method: 'DELETE'});
      $('error').textContent = 'purged ' + r.removed + ' bundles';
    } catch (e) { $('error').textContent = 'purge: ' + e.message; }
    refresh();
  });
  return b;
}

function modelRow(m, now) {
  const cov = m.coverage;
  const full = cov && cov.expected && cov.present === cov.expected;
  const tr = el('tr', {'data-model': m.model,
                       class: m.model === state.selected ? 'selected' : ''},
    el('td', {class: 'name'}, m.name || m.model),
    el('td', {class: 'hash', title: m.model}, m.model.slice(0, 12) + '…'),
    el('td', {class: 'coverage' + (full ? ' full' : ''),
              title: cov && !cov.warmup ?
                'no warmup manifest: the cells its bundles have' : null},
       covText(cov)),
    el('td', {class: 'bytes num', 'data-value': m.bytes, title: m.bytes +
              ' bytes in ' + m.bundles + ' bundles'}, fmtBytes(m.bytes)),
    el('td', {class: 'hits num', 'data-value': m.hits}, m.hits),
    el('td', {class: 'last', title: iso(m.last_used)},
       fmtAgo(m.last_used, now)),
    el('td', {}, state.role === 'admin' ? purgeButton(m) : ''));
  tr.addEventListener('click', () => {
    state.selected = m.model;
    history.replaceState(null, '', '#' + m.model);
    renderModels(now);
    loadMatrix();
  });
  return tr;
}

function renderModels(now) {
  const rows = visibleModels().map((m) => modelRow(m, now));
  if (!rows.length)
    rows.push(el('tr', {}, el('td', {colspan: 7, class: 'muted'},
                              'no models')));
  $('models').tBodies[0].replaceChildren(...rows);
  for (const th of $('models').tHead.rows[0].cells)
    th.className = th.dataset.sort === state.sort ?
      (state.desc ? 'sorted desc' : 'sorted') : '';
}

// ---- the coverage matrix ----

function cellTitle(c, bucket, arch) {
  const lines = [bucketText(bucket) + ' on ' + arch + ': ' + c.state];
  if (c.state === 'present')
    lines.push(c.bytes + ' bytes (' + fmtBytes(c.bytes) + ')',
               c.hits + ' hits', 'last use ' + iso(c.last_used));
  if (c.holder) lines.push('lease held by ' + c.holder);
  return lines.join('\n');
}

// Where the columns come from: the archs the warms ran for (--arch), when
// they differ from the manifest's, or the bundles' without a manifest list.
function archsNote(cov) {
  if (cov.archs_from === 'warm')
    return '; archs: those its warms ran for (--arch)' +
      (cov.manifest_archs && cov.manifest_archs.length ?
        ', the manifest lists ' + cov.manifest_archs.join(', ') : '');
  if (cov.archs_from === 'bundles' && cov.warmup)
    return '; archs: those its bundles have';
  return '';
}

function renderMatrix(cov) {
  $('matrix-section').hidden = false;
  $('matrix-name').textContent = cov.name || cov.model;
  $('matrix-summary').textContent = covText(cov) + ' cells present' +
    (cov.warmup ? '' : ' (no warmup manifest: the cells its bundles have)') +
    archsNote(cov);
  $('matrix-summary').dataset.archsFrom = cov.archs_from || '';
  const head = el('tr', {}, el('th', {}, 'bucket \\ arch'),
                  ...cov.archs.map((a) => el('th', {}, a)));
  const rows = cov.buckets.map((b, i) => el('tr', {},
    el('th', {class: 'bucket'}, bucketText(b)),
    ...cov.archs.map((a, j) => {
      const c = cov.cells[i][j];
      return el('td', {class: 'cell ' + c.state, 'data-state': c.state,
                       'data-bucket': bucketText(b), 'data-arch': a,
                       'data-bytes': c.bytes, title: cellTitle(c, b, a)},
                c.state === 'present' ? fmtBytes(c.bytes) : c.state);
    })));
  $('matrix').replaceChildren(el('thead', {}, head), el('tbody', {}, ...rows));
  const extra = (cov.extra || []).map((x) =>
    el('li', {}, bucketText(x.bucket) + ' on ' + x.arch + ': ' +
       fmtBytes(x.bytes) + ', ' + x.hits + ' hits'));
  $('extra').replaceChildren(...(extra.length ?
    [el('h3', {}, 'Present but no longer expected'), el('ul', {}, ...extra)] :
    []));
}

async function loadMatrix() {
  if (!state.selected) return;
  try {
    renderMatrix(await api('/v1/models/' + state.selected + '/coverage'));
  } catch (e) { $('error').textContent = 'coverage: ' + e.message; }
}

// ---- token and refresh ----

function showLogin(msg) {
  $('main').hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = msg || '';
  $('status').textContent = 'token needed';
}

async function loadModels() {
  const all = [];
  let cursor = null, res;
  do { // every page of the listing (cursor: the last model of the one before)
    res = await api('/v1/models?limit=1000' +
                    (cursor ? '&cursor=' + cursor : ''));
    all.push(...res.models);
    cursor = res.next;
  } while (cursor && all.length < 10000);
  return res && Object.assign(res, {models: all});
}

async function refresh() {
  try {
    const [stats, hist, models] = await Promise.all([
      api('/v1/stats'), api('/v1/stats/history'), loadModels()]);
    state.models = models.models;
    state.role = models.role;
    if (!state.models.some((m) => m.model === state.selected))
      state.selected = state.models.length ? visibleModels()[0].model : null;
    if (!state.selected) $('matrix-section').hidden = true;
    $('login').hidden = true;
    $('main').hidden = false;
    $('who').textContent = models.auth ? 'role ' + models.role +
      (models.token ? ' (token ' + models.token + ')' : '') :
      'no token file: everyone is admin';
    $('forget').hidden = !token();
    $('status').textContent = 'up ' + stats.uptime_s + ' s, updated ' +
      new Date().toLocaleTimeString();
    renderCards(stats, hist);
    renderFamilies(stats.resp_families);
    renderCharts(hist);
    renderModels(hist.now);
    await loadMatrix();
  } catch (e) {
    if (e.status === 401)
      showLogin(token() ? 'that token was refused' : '');
    else
      $('status').textContent = 'error: ' + e.message;
  }
}

// #<64 hex> in the address picks the model whose matrix is shown (a link
// to one model's coverage; nothing secret goes in the address).
function fromHash() {
  const m = /^#([0-9a-f]{64})$/.exec(location.hash);
  if (m) state.selected = m[1];
}

function start() {
  fromHash();
  window.addEventListener('hashchange', () => { fromHash(); refresh(); });
  $('token-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token-input').value.trim());
    $('token-input').value = '';
    refresh();
  });
  $('forget').addEventListener('click', () => {
    sessionStorage.removeItem(TOKEN_KEY);
    location.reload();
  });
  $('filter').addEventListener('input', () => renderModels(Date.now() / 1000 | 0));
  for (const th of $('models').tHead.rows[0].cells)
    if (th.dataset.sort)
      th.addEventListener('click', () => {
        state.desc = state.sort === th.dataset.sort ? !state.desc : false;
        state.sort = th.dataset.sort;
        renderModels(Date.now() / 1000 | 0);
      });
  refresh();
  state.timer = setInterval(refresh, REFRESH_MS);
}

start();
