#!/usr/bin/env node
// Opens memory-viz pickles (gpushim-analyze export --format memory-viz) in PyTorch's own viewer
// code, headless: the MemoryViz.js that pytorch.org/memory_viz serves, run under node with its d3
// imports replaced by a small stand-in that evaluates every attribute callback the viewer sets
// (so the geometry code runs on every block and segment, as drawing would).
//
//   node scripts/check-memory-viz.mjs --viewer PATH/TO/MemoryViz.js [--expect-peak BYTES] FILE.pickle...
//
// The viewer file is PyTorch's (torch/utils/viz/MemoryViz.js) and is not part of this repository:
// fetch it from a PyTorch checkout. For each pickle this drives the viewer's three views the way
// its page does (add_local_files + view selection), then goes further than a click would:
//   - "Allocator State History" is drawn at EVERY event index, not only the last. The viewer
//     replays the trace backwards from the final segments; a block outside every segment at any
//     point makes it throw (b.segment is null), so this checks that blocks tile segments throughout.
//   - "Active Memory Timeline" and "Active Cached Segment Timeline" are computed with
//     process_alloc_data; their max_size is printed and, with --expect-peak, compared.
// Any exception, an empty snapshot, or a mismatch fails (exit 1). Not part of the test suite
// because the viewer file is not ours to commit; docs/gpu-validation.md-style records of runs go
// in the issue notes.
import fs from 'node:fs';

function usage(msg) {
  if (msg) console.error(`check-memory-viz: ${msg}`);
  console.error('usage: check-memory-viz.mjs --viewer MemoryViz.js [--expect-peak BYTES] FILE.pickle...');
  process.exit(2);
}

const args = process.argv.slice(2);
let viewerPath = null;
let expectPeak = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--viewer') viewerPath = args[++i];
  else if (args[i] === '--expect-peak') expectPeak = Number(args[++i]);
  else files.push(args[i]);
}
if (!viewerPath || files.length === 0) usage();

// ---- a d3 stand-in: nodes carry bound data as in the DOM, and every callback is evaluated ----
class Node {
  constructor(tag, data = undefined) {
    this.tag = tag;
    this.__data__ = data;
    this.children = [];
    this.parent = null;
    this.textValue = '';
    this.selectedIndex = 0;  // <select>: the value is the selected <option>'s text
    this.explicitValue = undefined;
  }
  get options() { return this.children; }
  get value() {
    if (this.explicitValue !== undefined) return this.explicitValue;
    const o = this.children[this.selectedIndex];
    return o === undefined ? '' : String(o.textValue);
  }
  set value(v) {
    const idx = this.children.findIndex(o => String(o.textValue) === String(v));
    if (idx >= 0) { this.selectedIndex = idx; this.explicitValue = undefined; }
    else this.explicitValue = v;
  }
  scrollIntoViewIfNeeded() {}
}

let callbacksEvaluated = 0;
class Selection {
  // `enter`: placeholders for data not yet bound to nodes ({parent, datum}).
  constructor(nodes, enter = null, parent = null) {
    this.nodes = nodes;
    this.enterItems = enter;
    this.parentNode = parent;
  }
  append(tag) {
    const made = [];
    const add = (parent, datum) => {
      const n = new Node(tag, datum);
      n.parent = parent;
      parent.children.push(n);
      made.push(n);
    };
    if (this.enterItems) this.enterItems.forEach(e => add(e.parent, e.datum));
    else this.nodes.forEach(p => add(p, p.__data__));
    return new Selection(made);
  }
  forEachDatum(fn) { this.nodes.forEach((n, i) => fn(n, n.__data__, i)); }
  attr(name, v) {
    if (typeof v === 'function') this.forEachDatum((n, d, i) => { v.call(n, d, i); callbacksEvaluated++; });
    return this;
  }
  style() { return this; }
  text(v) {
    this.forEachDatum((n, d, i) => {
      n.textValue = typeof v === 'function' ? v.call(n, d, i) : v;
      if (typeof v === 'function') callbacksEvaluated++;
    });
    return this;
  }
  html(v) { return this.text(v); }
  on() { return this; }
  call(fn, ...rest) { fn(this, ...rest); return this; }
  selectAll(what) {
    const parent = this.nodes[0];
    const found = parent ? parent.children.filter(c => c.tag === what) : [];
    return new Selection(found, null, parent);
  }
  data(arr) {
    const parent = this.parentNode || this.nodes[0];
    return new Selection([], arr.map(datum => ({parent, datum})), parent);
  }
  enter() { return this; }
  remove() {
    for (const n of this.nodes) if (n.parent) n.parent.children = n.parent.children.filter(c => c !== n);
    return this;
  }
  node() { return this.nodes[0]; }
  datum() { return this.nodes[0] ? this.nodes[0].__data__ : undefined; }
}

