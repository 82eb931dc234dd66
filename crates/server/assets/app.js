// strata dashboard: plain DOM, no framework, no build step. Every figure
// comes from the JSON API (/api/v1, docs/API.md), which answers what the
// CLI's --json prints. Text goes in with textContent only (never HTML).
'use strict';

const POLL_MS = 1000;      // live I/O
const SLOW_EVERY = 3;      // space, disks, tree, jobs: every third poll

const $ = (sel, root = document) => root.querySelector(sel);

function h(tag, attrs, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k.startsWith('data-')) el.setAttribute(k, v);
    else if (k in el) el[k] = v;
    else el.setAttribute(k, v);
  }
  for (const kid of kids.flat()) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  }
  return el;
}

// ---- units -------------------------------------------------------------

function bytes(n) {
  if (n === undefined || n === null) return '-';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let i = 0, v = Number(n);
  while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v.toFixed(0) : v.toFixed(v < 10 ? 2 : 1)) + ' ' + u[i];
}
function rate(n) { return n >= 100 ? n.toFixed(0) : n >= 10 ? n.toFixed(1) : n.toFixed(2); }
function age(unix) {
  if (!unix) return '-';
  const s = Math.max(0, Date.now() / 1000 - unix);
  if (s < 90) return Math.round(s) + ' s ago';
  if (s < 5400) return Math.round(s / 60) + ' min ago';
  if (s < 129600) return Math.round(s / 3600) + ' h ago';
  return Math.round(s / 86400) + ' days ago';
}
function usLabel(us) {
  if (us === null || us === undefined) return '-';
  return us >= 1000000 ? (us / 1e6) + ' s' : us >= 1000 ? (us / 1000) + ' ms' : us + ' µs';
}

// ---- the API -------------------------------------------------------------

const TOKEN_KEY = 'strata-token';
let token = sessionStorage.getItem(TOKEN_KEY);

class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || ('HTTP ' + status));
    this.status = status;
    this.kind = e.kind || 'error';
  }
}

async function get(path) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = 'Bearer ' + token;
  const r = await fetch('/api/v1' + path, { headers, cache: 'no-store' });
  const body = await r.json().catch(() => null);
  if (!r.ok) throw new ApiError(r.status, body);
  return body;
}

async function act(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (token) headers.Authorization = 'Bearer ' + token;
  const init = { method, headers, cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch('/api/v1' + path, init);
  const out = await r.json().catch(() => null);
  if (!r.ok) throw new ApiError(r.status, out);
  return out;
}

const enc = encodeURIComponent;

// ---- messages, confirmation, token -------------------------------------

function say(text, kind) {
  const m = $('#msg');
  m.textContent = text;
  m.className = 'msg ' + (kind || '');
}

function confirmDialog(text) {
  const d = $('#confirm');
  $('#confirm-text').textContent = text;
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.returnValue = '';
    d.showModal();
  });
}

function askToken() {
  const d = $('#token-dialog');
  $('#token-input').value = '';
  d.addEventListener('close', () => {
    const t = $('#token-input').value.trim();
    if (d.returnValue === 'ok' && t) {
      token = t;
      sessionStorage.setItem(TOKEN_KEY, t);
      // A page that could not read the server starts over with it.
      if (!info.api) { location.reload(); return; }
      // ?login: the server's event log records the unlock (and a wrong token).
      get('?login=1').then((i) => { info = i; showLock(); })
        .catch((e) => say('cannot read the server: ' + e.message, 'error'));
    }
  }, { once: true });
  d.returnValue = '';
  d.showModal();
}

function showLock() {
  const l = $('#lock');
  l.replaceChildren();
  // No action can succeed here: no action form is shown.
  document.body.classList.toggle('read-only', !info.actions || info.granted === 'read');
  const forget = () => {
    token = null;
    sessionStorage.removeItem(TOKEN_KEY);
    info.granted = 'none';
    showLock();
  };
  if (!info.actions) {
    l.append(h('span', { class: 'muted', text: 'read-only server (no --http-token)' }));
  } else if (info.granted === 'actions') {
    l.append(h('span', { text: 'actions unlocked ' }), h('button', { text: 'lock', onclick: forget }));
  } else {
    l.append(h('span', { class: 'muted', text: 'actions locked ' }),
      h('button', { id: 'unlock', text: 'unlock', onclick: askToken }));
  }
}

// Run an action, report it, refresh what it changed.
async function perform(what, method, path, body, confirmText) {
  if (confirmText && !(await confirmDialog(confirmText))) {
    say(what + ': not done (cancelled)', '');
    return null;
  }
  try {
    const r = await act(method, path, body);
    const job = r && r.id !== undefined && r.what && r.state;
    say(what + (job ? ': job ' + r.id + ' started (its progress is under Jobs)' : ': done'), 'ok');
    await refresh(true);
    return r;
  } catch (e) {
    const hint = e.status === 401 ? ' — unlock the actions with the token' : '';
    say(what + ': refused: ' + e.message + hint, 'error');
    return null;
  }
}

// ---- state and routing ---------------------------------------------------

let info = { actions: false, shared: false };
let route = { view: 'overview' };
let lastStats = null;  // { t, data }
let histWindow = 'since';  // the histograms: 'since' start or reset, or '300' s
let windowStats = null;
let tick = 0;

