#!/usr/bin/env bash
# coverage.sh — line/region coverage of the readers reached by a corpus.
#
#   fuzz/coverage.sh [NAME...]    # default: safetensors st_index config group tokenizer
#
# Builds each harness with clang source-based coverage (no sanitizers) into
# $LS_FUZZ_DIR/cov, replays the seeds and the corpus grown by run.sh
# ($LS_FUZZ_DIR/corpus/<name>) once (-runs=0), and prints llvm-cov's per-file report
# for the reader's sources. HTML: $LS_FUZZ_DIR/cov/<name>/index.html.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${LS_FUZZ_DIR:-/tmp/ls-fuzz}
COV=$DIR/cov
CC=${CC:-clang-14}
mkdir -p "$COV"
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(safetensors st_index config group tokenizer)

CFLAGS=(-std=gnu11 -g -O0 -fsanitize=fuzzer -fprofile-instr-generate -fcoverage-mapping
        -Wno-unknown-pragmas -I"$ROOT/include" -I/usr/include/x86_64-linux-gnu/openblas-openmp)
LIBS=(-L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lcjson -lm)
CORE=("$ROOT/src/core/status.c" "$ROOT/src/core/util.c" "$ROOT/src/core/arena.c")

for n in "${NAMES[@]}"; do
    case "$n" in
    safetensors | st_index) srcs=("$ROOT/src/io/safetensors.c") ;;
    config) srcs=("$ROOT/src/io/config.c") ;;
    group) srcs=("$ROOT/src/io/group.c" "$ROOT/src/io/config.c" "$ROOT/src/io/tokenizer.c" "$ROOT/src/io/tokenizer_unicode.c") ;;
    tokenizer) srcs=("$ROOT/src/io/tokenizer.c" "$ROOT/src/io/tokenizer_unicode.c" "$ROOT/src/io/config.c") ;;
    *) echo "coverage.sh: unknown harness '$n'" >&2; exit 2 ;;
    esac
    bin=$COV/fuzz_$n
    "$CC" "${CFLAGS[@]}" -o "$bin" "$ROOT/fuzz/fuzz_$n.c" "${CORE[@]}" "${srcs[@]}" "${LIBS[@]}"
    rm -f "$COV/$n".profraw*
    dirs=("$ROOT/fuzz/corpus/$n")
    [ -d "$DIR/corpus/$n" ] && dirs+=("$DIR/corpus/$n")
    LLVM_PROFILE_FILE="$COV/$n.profraw" "$bin" -runs=0 "${dirs[@]}" >"$COV/$n.log" 2>&1 || true
    llvm-profdata-14 merge -sparse "$COV/$n.profraw" -o "$COV/$n.profdata"
    case "$n" in
    group) show=("$ROOT/src/io/group.c") ;;
    tokenizer) show=("$ROOT/src/io/tokenizer.c" "$ROOT/src/io/tokenizer_unicode.c") ;;
    *) show=("${srcs[@]}") ;;
    esac
    echo "== $n ($(ls "${dirs[@]}" | wc -l) inputs)"
    llvm-cov-14 report "$bin" -instr-profile="$COV/$n.profdata" "${show[@]}" | sed "s|$ROOT/||"
    llvm-cov-14 show "$bin" -instr-profile="$COV/$n.profdata" -format=html -output-dir="$COV/$n" "${show[@]}" \
        >/dev/null
done
