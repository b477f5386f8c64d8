#!/bin/sh
# bench/llama/compare.sh — LongStraw's prompt capture beside llama.cpp's prefill on the same
# model and machine (issue 22: the hybrid's capture should be >= 2.5x llama.cpp at 4K, 3x at 16K).
#
#   bench/llama/compare.sh LLAMA_DIR [--prompts 4096,16384] [--threads 2] [--rounds 3]
#                          [--dtype bf16|f32] [--llama-configs 256:0,512:0,512:1] [--work DIR]
#
# LLAMA_DIR: a llama.cpp checkout built for the CPU (cmake -B build && cmake --build build
# --target llama-bench llama), with build/bin/llama-bench and build/bin/libllama.so.
# Steps, in a fresh work directory (removed at the end unless --work names one):
#   1. `longstraw init` writes the benchmark's small hybrid (bench/capture --print-config,
#      seed 1, stored as --dtype); bench/llama/to_gguf.py writes it as GGUF (same dtype);
#   2. the same model: log-probs of 600 random tokens (300 of prompt, 300 of response) from
#      `longstraw logprobs` and from llama.cpp (bench/llama/logprobs.c, compiled here against
#      LLAMA_DIR) on an f32 GGUF of the checkpoint are compared; the run stops if they differ
#      by more than 1e-3 anywhere (a scrambled head order moves them by O(1); f32 gives ~4e-5);
#   3. per round and prompt length, LongStraw's capture (bench/capture --model) and llama.cpp's
#      prefill (llama-bench -p P -n 0 -b P, on the GGUF in --dtype) under each of
#      --llama-configs (UBATCH:FLASH_ATTN) run one after the other; LongStraw's best round
#      against llama.cpp's best round and config.
# Prints a markdown table (tokens/s and the ratio) on stdout.
set -eu
usage() { sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
[ $# -ge 1 ] || { usage >&2; exit 2; }
case "$1" in -h|--help) usage; exit 0 ;; esac
LLAMA=$(cd "$1" && pwd); shift
PROMPTS=4096,16384 THREADS=2 ROUNDS=3 DTYPE=bf16 CONFIGS=256:0,512:0,512:1 WORK=
while [ $# -gt 0 ]; do
    case "$1" in
    --prompts) PROMPTS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --dtype) DTYPE=$2; shift 2 ;;
    --llama-configs) CONFIGS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compare.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LS=$ROOT/build/longstraw CAP=$ROOT/build/bench/capture
BENCH=$LLAMA/build/bin/llama-bench
for f in "$LS" "$CAP"; do [ -x "$f" ] || { echo "compare.sh: $f missing: build LongStraw first" >&2; exit 1; }; done
[ -x "$BENCH" ] || { echo "compare.sh: $BENCH missing: build llama.cpp's llama-bench" >&2; exit 1; }
LIB=$(dirname "$(find "$LLAMA/build" -name 'libllama.so' | head -1)")
[ -n "$LIB" ] || { echo "compare.sh: no libllama.so under $LLAMA/build" >&2; exit 1; }
if [ -z "$WORK" ]; then WORK=$(mktemp -d /tmp/ls_llama_XXXXXX); trap 'rm -rf "$WORK"' EXIT; else mkdir -p "$WORK"; fi

"$CAP" --print-config > "$WORK/config.json"
"$LS" init --config "$WORK/config.json" --seed 1 --out "$WORK/model" --dtype "$DTYPE" >/dev/null
/usr/bin/python3 "$ROOT/bench/llama/to_gguf.py" "$WORK/model" "$WORK/model.gguf" --dtype "$DTYPE" >/dev/null
/usr/bin/python3 "$ROOT/bench/llama/to_gguf.py" "$WORK/model" "$WORK/check.gguf" --dtype f32 >/dev/null

# 2. the same model
cc -O2 -o "$WORK/logprobs" "$ROOT/bench/llama/logprobs.c" -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
    -L"$LIB" -lllama -lm -Wl,-rpath,"$LIB"
/usr/bin/python3 - "$WORK" <<'PY'
import json, random, sys
w = sys.argv[1]
random.seed(7)
ids = [random.randrange(3, 4096) for _ in range(600)]
json.dump({"prompt": ids[:300], "responses": [ids[300:]]}, open(w + "/group.json", "w"))
open(w + "/ids.txt", "w").write(" ".join(map(str, ids)))
PY
"$LS" logprobs --model "$WORK/model" --group "$WORK/group.json" --threads "$THREADS" > "$WORK/ls.json"
"$WORK/logprobs" "$WORK/check.gguf" 300 "$THREADS" < "$WORK/ids.txt" > "$WORK/llama.txt"
/usr/bin/python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
a = json.load(open(w + "/ls.json"))["logprobs"][0]
b = [float(x) for x in open(w + "/llama.txt")]
assert len(a) == len(b), (len(a), len(b))
d = [abs(x - y) for x, y in zip(a, b)]
ma = sum(a) / len(a)
spread = max(abs(x - ma) for x in a)
print("same model: %d log-probs, max |LongStraw - llama.cpp| = %.2e, mean %.2e (log-probs spread %.3f around %.3f)"
      % (len(d), max(d), sum(d) / len(d), spread, ma))
if not (max(d) <= 1e-3):
    sys.exit("compare.sh: llama.cpp's log-probs differ from LongStraw's: not the same model")
PY

# 3. timing, interleaved
echo "| P | LongStraw capture tokens/s | llama.cpp prefill tokens/s (best of $CONFIGS, $DTYPE) | ratio |"
echo "|---|---|---|---|"
for P in $(echo "$PROMPTS" | tr , ' '); do
    best_ls=0 best_ll=0 best_cfg=
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        t=$("$CAP" --model "$WORK/model" --prompts $((P + 1)) --threads "$THREADS" --print-tps)
        best_ls=$(echo "$t $best_ls" | awk '{print ($1 > $2) ? $1 : $2}')
        for c in $(echo "$CONFIGS" | tr , ' '); do
            t=$("$BENCH" -m "$WORK/model.gguf" -p "$P" -n 0 -t "$THREADS" -b "$P" -ub "${c%%:*}" -fa "${c##*:}" -r 1 \
                -o csv 2>/dev/null | awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) { gsub(/"/, "", $i); if ($i == "avg_ts") k = i } }
                                              NR == 2 { gsub(/"/, "", $k); print $k }')
            [ -n "$t" ] || { echo "compare.sh: llama-bench -p $P -ub ${c%%:*} -fa ${c##*:} failed" >&2; exit 1; }
            echo "round $((r + 1)) P $P: llama.cpp -ub ${c%%:*} -fa ${c##*:}: $t tokens/s" >&2
            if awk "BEGIN { exit !($t > $best_ll) }"; then best_ll=$t best_cfg=$c; fi
        done
        echo "round $((r + 1)) P $P: LongStraw best so far $best_ls tokens/s" >&2
        r=$((r + 1))
    done
    echo "$P $best_ls $best_ll $best_cfg" | awk '{printf "| %d | %.0f | %.0f (-ub:-fa %s) | %.2f |\n", $1, $2, $3, $4, $2 / $3}'
done
