#!/usr/bin/env bash
# The recipe that teaches a random model a long-context skill (docs/recipe.md):
#   1. init     a small random model (examples/recipe/hybrid.json, or mla.json)
#   2. sft      supervised fine-tuning on the task's answers at short prompts, exact
#               gradient through the prompt (--mode full): the SFT_STAGES in turn
#   3. eval     held-out exact match of the SFT model at the long length
#   4. grpo     GRPO with rollouts and the exact-match reward at the long length
#   5. eval     held-out exact match after GRPO; pictures
#
#   scripts/recipe.sh [--task passkey|multikey|vartrack] [--family hybrid|mla] [--out DIR]
#                     [--np N] [--threads N] [--long N] [--skip-build]
# Every stage is a `longstraw` command printed before it runs; a stage whose output
# exists is skipped (rerun with the same --out to continue after an interruption).
# --np N runs every training and eval command under `mpirun -np N` (context
# parallelism; the same updates up to float rounding).
set -euo pipefail
cd "$(dirname "$0")/.."

TASK=passkey FAMILY=hybrid OUT=recipe-out NP=1 THREADS=${THREADS:-} LONG=16384 BUILD=1 SEED=1
while [ $# -gt 0 ]; do
  case "$1" in
    --task) TASK=$2; shift 2 ;;
    --family) FAMILY=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --np) NP=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --long) LONG=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --skip-build) BUILD=0; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "recipe.sh: unknown argument $1 (--help)" >&2; exit 2 ;;
  esac
done

# The recipe's numbers (docs/recipe.md says how they were found and what did not work).
# passkey and multikey: as measured (docs/recipe.md); vartrack: these stages teach it at
# 512 tokens (0.875) but this model does not carry it to 16K (docs/recipe.md).
# SFT stages as TASK:PROMPT_LEN:UPDATES:LR; multikey and vartrack start from the
# passkey's first stage (the copy it teaches is what they build on).
case "$TASK" in
  passkey) d_stages="passkey:256:1000:2e-3 passkey:1024:5:1e-3" d_lr=5e-4 ;;
  multikey) d_stages="passkey:256:1000:2e-3 multikey:512:600:2e-3 multikey:512:1000:1e-3 multikey:1024:10:1e-3" d_lr=1e-3 ;;
  vartrack) d_stages="passkey:256:1000:2e-3 vartrack:512:900:2e-3 vartrack:512:400:1e-3 vartrack:1024:100:1e-3 vartrack:2048:100:1e-3" d_lr=1e-3 ;;
  *) echo "recipe.sh: --task $TASK: expected passkey, multikey or vartrack" >&2; exit 2 ;;
esac
# The MLA family (examples/recipe/mla.json: dense FFN layers; the MoE layout did not start
# copying in 2400 updates): stage 1 at lr 1e-3 copies at 256 tokens, but 130 updates at
# 1024 did not carry it to 1024 or 16K yet (docs/recipe.md).
[ "$FAMILY" = mla ] && [ "$TASK" = passkey ] && d_stages="passkey:256:1000:1e-3 passkey:1024:130:1e-3"
SFT_STAGES=${SFT_STAGES:-$d_stages}
SFT_GROUPS=${SFT_GROUPS:-8}             # prompts per SFT update
GRPO_UPDATES=${GRPO_UPDATES:-40}
GRPO_GROUPS=${GRPO_GROUPS:-2}           # prompts per GRPO update
GRPO_LR=${GRPO_LR:-$d_lr}
GRPO_G=${GRPO_G:-8}
EVAL_PROMPTS=${EVAL_PROMPTS:-32}
MAXNEW=8; [ "$TASK" = vartrack ] && MAXNEW=16   # the answer and its period fit

CONFIG=examples/recipe/$FAMILY.json
[ -f "$CONFIG" ] || { echo "recipe.sh: --family $FAMILY: no $CONFIG (hybrid or mla)" >&2; exit 2; }

if [ "$BUILD" = 1 ]; then
  scripts/install-deps.sh
  cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build build -j "$(nproc)" >/dev/null
