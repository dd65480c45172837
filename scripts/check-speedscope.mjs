#!/usr/bin/env node
// Opens profiles (gpushim-analyze export --format speedscope or folded) with speedscope's own
// importer, headless: the code of the speedscope npm package (the app www.speedscope.app serves),
// run under node without its user interface.
//
//   node scripts/check-speedscope.mjs --speedscope PATH/TO/node_modules/speedscope FILE...
//
// The package is not part of this repository: scripts/setup installs it (npm) into
// build-node-tools/, where tests/e2e/test_viewer_formats.py looks for it. Its bundle keeps the
// importer inside a closure; this loads the bundle without the last statement (which draws the app
// into the page) and hands out the importer speedscope runs on a dropped file (chosen by file name
// and content, as in the browser). For each FILE it prints one JSON line: how speedscope imported
// it, and per profile its name, weight unit, total weight as speedscope formats it, and every frame
// (name, file, line) with the weight speedscope gives it. Exit 1 if a file cannot be imported.
import fs from 'node:fs';
import path from 'node:path';
import vm from 'node:vm';

function usage(msg) {
  if (msg) console.error(`check-speedscope: ${msg}`);
  console.error('usage: check-speedscope.mjs --speedscope DIR FILE...');
  process.exit(2);
}

const args = process.argv.slice(2);
let pkg = null;
const files = [];
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--speedscope') pkg = args[++i];
  else files.push(args[i]);
}
if (!pkg || files.length === 0) usage();

const release = path.join(pkg, 'dist', 'release');
const bundle = fs.readdirSync(release).find((f) => /^speedscope-.*\.js$/.test(f));
if (!bundle) usage(`no speedscope-*.js in ${release}`);
const src = fs.readFileSync(path.join(release, bundle), 'utf8');
// The importer of dropped files: name(), then the bytes, then the text.
const importer = /async function ([\w$]+)\(t\)\{let e=await t\.name\(\),n=await t\.readAsArrayBuffer\(\)/.exec(src);
const start = src.lastIndexOf('console.log(`speedscope v');
if (!importer || start < 0) usage(`${bundle}: not the speedscope bundle this script knows (written for 1.25)`);
const loaded = src.slice(0, start) + `__hand_out(${importer[1]});})();`;

// What the bundle touches while loading: browser globals, as inert stand-ins.
const inert = new Proxy(function () {}, {
  get: (t, k) => (k === Symbol.toPrimitive ? () => '' : inert),
  apply: () => inert,
  construct: () => inert,
});
const sandbox = {
  console: { log() {}, warn() {}, error: console.error, info() {} },
  setTimeout, clearTimeout, TextDecoder, TextEncoder, URL, WebAssembly,
  window: inert, document: inert, navigator: inert, location: inert, localStorage: inert, matchMedia: inert,
  fetch: inert, requestAnimationFrame: () => 0, addEventListener() {},
};
sandbox.globalThis = sandbox;
sandbox.self = sandbox;
let importFile = null;
sandbox.__hand_out = (f) => { importFile = f; };
vm.createContext(sandbox);
vm.runInContext(loaded, sandbox, { filename: bundle });
if (!importFile) usage('the importer was not handed out');

let failed = false;
for (const file of files) {
  const text = fs.readFileSync(file, 'utf8');
  const messages = [];
  sandbox.console.log = (m) => messages.push(String(m));
  let group = null;
  try {
    group = await importFile({
      name: async () => path.basename(file),
      readAsArrayBuffer: async () => new ArrayBuffer(0),
      readAsText: async () => ({ splitLines: () => text.split('\n'), firstChunk: () => text, parseAsJSON: () => JSON.parse(text) }),
    });
  } catch (e) {
    console.error(`check-speedscope: ${file}: ${e}`);
  }
  if (!group || !group.profiles || group.profiles.length === 0) {
    console.error(`check-speedscope: ${file}: speedscope imported nothing`);
    failed = true;
    continue;
  }
  const profiles = group.profiles.map((p) => {
    const frames = new Map();
    p.forEachFrame((f) => frames.set(f, { name: f.name, file: f.file ?? null, line: f.line ?? null, self: f.getSelfWeight(), total: f.getTotalWeight() }));
    return {
      name: p.getName(), unit: p.getWeightUnit(), total: p.getTotalWeight(),
      formatted: p.formatValue(p.getTotalWeight()), frames: [...frames.values()],
    };
  });
  console.log(JSON.stringify({ file, imported_as: messages.find((m) => m.startsWith('Importing as')) ?? null, profiles }));
}
process.exit(failed ? 1 : 0);