function parseRoute() {
  const hash = location.hash || '#/';
  const m = hash.match(/^#\/disk\/(.+)$/);
  route = m ? { view: 'disk', disk: decodeURIComponent(m[1]) } : { view: 'overview' };
  $('#overview-view').hidden = route.view !== 'overview';
  $('#disk-view').hidden = route.view !== 'disk';
  const refusal = $('#delete-refusal');
  if (refusal && refusal.dataset.disk !== route.disk) refusal.hidden = true;
}

// A token handed over in the URL fragment (#token=...) goes into this
// tab's session storage and out of the address bar.
function takeTokenFromHash() {
  const m = (location.hash || '').match(/^#token=([^&]+)/);
  if (!m) return;
  token = decodeURIComponent(m[1]);
  sessionStorage.setItem(TOKEN_KEY, token);
  history.replaceState(null, '', location.pathname + '#/');
}

// ---- overview ------------------------------------------------------------

function meter(parts, marks) {
  const m = h('div', { class: 'meter' });
  let left = 0;
  for (const [cls, pct] of parts) {
    const w = Math.max(0, Math.min(100 - left, pct));
    const s = h('span', { class: cls });
    s.style.left = left + '%';
    s.style.width = w + '%';
    m.append(s);
    left += w;
  }
  for (const pct of marks || []) {
    const s = h('span', { class: 'mark' });
    s.style.left = Math.min(100, pct) + '%';
    m.append(s);
  }
  return m;
}

function gauge(id, label, value, sub, meterEl) {
  return h('div', { class: 'gauge', id },
    h('div', { class: 'label', text: label }),
    h('div', { class: 'value', text: value }),
    sub ? h('div', { class: 'muted', text: sub }) : null,
    meterEl || null);
}

// This host's segment cache of an object store (FORMAT.md §11.8).
function cacheGauge(c) {
  if (!c) return '';
  const reads = c.hits + c.misses;
  return gauge('g-cache', 'segment cache', bytes(c.bytes) + ' of ' + bytes(c.bound_bytes),
    c.segments + ' segments; ' + (reads ? (100 * c.hits / reads).toFixed(1) + ' % of ' + reads + ' reads hit' : 'no reads yet') +
    '; ' + c.evictions + ' evicted' + (c.hot_fetched ? ', ' + c.hot_fetched + ' fetched ahead' : '') +
    (c.damaged ? ', ' + c.damaged + ' damaged' : ''),
    meter([['used', Math.min(100, 100 * c.bytes / (c.bound_bytes || 1))]], []));
}

function renderGauges(s, alarms) {
  const g = $('#gauges');
  g.replaceChildren();
  $('#location').textContent = s.location || s.url || '';
  const cache = cacheGauge(s.object_store && s.object_store.cache);
  if (s.capacity_bytes === undefined) {
    // An object-store datastore: no capacity of its own.
    g.append(
      gauge('g-disks', 'disks', String((s.disks || []).length), s.url),
      gauge('g-objects', 'disk objects', String(s.disk_objects), bytes(s.disk_bytes) + ' in the store'),
      gauge('g-host', 'this host', (s.me && s.me.name) || '-', s.endpoint), cache);
    return;
  }
  // An object store has no size of its own: the capacity is the user's,
  // and none may be set (then nothing is a share of it).
  const pct = (n) => s.capacity_bytes ? 100 * n / s.capacity_bytes : 0;
  const rule = (kind) => (alarms || []).find((a) => a.kind === kind) || {};
  const usage = rule('usage'), over = rule('overcommit');
  g.append(
    s.object_store && !s.capacity_bytes
      ? gauge('g-capacity', 'capacity', 'none set', "'strata grow --capacity SIZE' sets one for alarms")
      : gauge('g-capacity', 'capacity', bytes(s.capacity_bytes),
        (s.capacity_follows_fs ? 'follows the file system; ' : '') + bytes(s.free_bytes) + ' free'),
    gauge('g-used', 'used + reserved', s.used_percent + ' %',
      bytes(s.used_bytes) + ' used, ' + bytes(s.reserved_bytes) + ' reserved',
      meter([['used', pct(s.used_bytes)], ['reserved', pct(s.reserved_bytes)]],
        [usage.warning_percent, usage.alarm_percent].filter(Boolean))),
    gauge('g-provisioned', 'provisioned (over-commit)', s.overcommit_percent + ' %',
      bytes(s.provisioned_bytes) + ' of virtual disks',
      meter([['used', Math.min(100, s.overcommit_percent / 4)]],
        [over.warning_percent / 4, over.alarm_percent / 4].filter(Boolean))),
    s.object_store
      ? gauge('g-host', 'in the store', bytes(s.object_store.disk_bytes),
        s.object_store.disk_objects + ' objects at ' + s.object_store.endpoint)
      : gauge('g-host', 'held on the host', bytes(s.pool_file_bytes),
        'pool ' + bytes(s.pool_bytes) + ', ' + bytes(s.free_in_pool_bytes) + ' free inside, ' +
        (s.free_extents ?? '-') + ' free extents'),
    gauge('g-counts', 'disks / snapshots', s.disks + ' / ' + s.snapshots,
      (s.reclaiming ? s.reclaiming + ' being reclaimed; ' : '') + 'cache ' + (s.cache_mode || '-')),
    s.fail_stop ? gauge('g-failstop', 'FAIL-STOP', 'writes stopped', JSON.stringify(s.fail_stop)) : '',
    cache);
}

// A time in seconds since 1970 as the browser shows times.
function when(unix) {
  return unix ? new Date(unix * 1000).toLocaleString() : '-';
}

// The space line (logical bytes against used, what sharing gives), the
// newest estimate's figures and the newest pass's result, both read off
// the jobs (GET /jobs keeps a finished job's answer as `result`).
function renderSpace(s, jobs) {
  const el = $('#space');
  el.replaceChildren();
  const refused = (s.cannot || []).find((c) => c.command === 'dedup');
  $('.space-actions').hidden = !!refused;
  if (s.logical_bytes !== undefined && s.logical_bytes !== null && s.used_bytes !== undefined) {
    const ratio = s.used_bytes ? (s.logical_bytes / s.used_bytes).toFixed(2) + 'x' : '-';
    el.append(h('p', { id: 'space-line', text: bytes(s.used_bytes) + ' used for ' + bytes(s.logical_bytes) +
      ' of disks and snapshots (' + ratio + ' from sharing and compression)' }));
  }
  if (refused) el.append(h('p', { class: 'muted', text: 'dedup: ' + refused.reason }));
  const newest = (kind) => (jobs || []).find((j) => j.result && j.result[kind]);
  const est = newest('dedup_estimate');
  const pass = newest('dedup');
  if (est) {
    const r = est.result.dedup_estimate;
    const pct = (n) => r.stored_bytes ? ' (' + (100 * n / r.stored_bytes).toFixed(1) + ' % of stored)' : '';
    const rows = [
      ['logical', bytes(r.logical_bytes), r.versions + ' versions of ' + r.disks.length + ' disks'],
      ['stored', bytes(r.stored_bytes), 'distinct grains'],
      ['shared already', bytes(r.shared_bytes), 'by snapshots, clones and earlier passes'],
      ['equal at the same offset', bytes(r.same_offset_bytes) + pct(r.same_offset_bytes), "exact: what 'share equal grains' frees" +
        (r.same_offset_packed_bytes ? '; and ' + bytes(r.same_offset_packed_bytes) + ' of packed grains it points at equal ones (freed when repacked)' : '')],
      ['equal at any offset', bytes(r.any_offset_bytes) + pct(r.any_offset_bytes), 'about: a sample of ' + r.sample_grains + ' grains, 1 in ' + r.sample_every],
      ['zeros', bytes(r.zero_bytes), "of thin disks: 'strata punchzero' unmaps them"],
    ];
    if (r.packed_bytes) {
      rows.push(['packed', bytes(r.packed_bytes), 'of stored, in ' + bytes(r.packed_stored_bytes) + ' of streams (' +
        (r.packed_bytes / Math.max(1, r.packed_stored_bytes)).toFixed(2) + 'x)']);
    }
    if (r.compress_sampled_grains) {
      const ratio = after => (r.compress_sampled_grains * 4096 / Math.max(1, after)).toFixed(2);
      rows.push(['packing sample', ratio(r.lz4_sampled_bytes_after) + 'x smaller with LZ4, ' + ratio(r.compress_sampled_bytes_after) +
        'x with zstd', Math.round(100 * r.packable_grains / r.compress_sampled_grains) +
        ' % of ' + r.compress_sampled_grains + ' raw grains packed by zstd (a run of four in ' + Math.max(64, r.compress_sample_every || 0) + ')']);
    }
    if (r.encrypted_bytes) rows.push(['under a key', bytes(r.encrypted_bytes), 'compressibility needs the key']);
    el.append(h('table', { id: 'estimate', class: 'grid' },
      h('caption', { text: 'estimate of job ' + est.id + ', ' + when(est.finished_unix) +
        (pass && pass.id > est.id ? ' (before the pass of job ' + pass.id + ': estimate again for what is left)' : '') }),
      h('tbody', {}, rows.map(([k, v, what]) => h('tr', {},
        h('td', { text: k }), h('td', { class: 'num', text: v }), h('td', { class: 'muted', text: what }))))));
  } else if (!refused) {
    el.append(h('p', { class: 'muted', text: 'no estimate yet: what sharing equal grains and compression would free' }));
  }
  if (pass) {
    const r = pass.result.dedup;
    el.append(h('p', { id: 'dedup-last', text: 'last pass (job ' + pass.id + ', ' + when(pass.finished_unix) + '): freed ' +
      bytes(r.freed_bytes) + ', used ' + bytes(r.used_bytes_before) + ' -> ' + bytes(r.used_bytes_after) +
      (r.packed_merged_bytes ? '; ' + bytes(r.packed_merged_bytes) + ' of packed grains now shared (freed when repacked)' : '') +
      (r.regions_skipped ? '; ' + r.regions_skipped + ' regions changed while compared (run it again)' : '') }));
  }
  const packed = newest('compress');
  if (packed) {
    const r = packed.result.compress;
    el.append(h('p', { id: 'compress-last', text: 'last compress (job ' + packed.id + ', ' + when(packed.finished_unix) +
      ', ' + r.codec + '): packed ' + bytes(r.packed_bytes) + ' into ' + bytes(r.stream_bytes) + ' of streams, ' +
      bytes(r.raw_bytes) + ' stayed raw; used ' + bytes(r.used_bytes_before) + ' -> ' + bytes(r.used_bytes_after) +
      (r.regions_skipped ? '; ' + r.regions_skipped + ' regions changed while packed (run it again)' : '') }));
  }
  $('#compress-go').hidden = !!(s.cannot || []).find((c) => c.command === 'compress');
}

function renderAlarms(alarms) {
  const tb = $('#alarms tbody');
  tb.replaceChildren();
  for (const a of alarms || []) {
    tb.append(h('tr', { 'data-alarm': a.kind },
      h('td', { text: a.kind }),
      h('td', { class: 'state-' + a.state, text: String(a.state).toUpperCase() }),
      h('td', { class: 'num', text: a.percent + ' %' }),
      h('td', { class: 'num', text: a.warning_percent + ' %' }),
      h('td', { class: 'num', text: a.alarm_percent + ' %' }),
      h('td', { class: 'muted', text: a.exec || '' })));
  }
  if (!tb.children.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 6, text: 'no alarms on this datastore' })));
}

