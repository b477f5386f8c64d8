#!/usr/bin/env bash
# Reproduce assets/demo-sft.tar.xz, the checkpoint `longstraw demo` starts GRPO from (it
# is embedded in the binary when present): the recipe's SFT stages on the passkey task
# (scripts/recipe.sh, docs/recipe.md) on examples/recipe/hybrid.json, then the weights
# rounded to bfloat16 (2 MiB; norm weights, A_log and dt_bias stay float32), packed with
# config.json in a deterministic tar, xz -9e (1.5 MiB).
#   1. init, seed 1
#   2. SFT at 256-token prompts: 1000 updates of 8 prompts, lr 2e-3, --mode full
#   3. SFT at 1024-token prompts: 5 updates of 8 prompts, lr 1e-3, --mode full
# One thread, so that the result is the committed file bit for bit (other thread counts
# sum in another order: an equivalent checkpoint, not the same bytes). About 10 minutes
# on one core.       scripts/make-demo-sft.sh [WORKDIR (default demo-sft-work)]
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-demo-sft-work}
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
LS=build/longstraw
rm -rf "$W"
mkdir -p "$W/asset" assets
set -x
$LS init --config examples/recipe/hybrid.json --seed 1 --out "$W/init"
$LS train --model "$W/init" --out "$W/sft1" --loss sft --task passkey --prompt-len 256 --mode full \
  --groups-per-update 8 --updates 1000 --lr 2e-3 --seed 0 --save-every 1000 --threads 1 --quiet
$LS train --model "$W/sft1/checkpoint-1000" --out "$W/sft2" --loss sft --task passkey --prompt-len 1024 --mode full \
  --groups-per-update 8 --updates 5 --lr 1e-3 --seed 2 --save-every 5 --threads 1 --quiet
python3 tools/st_to_bf16.py "$W/sft2/checkpoint-5/model.safetensors" "$W/asset/model.safetensors"
cp "$W/sft2/checkpoint-5/config.json" "$W/asset/config.json"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --mode=0644 -C "$W/asset" -cf - \
  config.json model.safetensors | xz -9e -T1 > assets/demo-sft.tar.xz
set +x
sha256sum "$W/asset/model.safetensors" assets/demo-sft.tar.xz
echo "assets/demo-sft.tar.xz written; configure again (cmake -S . -B build) to embed it in longstraw"