fi
LS=$PWD/build/longstraw
if [ "$NP" -gt 1 ]; then
  RUN=(mpirun --oversubscribe -np "$NP")
  [ "$(id -u)" = 0 ] && RUN+=(--allow-run-as-root)
  RUN+=("$LS")
  THREADS=${THREADS:-1}
else
  RUN=("$LS")
  THREADS=${THREADS:-$(nproc)}
fi
mkdir -p "$OUT"
say() { echo "+ $*" >&2; }
step() { say "${RUN[*]} $*"; "${RUN[@]}" "$@"; }

# 1. init
if [ ! -f "$OUT/init/model.safetensors" ]; then
  say "$LS init --config $CONFIG --seed $SEED --out $OUT/init"
  "$LS" init --config "$CONFIG" --seed "$SEED" --out "$OUT/init"
fi

# 2. SFT stages at short lengths
model=$OUT/init
i=0
for st in $SFT_STAGES; do
  IFS=: read -r t len ups lr <<<"$st"
  i=$((i + 1))
  run=$OUT/sft$i
  if [ ! -d "$run/checkpoint-$ups" ]; then
    rm -rf "$run"
    step train --model "$model" --out "$run" --loss sft --task "$t" --prompt-len "$len" --mode full \
      --groups-per-update "$SFT_GROUPS" --updates "$ups" --lr "$lr" --seed "$((i == 1 ? 0 : i))" \
      --eval-prompts 16 --eval-every 100 --save-every "$ups" --threads "$THREADS" --quiet
  fi
  model=$run/checkpoint-$ups
done
SFT=$model

# 3. the SFT model at the long length (held-out prompts: their own seed, keys training never draws)
[ -f "$OUT/eval-sft.json" ] || step eval --model "$SFT" --task "$TASK" --prompt-len "$LONG" \
  --num-prompts "$EVAL_PROMPTS" --seed 1000 --threads "$THREADS" --quiet --out "$OUT/eval-sft.json" >/dev/null

# 4. GRPO at the long length
if [ ! -d "$OUT/grpo/checkpoint-$GRPO_UPDATES" ]; then
  rm -rf "$OUT/grpo"
  step train --model "$SFT" --out "$OUT/grpo" --rollout --task "$TASK" --prompt-len "$LONG" \
    --num-generations "$GRPO_G" --groups-per-update "$GRPO_GROUPS" --max-new-tokens "$MAXNEW" \
    --updates "$GRPO_UPDATES" --lr "$GRPO_LR" --seed "$SEED" --eval-prompts 12 --eval-every 10 --save-every 10 \
    --threads "$THREADS" --quiet
fi

# 5. after GRPO, and the pictures
[ -f "$OUT/eval-grpo.json" ] || step eval --model "$OUT/grpo/checkpoint-$GRPO_UPDATES" --task "$TASK" \
  --prompt-len "$LONG" --num-prompts "$EVAL_PROMPTS" --seed 1000 --threads "$THREADS" --quiet \
  --out "$OUT/eval-grpo.json" >/dev/null
"$LS" report "$OUT/grpo" >/dev/null
"$LS" report --eval "$OUT/eval-sft.json" >/dev/null
"$LS" report --eval "$OUT/eval-grpo.json" >/dev/null
python3 - "$OUT" "$TASK" "$LONG" <<'EOF' 2>/dev/null || grep -h '"exact_match"' "$OUT/eval-sft.json" "$OUT/eval-grpo.json" | head -2
import json, sys
out, task, long = sys.argv[1:4]
a = json.load(open(f"{out}/eval-sft.json")); b = json.load(open(f"{out}/eval-grpo.json"))
print(f"{task} at {long} tokens, {a['num_prompts']} held-out prompts: exact match after SFT {a['exact_match']:.3f}, "
      f"after GRPO {b['exact_match']:.3f} (+{b['exact_match'] - a['exact_match']:.3f})")
print(f"curves {out}/grpo/metrics.svg; by depth {out}/eval-sft.svg, {out}/eval-grpo.svg")
EOF