const diskDetail = new Map();   // name -> { info (exclusive, packed, fragments), at }
const DETAIL_MS = 30000;        // how old a disk's exclusive and packed bytes and fragments may get

function renderDisks(disks) {
  const tb = $('#disks tbody');
  tb.replaceChildren();
  for (const d of disks) {
    const det = (diskDetail.get(d.name) || {}).info || {};
    const w = d.object_store;  // an object store's disk: its writer record
    const owner = w && w.owner ? (w.owner.name || w.owner.host) : '-';
    tb.append(h('tr', { 'data-disk': d.name },
      h('td', {}, h('a', { href: '#/disk/' + enc(d.name), text: d.name })),
      h('td', { class: 'num', text: bytes(d.size_bytes) }),
      h('td', { text: d.provisioning || 'thin' }),
      h('td', { class: 'num', text: bytes(d.allocated_bytes) }),
      h('td', { class: 'num', text: bytes(det.exclusive_bytes) }),
      h('td', { class: 'num', text: bytes(det.packed_bytes) }),
      h('td', { class: 'num', text: det.fragments ?? '-' }),
      h('td', { class: 'num', text: Array.isArray(d.snapshots) ? d.snapshots.length : d.snapshots }),
      h('td', { text: d.parent || '-' }),
      h('td', { class: 'shared-only', text: owner }),
      h('td', { class: 'shared-only num', text: w ? w.generation : '-' })));
  }
  if (!disks.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 11, text: "no disks yet: 'strata create NAME --size 10G'" })));
}

// Groups and their snapshots: one cut across the members each
// (docs/BACKUP.md); delete and revert act on every member at once.
function renderGroups(groups) {
  const tb = $('#groups tbody');
  tb.replaceChildren();
  for (const { group: g, snaps } of groups) {
    const base = '/groups/' + enc(g.name) + '/snapshots';
    const list = h('ul', { class: 'plain' });
    for (const s of snaps) {
      const q = s.quiesce ? ', hook ' + s.quiesce.result : '';
      list.append(h('li', { 'data-group-snapshot': s.name },
        h('b', { text: s.name }),
        ' ' + s.consistency + q + ', I/O held ' + usLabel(s.pause_us) + ', ' + age(s.created_unix) +
          (s.exclusive_bytes !== undefined ? ', deleting frees ' + bytes(s.exclusive_bytes) : '') + ' ',
        h('button', { text: 'revert', class: 'danger',
          onclick: () => perform('revert group ' + g.name + ' to ' + s.name, 'POST', base + '/' + enc(s.name) + '/revert', {},
            'Revert every disk of ' + g.name + ' (' + g.disks.join(', ') + ') to ' + s.name + '? Their changes since are lost.') }),
        ' ',
        h('button', { text: 'delete', class: 'danger',
          onclick: () => perform('delete group snapshot ' + g.name + '@' + s.name, 'DELETE', base + '/' + enc(s.name), undefined,
            'Delete ' + g.name + '@' + s.name + ' on every member?') })));
    }
    if (!snaps.length) list.append(h('li', { class: 'muted', text: 'none' }));
    const input = h('input', { placeholder: 'snapshot name', required: true, size: 12, 'aria-label': 'group snapshot name' });
    const form = h('form', { class: 'action' }, input, ' ', h('button', { text: 'snapshot all disks' }));
    form.addEventListener('submit', (ev) => {
      ev.preventDefault();
      perform('group snapshot ' + g.name + '@' + input.value.trim(), 'POST', base, { name: input.value.trim() });
    });
    tb.append(h('tr', { 'data-group': g.name },
      h('td', { text: g.name }),
      h('td', {}, ...g.disks.flatMap((d, i) => [i ? ', ' : '', h('a', { href: '#/disk/' + enc(d), text: d })])),
      h('td', {}, list),
      h('td', {}, form)));
  }
  if (!groups.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 4, text: "no groups: 'strata group create NAME DISK...'" })));
}