const documentNodes = {};
const d3 = {
  select: what => {
    if (typeof what === 'string') return new Selection([(documentNodes[what] ??= new Node(what))]);
    if (!what) throw new Error('d3.select of a missing node');
    return new Selection([what]);
  },
  format: () => x => String(x),
  event: {},
};

function scaleLinear() {
  let d = [0, 1], r = [0, 1];
  const s = x => {
    const span = d[1] - d[0];
    return r[0] + (span === 0 ? 0 : ((x - d[0]) / span) * (r[1] - r[0]));
  };
  s.domain = v => { d = v; return s; };
  s.range = v => { r = v; return s; };
  s.invert = y => {
    const span = r[1] - r[0];
    return d[0] + (span === 0 ? 0 : ((y - r[0]) / span) * (d[1] - d[0]));
  };
  return s;
}
function chainable() {
  const f = () => f;
  for (const k of ['on', 'extent', 'tickFormat', 'scale', 'translate', 'transform']) f[k] = () => f;
  return f;
}
// ---- load the viewer with the stand-ins in place of its imports ----
// The viewer is not in this repository: a wrong path gets one line saying where to take it from.
let source;
try {
  source = fs.readFileSync(viewerPath, 'utf8');
} catch (e) {
  const why = {ENOENT: 'no such file', EISDIR: 'a directory', EACCES: 'permission denied'}[e.code] || e.message;
  console.error(`check-memory-viz: cannot read the viewer ${viewerPath} (${why}): it is PyTorch's ` +
                'torch/utils/viz/MemoryViz.js, not in this repository: take it from a PyTorch checkout or ' +
                'https://raw.githubusercontent.com/pytorch/pytorch/main/torch/utils/viz/MemoryViz.js (docs/trace-format.md)');
  process.exit(2);
}
const imports = source.match(/^import .*$/gm) || [];
if (imports.length === 0) usage(`${viewerPath} does not look like MemoryViz.js (no imports)`);
source = source.replace(/^import .*$/gm, '').replace(/^export function/gm, 'function');
const frames = [];
let viewer;
try {
  viewer = new Function(
    'd3', 'axisLeft', 'scaleLinear', 'zoom', 'zoomIdentity', 'brushX', 'window', 'event',
    `${source}\nreturn {add_local_files, unpickle, annotate_snapshot, process_alloc_data, MemoryView, StackInfo};`,
  )(d3, () => chainable(), scaleLinear, () => chainable(), chainable(), () => chainable(),
    {requestAnimationFrame: fn => frames.push(fn)}, {});
} catch (e) {
  usage(`${viewerPath} does not look like MemoryViz.js (${e.name}: ${e.message})`);
}

// The viewer logs every snapshot it loads; keep the output to our own lines.
console.log = () => {};
const say = (...a) => process.stdout.write(a.join(' ') + '\n');

let failed = false;
for (const file of files) {
  try {
    const bytes = fs.readFileSync(file);
    const base64 = bytes.toString('base64');
    // 1. The page's own path: load, then each view as a user would pick it.
    for (const view of ['Active Memory Timeline', 'Allocator State History', 'Active Cached Segment Timeline']) {
      viewer.add_local_files([{name: file, base64}], view);
      while (frames.length) frames.shift()();
    }
    // 2. The same code on a fresh copy, at every event.
    const buffer = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength);
    const snap = viewer.unpickle(buffer);
    viewer.annotate_snapshot(snap);
    const devices = new Set(snap.segments.map(s => s.device));
    snap.device_traces.forEach((t, i) => { if (t.length) devices.add(i); });
    if (devices.size === 0) throw new Error('no segments and no events');
    for (const device of devices) {
      const events = snap.device_traces[device] || [];
      const outer = new Selection([new Node('div')]);
      const mv = viewer.MemoryView(outer, viewer.StackInfo(outer), snap, device);
      let last = [0, 0];
      for (let idx = 0; idx < Math.max(events.length, 1); idx++) last = mv.draw(idx);
      const blocks = viewer.process_alloc_data(snap, device, false, 15000);
      const segs = viewer.process_alloc_data(snap, device, true, 15000);
      say(`${file}: device ${device}: ${snap.segments.filter(s => s.device === device).length} segments, ` +
          `${events.length} events drawn at every index; at the end ${last[1]} B allocated / ${last[0]} B reserved; ` +
          `timeline peak ${blocks.max_size} B allocated, ${segs.max_size} B in segments`);
      if (expectPeak !== null && blocks.max_size !== expectPeak) {
        say(`${file}: FAIL: the viewer's peak is ${blocks.max_size}, expected ${expectPeak}`);
        failed = true;
      }
    }
  } catch (e) {
    say(`${file}: FAIL: the viewer threw: ${e && e.stack ? e.stack.split('\n').slice(0, 3).join(' | ') : e}`);
    failed = true;
  }
}
say(`${callbacksEvaluated} viewer callbacks evaluated`);
process.exit(failed ? 1 : 0);
