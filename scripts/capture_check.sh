#!/usr/bin/env bash
# Capture checked by hand (before `longstraw demo`): build, write a small random hybrid
# model (examples/small_hybrid.json), capture a long prompt once, continue four
# responses from the captured state, check them against the plain forward, run one
# GRPO update as a transaction (capture → score → replay → AdamW) and print its
# receipt, and print the prompt-state plan.   scripts/capture_check.sh [PROMPT_LEN]   (default 16384)
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-16384}
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
out=${LS_DEMO_DIR:-/tmp/longstraw-capture-check}
mkdir -p "$out"
build/longstraw init --config examples/small_hybrid.json --seed 1 --out "$out/model"
# A group: one P-token prompt, four responses of 64..256 tokens (deterministic ids).
awk -v P="$P" 'BEGIN { srand(7); printf "{\"prompt\": ["; for (i = 0; i < P; i++) printf "%s%d", (i ? ", " : ""), int(rand() * 4096);
  printf "], \"responses\": ["; for (g = 0; g < 4; g++) { printf "%s[", (g ? ", " : ""); n = 64 * (g + 1);
  for (i = 0; i < n; i++) printf "%s%d", (i ? ", " : ""), int(rand() * 4096); printf "]" }
  printf "], \"rewards\": [1, 0, 0.5, 0.25]}\n" }' > "$out/group.json"
echo "== capture once + continue 4 responses (P = $P)"
build/longstraw logprobs --model "$out/model" --group "$out/group.json" --stats > "$out/capture.json"
echo "== the same group with bf16 prompt pages"
build/longstraw logprobs --model "$out/model" --group "$out/group.json" --state-dtype bf16 --stats > "$out/capture_bf16.json"
echo "== reference: one plain forward over prompt + response per member"
build/longstraw logprobs --model "$out/model" --group "$out/group.json" --no-capture --stats > "$out/plain.json"
awk 'function load(f, a,   s, n, i, t) { getline s < f; gsub(/[\[\]{}"a-z:]/, "", s); n = split(s, t, ","); for (i = 1; i <= n; i++) a[i] = t[i] + 0; return n }
  BEGIN { n = load(ARGV[1], c); load(ARGV[2], b); load(ARGV[3], p); mc = 0; mb = 0
    for (i = 1; i <= n; i++) { d = c[i] - p[i]; if (d < 0) d = -d; if (d > mc) mc = d; d = b[i] - p[i]; if (d < 0) d = -d; if (d > mb) mb = d }
    printf "== %d response tokens: max |capture - plain| = %.2e (f32 pages), %.2e (bf16 pages)\n", n, mc, mb; exit }' \
  "$out/capture.json" "$out/capture_bf16.json" "$out/plain.json"
echo "== one GRPO update: capture once, score, replay each member under its own tape, AdamW"
build/longstraw step --model "$out/model" --group "$out/group.json" --state-dtype bf16 --lr 1e-5 --out "$out/step"
cat "$out/step/receipt.json"
echo "== prompt-state plan for this prompt, and for Qwen3.5-27B at 2M tokens on 8 CP ranks"
build/longstraw plan --model "$out/model" --prompt "$P" --state-dtype f32
build/longstraw plan --config examples/qwen3_5_27b.json --prompt 2088960 --cp 8
echo "outputs in $out"