function renderJobs(jobs) {
  const tb = $('#jobs tbody');
  tb.replaceChildren();
  for (const j of jobs) {
    const running = j.state === 'running' || j.state === 'paused';
    tb.append(h('tr', { 'data-job': j.id },
      h('td', { class: 'num', text: j.id }),
      h('td', { text: j.what }),
      h('td', { text: j.state + (j.error ? ': ' + j.error : '') }),
      h('td', {}, h('progress', { max: 100, value: j.percent }), ' ' + j.percent + ' %'),
      h('td', {}, running ? [
        h('button', { text: j.state === 'paused' ? 'resume' : 'pause',
          onclick: () => perform('job ' + j.id, 'POST', '/jobs/' + j.id + '/' + (j.state === 'paused' ? 'resume' : 'pause')) }),
        ' ',
        h('button', { text: 'cancel', class: 'danger',
          onclick: () => perform('cancel job ' + j.id, 'POST', '/jobs/' + j.id + '/cancel', undefined, 'Cancel job ' + j.id + ' (' + j.what + ')?') }),
      ] : null)));
  }
  if (!jobs.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 5, text: 'no jobs' })));
}

// Bytes in a MiB: every rate on the page is in powers of 1024, as the
// CLI's sizes are.
const MIB = 1048576;

// Scheduled snapshots (GET /api/v1/schedules): what the server takes and
// expires, when it last ran and how, and when it runs next.
function renderSchedules(list) {
  const tb = $('#schedules tbody');
  tb.replaceChildren();
  const at = (ms) => (ms ? new Date(ms).toLocaleString() : '-');
  const every = (s) => (s % 86400 === 0 ? s / 86400 + ' d' : s % 3600 === 0 ? s / 3600 + ' h'
    : s % 60 === 0 ? s / 60 + ' min' : s + ' s');
  for (const x of list) {
    const failed = x.last_result && x.last_result !== 'ok';
    tb.append(h('tr', { 'data-schedule': x.name },
      h('td', { text: x.name }),
      h('td', { text: x.target }),
      h('td', { class: 'num', text: every(x.every_s) }),
      h('td', { class: 'num', text: x.keep == null ? 'all' : String(x.keep) }),
      h('td', { class: failed ? 'state-alarm' : '',
        text: at(x.last_run_unix_ms) + (x.last_result ? ' (' + x.last_result + ')' : '') }),
      h('td', { text: at(x.next_run_unix_ms) })));
  }
  if (!list.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 6, text: 'none' })));
}

// The event log's newest entries (GET /api/v1/events): who changed what.
const EVENTS_SHOWN = 50;
function renderEvents(events) {
  const tb = $('#events tbody');
  tb.replaceChildren();
  for (const e of events) {
    const failed = e.result !== 'ok';
    const when = new Date(e.time_unix_ms);
    tb.append(h('tr', { 'data-event': e.seq },
      h('td', { class: 'when', text: when.toLocaleString(), title: when.toISOString() }),
      h('td', { text: e.kind }),
      h('td', { text: e.target || '-' }),
      h('td', { text: e.actor }),
      h('td', { class: failed ? 'state-alarm' : 'state-ok',
        text: failed ? e.result + (e.error ? ': ' + e.error : '') : 'ok',
        title: e.detail || '' })));
  }
  if (!events.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 5, text: 'no events yet' })));
}

// ---- live I/O ------------------------------------------------------------

// The smallest bucket edge at or above fraction q of a histogram's count.
function percentile(hist, q) {
  if (!hist || !hist.count) return null;
  const want = q * hist.count;
  let seen = 0;
  for (const b of hist.buckets) {
    seen += b.count;
    if (seen >= want) return b.le;
  }
  return null;
}

// Rates between the last two polls, per export.
function rates(prev, cur, dt) {
  const out = {};
  for (const [name, s] of Object.entries(cur)) {
    const p = prev && prev[name];
    const d = (k, f) => p && s[k][f] >= p[k][f] ? (s[k][f] - p[k][f]) / dt : 0;
    out[name] = {
      riops: d('read', 'commands'), wiops: d('write', 'commands'),
      rbps: d('read', 'bytes'), wbps: d('write', 'bytes'),
      p50: percentile(s.latency.all, 0.5), p99: percentile(s.latency.all, 0.99),
      inflight: s.in_flight,
    };
  }
  return out;
}

function renderIoTable(r) {
  const tb = $('#io tbody');
  tb.replaceChildren();
  for (const [name, x] of Object.entries(r)) {
    tb.append(h('tr', { 'data-export': name },
      h('td', { text: name }),
      h('td', { class: 'num', text: rate(x.riops) }),
      h('td', { class: 'num', text: rate(x.wiops) }),
      h('td', { class: 'num', text: rate(x.rbps / MIB) }),
      h('td', { class: 'num', text: rate(x.wbps / MIB) }),
      h('td', { class: 'num', text: usLabel(x.p50) }),
      h('td', { class: 'num', text: usLabel(x.p99) }),
      h('td', { class: 'num', text: x.inflight })));
  }
  if (!tb.children.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 8, text: 'no exports with statistics' })));
}

const HISTOGRAMS = [
  ['latency', 'latency (µs)'],
  ['io_length', 'I/O length (bytes)'],
  ['seek_distance', 'seek distance (sectors)'],
  ['seek_distance_closest', 'seek distance to the closest of the last 16 (sectors)'],
  ['outstanding', 'outstanding I/Os at arrival'],
  ['interarrival', 'interarrival time (µs)'],
];

