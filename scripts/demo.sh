#!/usr/bin/env bash
# The main job on an embedded default: install what the build needs, build LongStraw,
# and run `longstraw demo` — a small random hybrid model (3 Gated DeltaNet layers + 1
# gated attention layer) trained with GRPO: 16 updates, each capturing a 16K-token
# passkey prompt once, sampling G = 8 responses from the captured state, scoring and
# replaying them; it ends with the receipt table and the paths of the trace, metrics
# and memory picture.     scripts/demo.sh [longstraw demo flags, e.g. --prompt-len 65536]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j "$(nproc)" >/dev/null
exec build/longstraw demo --out "${LS_DEMO_DIR:-/tmp/longstraw-demo}" "$@"