function histogram(key, title, pair) {
  const r = pair.read, w = pair.write;
  const max = Math.max(1, ...r.buckets.map((b) => b.count), ...w.buckets.map((b) => b.count));
  const bars = h('div', { class: 'bars' });
  const labels = h('div', { class: 'labels' });
  const every = Math.ceil(r.buckets.length / 8);
  r.buckets.forEach((b, i) => {
    const wc = (w.buckets[i] || { count: 0 }).count;
    const rb = h('div', { class: 'bar read', 'data-count': b.count, title: 'read ' + b.label + ': ' + b.count });
    const wb = h('div', { class: 'bar write', 'data-count': wc, title: 'write ' + b.label + ': ' + wc });
    rb.style.height = (100 * b.count / max) + '%';
    wb.style.height = (100 * wc / max) + '%';
    bars.append(h('div', { class: 'bucket' }, rb, wb));
    const lastOne = i === r.buckets.length - 1;
    labels.append(h('span', { text: i % every === 0 || lastOne ? b.label : '', title: b.label, class: lastOne ? 'last' : '' }));
  });
  const yaxis = h('div', { class: 'yaxis' }, h('span', { text: String(max) }), h('span', { text: String(Math.round(max / 2)) }), h('span', { text: '0' }));
  return h('div', { class: 'hist', id: 'hist-' + key, 'data-total': r.count + w.count },
    h('h4', { text: title }),
    h('div', { class: 'legend' }, h('span', { class: 'r', text: 'read ' + r.count }), h('span', { class: 'w', text: 'write ' + w.count }),
      h('span', { class: 'muted', text: ' (commands per bucket)' })),
    h('div', { class: 'plot' }, yaxis, h('div', { class: 'plotarea' }, bars, labels)));
}

function renderLive(name, s, x) {
  const live = $('#live');
  live.replaceChildren();
  if (!s) {
    $('#live-note').textContent = '(no client has used this export since the server started, or it runs with --no-stats)';
    $('#histograms').replaceChildren();
    return;
  }
  $('#live-note').textContent = s.recording ? '' : '(recording paused)';
  const fact = (id, label, value) => h('div', { id }, h('b', { text: value }), h('span', { text: label }));
  live.append(
    fact('iops-read', 'read IOPS', rate(x.riops)),
    fact('iops-write', 'write IOPS', rate(x.wiops)),
    fact('mbps-read', 'read MiB/s', rate(x.rbps / MIB)),
    fact('mbps-write', 'write MiB/s', rate(x.wbps / MIB)),
    fact('lat-p50', 'latency p50', usLabel(x.p50)),
    fact('lat-p99', 'latency p99', usLabel(x.p99)),
    fact('lat-p999', 'latency p99.9', usLabel(percentile(s.latency.all, 0.999))),
    fact('ops-total', 'reads / writes', s.read.commands + ' / ' + s.write.commands),
    fact('errors', 'errors', s.errors));
  const hs = $('#histograms');
  const hsrc = histWindow === 'since' ? s : (windowStats || s);
  hs.replaceChildren(...HISTOGRAMS.map(([k, t]) => histogram(k, t, hsrc[k])));
  hs.dataset.source = hsrc === s ? 'since' : 'window';
  thinLabels(hs);
}

// ---- performance charts ------------------------------------------------------

// Line charts of GET /api/v1/charts, drawn as inline SVG. The SVG's
// coordinates are fixed (W x H) and it scales as a whole, so its text never
// crowds whatever the window's width.
const SVG_NS = 'http://www.w3.org/2000/svg';
const CW = 360, CH = 150, LEFT = 62, RIGHT = 8, TOP = 8, BOTTOM = 20;
let chartRange = 'hour';

function svg(tag, attrs, ...kids) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') el.textContent = v; else el.setAttribute(k, v);
  }
  for (const kid of kids) if (kid) el.append(kid);
  return el;
}

// A round ceiling: 1, 2 or 5 times a power of ten.
function niceCeil(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 5, 10]) if (m * p >= v) return m * p;
  return 10 * p;
}

// Axis formats: each takes the axis's top value and gives a function of a value.
const AXES = {
  count: () => (v) => v >= 1e6 ? (v / 1e6) + 'M' : v >= 1e3 ? (v / 1e3) + 'k' : String(+v.toFixed(2)),
  rate: (top) => {
    const u = [['B/s', 1], ['KiB/s', 1024], ['MiB/s', 1048576], ['GiB/s', 1073741824]];
    let i = 0;
    while (i < u.length - 1 && top >= u[i + 1][1]) i++;
    return (v) => +(v / u[i][1]).toFixed(2) + ' ' + u[i][0];
  },
  us: (top) => top >= 1000 ? (v) => +(v / 1000).toFixed(2) + ' ms' : (v) => +v.toFixed(1) + ' µs',
  bytes: () => (v) => bytes(v),
};

// The top of a chart's y axis: a round number of the axis's own unit.
function axisTop(kind, max) {
  if (kind === 'rate' || kind === 'bytes') {
    let unit = 1;
    while (max / unit >= 1024) unit *= 1024;
    return niceCeil(max / unit) * unit;
  }
  return niceCeil(max);
}

function hhmm(unix, seconds) {
  const d = new Date(unix * 1000);
  const two = (n) => String(n).padStart(2, '0');
  return two(d.getHours()) + ':' + two(d.getMinutes()) + (seconds ? ':' + two(d.getSeconds()) : '');
}

// One chart: `lines` are [label, class, key]; `kind` an AXES key.
function lineChart(id, title, points, lines, kind) {
  const pw = CW - LEFT - RIGHT, ph = CH - TOP - BOTTOM;
  let max = 0;
  for (const p of points) for (const [, , k] of lines) if (p[k] !== null && p[k] !== undefined) max = Math.max(max, p[k]);
  const top = axisTop(kind, max);
  const fmt = AXES[kind](top);
  // Points are one interval apart: placed by their index (t_unix is whole
  // seconds, coarser than a test's interval).
  const last = Math.max(1, points.length - 1);
  const x = (i) => LEFT + (points.length > 1 ? i / last : 1) * pw;
  const secs = points.length > 1 && points[points.length - 1].t_unix - points[0].t_unix < 120;
  const y = (v) => TOP + ph - (v / top) * ph;
  const g = svg('svg', { viewBox: '0 0 ' + CW + ' ' + CH, class: 'chart', role: 'img', 'aria-label': title,
    'data-points': points.length });
  for (const f of [0, 0.5, 1]) {
    const yy = y(top * f);
    g.append(svg('line', { x1: LEFT, x2: CW - RIGHT, y1: yy, y2: yy, class: f ? 'grid' : 'axis' }));
    g.append(svg('text', { x: LEFT - 4, y: yy + 3.5, 'text-anchor': 'end', class: 'tick', text: fmt(top * f) }));
  }
  g.append(svg('line', { x1: LEFT, x2: LEFT, y1: TOP, y2: TOP + ph, class: 'axis' }));
  if (points.length) {
    const n = points.length - 1;
    const ticks = n > 1 ? [[0, 'start'], [Math.round(n / 2), 'middle'], [n, 'end']] : [[n, 'end']];
    for (const [i, anchor] of ticks) {
      g.append(svg('text', { x: x(i), y: CH - 5, 'text-anchor': anchor, class: 'tick', text: hhmm(points[i].t_unix, secs) }));
    }
  }
  for (const [label, cls, k] of lines) {
    let d = '', n = 0;
    points.forEach((p, i) => {
      const v = p[k];
      if (v === null || v === undefined) return;
      d += (n ? 'L' : 'M') + x(i).toFixed(1) + ' ' + y(v).toFixed(1);
      n++;
    });
    if (n === 1) d += 'h1';
    g.append(svg('path', { d: d || 'M0 0', class: 'line ' + cls, 'data-n': n, 'data-series': k },
      svg('title', { text: label })));
  }
  const legend = h('div', { class: 'legend' }, ...lines.map(([label, cls]) => h('span', { class: 'key ' + cls, text: label })));
  return h('div', { class: 'chart-box', id }, h('h4', { text: title }), g, legend);
}

function renderPerf(box, charts, what) {
  const pts = (charts && charts.points) || [];
  const per = charts ? (charts.interval_s >= 60 ? (charts.interval_s / 60) + ' min' : charts.interval_s + ' s') : '-';
  const toggle = h('span', { class: 'range' },
    ...['hour', 'day'].map((r) => h('button', { text: 'last ' + r, class: r === chartRange ? 'on' : '', 'data-range': r,
      onclick: () => { chartRange = r; drawn.delete('perf'); refresh(true); } })));
  const note = h('span', { class: 'muted', text: pts.length ? what + ', one point per ' + per : 'no points yet (one every ' + per + ')' });
  box.replaceChildren(h('div', { class: 'perf-head' }, toggle, note),
    h('div', { class: 'charts' },
      lineChart('chart-iops', 'IOPS', pts, [['read', 'read', 'read_iops'], ['write', 'write', 'write_iops']], 'count'),
      lineChart('chart-bps', 'throughput', pts, [['read', 'read', 'read_bps'], ['write', 'write', 'write_bps']], 'rate'),
      lineChart('chart-latency', 'latency', pts, [['read p50', 'read', 'read_p50_us'], ['read p99', 'read p99', 'read_p99_us'],
        ['write p50', 'write', 'write_p50_us'], ['write p99', 'write p99', 'write_p99_us']], 'us'),
      lineChart('chart-space', what === 'datastore' ? 'space used' : 'allocated', pts, [['bytes', 'space', 'used_bytes']], 'bytes')));
}

async function refreshPerf(box, exportName) {
  const q = '/charts?range=' + chartRange + (exportName ? '&export=' + enc(exportName) : '');
  const c = await get(q).catch(() => null);
  if (changed('perf', [q, c])) renderPerf(box, c, exportName ? 'this disk' : 'datastore');
}

// Hide the labels under a histogram that would overlap the one before.
function thinLabels(root) {
  for (const row of root.querySelectorAll('.labels')) {
    let right = -Infinity;
    for (const span of row.children) {
      span.style.visibility = '';
      if (!span.textContent) continue;
      const r = textBox(span);
      if (r.left < right + 4) { span.style.visibility = 'hidden'; continue; }
      right = r.right;
    }
  }
}

function textBox(span) {
  const range = document.createRange();
  range.selectNodeContents(span);
  return range.getBoundingClientRect();
}

// ---- one disk -------------------------------------------------------------

// Snapshots as the API lists them: a local datastore names each one's
// parent and marks the current one; an object-store datastore gives ids
// and milliseconds, and the disk names its current snapshot.
function normalise(snaps, currentName) {
  const byId = new Map(snaps.filter((s) => s.id !== undefined).map((s) => [s.id, s.name]));
  return snaps.map((s) => ({
    ...s,
    parent: typeof s.parent === 'number' ? (byId.get(s.parent) || null) : (s.parent || null),
    created_unix: s.created_unix ?? (s.created_ms ? s.created_ms / 1000 : undefined),
    current: s.current ?? (currentName !== undefined && s.name === currentName),
  }));
}

function renderTree(disk, rawSnaps, currentName) {
  const snaps = normalise(rawSnaps, currentName);
  const ul = $('#tree');
  ul.replaceChildren();
  const kids = new Map();
  for (const s of snaps) {
    const p = s.parent || '';
    if (!kids.has(p)) kids.set(p, []);
    kids.get(p).push(s);
  }
  const here = () => h('li', { class: 'here', id: 'you-are-here' },
    h('span', { class: 'node' }, h('span', { class: 'you', text: '● you are here' }), h('span', { class: 'muted', text: 'live state of ' + disk })));
  const current = snaps.find((s) => s.current);
  const build = (parent) => {
    const list = [];
    for (const s of kids.get(parent) || []) {
      const sub = h('ul', {});
      for (const li of build(s.name)) sub.append(li);
      if (current && current.name === s.name) sub.append(here());
      list.push(h('li', { 'data-snapshot': s.name, class: current && current.name === s.name ? 'parent-of-here' : '' },
        h('span', { class: 'node' },
          h('span', { class: 'name', text: s.name }),
          s.exclusive_bytes !== undefined ? h('span', { class: 'muted', text: bytes(s.exclusive_bytes) + ' exclusive' }) : null,
          h('span', { class: 'muted', text: age(s.created_unix) }),
          s.description ? h('span', { class: 'muted', text: '“' + s.description + '”' }) : null,
          h('button', { text: 'revert', class: 'revert', onclick: () => perform('revert ' + disk + ' to ' + s.name, 'POST',
            '/disks/' + enc(disk) + '/snapshots/' + enc(s.name) + '/revert', undefined,
            'Revert ' + disk + ' to snapshot ' + s.name + '? Everything written since that snapshot is discarded.') }),
          h('button', { text: 'delete', class: 'delete', onclick: () => perform('delete ' + disk + '@' + s.name, 'DELETE',
            '/disks/' + enc(disk) + '/snapshots/' + enc(s.name), undefined,
            'Delete snapshot ' + disk + '@' + s.name + '?' + (s.exclusive_bytes !== undefined ? ' It frees ' + bytes(s.exclusive_bytes) + '.' : '')) })),
        sub.children.length ? sub : null));
    }
    return list;
  };
  for (const li of build('')) ul.append(li);
  if (!current) ul.append(here());
  for (const sel of [$('#clone-snap'), $('#snaprename-snap')]) {
    const keep = sel.value;
    sel.replaceChildren(...snaps.map((s) => h('option', { value: s.name, text: disk + '@' + s.name })));
    if (snaps.some((s) => s.name === keep)) sel.value = keep;
  }
}

function renderDiskFacts(d) {
  $('#disk-title').textContent = d.name;
  const fact = (label, value) => h('div', {}, h('b', { text: value }), h('span', { text: label }));
  $('#disk-facts').replaceChildren(...[
    fact('size', bytes(d.size_bytes)),
    fact('type', d.provisioning || 'thin'),
    fact('allocated', bytes(d.allocated_bytes)),
    fact('exclusive', bytes(d.exclusive_bytes)),
    fact('in snapshots', bytes(d.snapshot_space_bytes)),
    // What of the head 'strata compress' packed (its logical bytes).
    fact('packed', bytes(d.packed_bytes)),
    fact('fragments', d.fragments ?? '-'),
    fact('parent', d.parent ? d.parent + (d.parent_deleted ? ' (deleted)' : '') : '-'),
    fact('created', age(d.created_unix)),
    // Keyslots only, never a key (docs/SECURITY.md).
    d.encryption ? fact('encrypted', (d.encryption.locked ? 'locked' : 'unlocked') + ', '
      + d.encryption.slots.length + ' keyslot' + (d.encryption.slots.length === 1 ? '' : 's')
      + ' (' + d.encryption.slots.map((k) => k.slot + ': ' + (k.label || k.source)).join(', ') + ')'
      + ', data key ' + d.encryption.data_key + (d.encryption.own_key ? ' (own key)' : '')
      + (d.encryption.deep_rekey ? ', deep rekey at ' + Math.floor(100 * d.encryption.deep_rekey.done_bytes
        / Math.max(1, d.encryption.deep_rekey.total_bytes)) + '%' : '')) : null,
    d.object_store && d.object_store.owner ? fact('writer', d.object_store.owner.name + writerPid(d.object_store.owner)) : null,
    d.object_store ? fact('generation', d.object_store.generation) : null].filter(Boolean));
}

// Who has this disk (or one of its snapshots) open: `clients` of
// GET /disks/{d}, absent when nobody has.
function renderClients(clients) {
  const tb = $('#clients tbody');
  tb.replaceChildren();
  for (const c of clients || []) {
    tb.append(h('tr', { 'data-client': c.export + ' ' + c.peer },
      h('td', { text: c.export }),
      h('td', { text: c.transport }),
      h('td', { text: c.peer }),
      h('td', { text: c.read_only ? 'read-only' : 'read-write' }),
      h('td', { text: age(c.since_unix) })));
  }
  if (!tb.children.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 5, text: 'nobody' })));
}

// The jobs on this disk or its snapshots (GET /jobs is newest first).
function renderDiskJobs(disk, jobs) {
  const tb = $('#disk-jobs tbody');
  tb.replaceChildren();
  const mine = (jobs || []).filter((j) => j.target === disk || String(j.target || '').startsWith(disk + '@'));
  mine.sort((a, b) => (b.started_unix || 0) - (a.started_unix || 0) || b.id - a.id);
  for (const j of mine) {
    tb.append(h('tr', { 'data-job': j.id },
      h('td', { class: 'num', text: j.id }),
      h('td', { text: j.what }),
      h('td', { text: j.state + (j.error ? ': ' + j.error : '') }),
      h('td', { class: 'num', text: j.percent + ' %' }),
      h('td', { text: age(j.started_unix) }),
      h('td', { text: j.finished_unix ? age(j.finished_unix) : '-' })));
  }
  if (!mine.length) tb.append(h('tr', {}, h('td', { class: 'empty', colSpan: 6, text: 'no jobs on this disk' })));
}

// pid 0: the host's own claim, made with no server running (FORMAT.md §11.6).
function writerPid(owner) {
  return owner.pid ? ' (pid ' + owner.pid + ')' : ' (the host: claimed with no server running)';
}

// ---- refresh loop ----------------------------------------------------------

// Whether `data` differs from what `key` last drew (or that is 30 s old,
// for the ages): parts that did not change are not redrawn, so a button
// under the pointer stays the same element.
const drawn = new Map();
function changed(key, data) {
  const sig = JSON.stringify(data);
  const last = drawn.get(key);
  if (last && last.sig === sig && Date.now() - last.at < 30000) return false;
  drawn.set(key, { sig, at: Date.now() });
  return true;
}

let busy = false;

async function refresh(all) {
  if (busy && !all) return;  // the last poll is still out
  busy = true;
  const slow = all || tick % SLOW_EVERY === 0;
  tick++;
  try {
    const statsNow = await get('/stats').catch(() => ({}));
    const now = performance.now();
    const r = rates(lastStats && lastStats.data, statsNow, lastStats ? (now - lastStats.t) / 1000 : 1);
    lastStats = { t: now, data: statsNow };
    if (route.view === 'overview') {
      renderIoTable(r);
      if (slow) {
        await refreshPerf($('#perf-overview'), null);
        const [status, disks, alarms, jobs, events, schedules] = await Promise.all([
          get('/status'), get('/disks'), get('/alarms').catch(() => []), get('/jobs').catch(() => []),
          get('/events?limit=' + EVENTS_SHOWN).catch(() => []), get('/schedules').catch(() => [])]);
        if (changed('schedules', schedules)) renderSchedules(schedules);
        if (changed('status', [status, alarms])) renderGauges(status, alarms);
        if (changed('alarms', alarms)) renderAlarms(alarms);
        if (changed('jobs', jobs)) renderJobs(jobs);
        if (changed('space', [status, jobs])) renderSpace(status, jobs);
        if (changed('events', events)) renderEvents(events);
        // Exclusive and packed bytes and fragments cost a walk of each disk's map: read
        // again when 30 s old (or after an action), not at every poll.
        const stale = disks.filter((d) => all || !diskDetail.has(d.name) || Date.now() - diskDetail.get(d.name).at > DETAIL_MS);
        await Promise.all(stale.map((d) => get('/disks/' + enc(d.name))
          .then((info) => diskDetail.set(d.name, { info, at: Date.now() })).catch(() => {})));
        if (changed('disks', [disks, disks.map((d) => (diskDetail.get(d.name) || {}).info)])) renderDisks(disks);
        const groups = await get('/groups').then((gs) => Promise.all(gs.map((group) =>
          get('/groups/' + enc(group.name) + '/snapshots').then((snaps) => ({ group, snaps }))))).catch(() => []);
        if (changed('groups', groups)) renderGroups(groups);
      }
    } else {
      const name = route.disk;
      if (histWindow !== 'since' && slow) {
        windowStats = await get('/stats/' + enc(name) + '?window=' + histWindow).then((w) => w[name]).catch(() => null);
      }
      renderLive(name, statsNow[name], r[name]);
      if (slow) {
        await refreshPerf($('#perf-disk'), name);
        const [d, snaps, jobs] = await Promise.all([get('/disks/' + enc(name)), get('/disks/' + enc(name) + '/snapshots'),
          get('/jobs').catch(() => [])]);
        if (changed('disk', d)) renderDiskFacts(d);
        if (changed('clients', d.clients || [])) renderClients(d.clients);
        if (changed('disk-jobs', [name, jobs])) renderDiskJobs(name, jobs);
        if (changed('tree', [name, snaps, d.current_snapshot])) renderTree(name, snaps, d.current_snapshot ?? undefined);
      }
    }
    $('#updated').textContent = 'updated ' + new Date().toLocaleTimeString();
    document.body.dataset.updates = String(tick);
  } catch (e) {
    say('cannot read the server: ' + e.message, 'error');
  } finally {
    busy = false;
  }
}

function wireForms() {
  const disk = () => route.disk;
  $('#f-snap').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const name = $('#snap-name').value.trim();
    perform('snapshot ' + disk() + '@' + name, 'POST', '/disks/' + enc(disk()) + '/snapshots',
      { name, description: $('#snap-desc').value }).then((r) => { if (r) $('#snap-name').value = ''; });
  });
  $('#f-clone').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const name = $('#clone-name').value.trim();
    perform('linked clone ' + name, 'POST', '/disks/' + enc(disk()) + '/clones',
      { name, snapshot: $('#clone-snap').value });
  });
  $('#f-extend').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const size = $('#extend-size').value.trim();
    perform('extend ' + disk() + ' to ' + size, 'POST', '/disks/' + enc(disk()) + '/extend', { size },
      'Extend ' + disk() + ' to ' + size + '? A disk cannot be shrunk again.');
  });
  $('#f-convert').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const type = $('#convert-type').value;
    perform('convert ' + disk() + ' to ' + type, 'POST', '/disks/' + enc(disk()) + '/convert', { type },
      'Convert ' + disk() + ' to ' + type + '? It runs as a job while the disk stays online.');
  });
  $('#f-rename').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const from = disk(), to = $('#rename-to').value.trim();
    perform('rename ' + from + ' to ' + to, 'POST', '/disks/' + enc(from) + '/rename', { to })
      .then((r) => { if (r) { $('#rename-to').value = ''; location.hash = '#/disk/' + enc(to); } });
  });
  $('#f-snaprename').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const from = $('#snaprename-snap').value, to = $('#snaprename-to').value.trim();
    perform('rename ' + disk() + '@' + from + ' to ' + to, 'POST',
      '/disks/' + enc(disk()) + '/snapshots/' + enc(from) + '/rename', { to })
      .then((r) => { if (r) $('#snaprename-to').value = ''; });
  });
  $('#f-fullclone').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const name = $('#fullclone-name').value.trim();
    perform('full clone ' + disk() + ' as ' + name, 'POST', '/disks/' + enc(disk()) + '/clones',
      { name, full: true, type: $('#fullclone-type').value })
      .then((r) => { if (r) $('#fullclone-name').value = ''; });
  });
  // Delete: a confirmation; a refusal (409: clients have it open, or
  // clones depend on it) is shown as the server words it, with
  // "Delete anyway" to send {"force": true}.
  const refusal = $('#delete-refusal');
  const removed = (name) => {
    refusal.hidden = true;
    say('delete ' + name + ': done', 'ok');
    diskDetail.delete(name);
    location.hash = '#/';
  };
  $('#f-delete').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const name = disk();
    refusal.hidden = true;
    if (!(await confirmDialog('Delete disk ' + name + ' and all its snapshots? This cannot be undone.'))) {
      say('delete ' + name + ': not done (cancelled)', '');
      return;
    }
    try {
      await act('DELETE', '/disks/' + enc(name));
      removed(name);
    } catch (e) {
      if (e.status === 409) {
        $('#delete-refusal-text').textContent = e.message;
        refusal.dataset.disk = name;
        refusal.hidden = false;
        say('delete ' + name + ': refused (see below)', 'error');
      } else {
        const hint = e.status === 401 ? ' — unlock the actions with the token' : '';
        say('delete ' + name + ': refused: ' + e.message + hint, 'error');
      }
    }
  });
  $('#delete-force').addEventListener('click', async () => {
    const name = refusal.dataset.disk;
    if (!name || name !== disk()) { refusal.hidden = true; return; }
    try {
      await act('DELETE', '/disks/' + enc(name), { force: true });
      removed(name);
    } catch (e) {
      say('delete ' + name + ' (forced): refused: ' + e.message, 'error');
    }
  });
  $('#delete-keep').addEventListener('click', () => { refusal.hidden = true; say('delete: not done', ''); });
  $('#f-create').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const name = $('#create-name').value.trim();
    perform('create ' + name, 'POST', '/disks',
      { name, size: $('#create-size').value.trim(), type: $('#create-type').value })
      .then((r) => { if (r) { $('#create-name').value = ''; $('#create-size').value = ''; } });
  });
  $('#f-import').addEventListener('submit', (ev) => {
    ev.preventDefault();
    const name = $('#import-name').value.trim();
    const body = { path: $('#import-path').value.trim(), name };
    if ($('#import-format').value) body.format = $('#import-format').value;
    perform('import ' + name, 'POST', '/imports', body)
      .then((r) => { if (r) { $('#import-path').value = ''; $('#import-name').value = ''; } });
  });
  $('#estimate-go').addEventListener('click', () =>
    perform('dedup estimate', 'POST', '/dedup', { estimate: true }));
  $('#dedup-go').addEventListener('click', () =>
    perform('dedup', 'POST', '/dedup', {},
      'Share equal grains of every disk? It runs online, paced; what it frees shows here when it ends.'));
  $('#compress-go').addEventListener('click', () =>
    perform('compress', 'POST', '/compress', {},
      'Pack the grains of every disk that shrink by an eighth (LZ4)? It runs online, paced; ' +
      'a client write to a packed grain makes it raw again.'));
  $('#f-defrag').addEventListener('submit', (ev) => {
    ev.preventDefault();
    perform('defrag ' + disk(), 'POST', '/disks/' + enc(disk()) + '/defrag', {},
      'Defragment ' + disk() + '? It moves data while the disk stays online.');
  });
}

async function main() {
  takeTokenFromHash();
  try {
    info = await get('');
  } catch (e) {
    say('cannot read the server: ' + e.message, 'error');
    // Reads need a token here (beyond loopback, or --http-read-token).
    if (e.status === 401 || e.status === 403) askToken();
    return;
  }
  get('/status').then((s) => { $('#location').textContent = s.location || s.url || ''; }).catch(() => {});
  document.body.classList.toggle('shared', !!info.shared);
  showLock();
  wireForms();
  $('#hist-window').addEventListener('change', (ev) => { histWindow = ev.target.value; windowStats = null; refresh(true); });
  parseRoute();
  window.addEventListener('hashchange', () => { parseRoute(); lastStats = null; drawn.clear(); refresh(true); });
  await refresh(true);
  setInterval(() => refresh(false), POLL_MS);
}

main();
