#!/usr/bin/env bash
# build.sh — build the libFuzzer harnesses (fuzz/fuzz_*.c) with clang-14,
# AddressSanitizer and UndefinedBehaviorSanitizer (UB aborts: -fno-sanitize-recover).
#
#   fuzz/build.sh [NAME...]        # default: safetensors st_index config group tokenizer
#
# Binaries go to $LS_FUZZ_DIR/bin (default /tmp/ls-fuzz/bin), outside the tree.
# Each harness is linked with only the library sources it needs (src/core + the
# reader); OpenMP pragmas are compiled out (no -fopenmp), cJSON and OpenBLAS come
# from Debian (cJSON is not instrumented: coverage is of LongStraw's code).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${LS_FUZZ_DIR:-/tmp/ls-fuzz}/bin
CC=${CC:-clang-14}
mkdir -p "$OUT"

CFLAGS=(-std=gnu11 -g -O1 -fno-omit-frame-pointer
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
        -Wall -Wextra -Wno-unused-parameter -Wno-unknown-pragmas
        -I"$ROOT/include" -I/usr/include/x86_64-linux-gnu/openblas-openmp)
LIBS=(-L/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas -lcjson -lm)
CORE=("$ROOT/src/core/status.c" "$ROOT/src/core/util.c" "$ROOT/src/core/arena.c")

sources_for() {
    case "$1" in
    safetensors | st_index) echo "$ROOT/src/io/safetensors.c" ;;
    config) echo "$ROOT/src/io/config.c" ;;
    group) echo "$ROOT/src/io/group.c $ROOT/src/io/config.c $ROOT/src/io/tokenizer.c $ROOT/src/io/tokenizer_unicode.c" ;; # ls_read_file lives in config.c
    tokenizer) echo "$ROOT/src/io/tokenizer.c $ROOT/src/io/tokenizer_unicode.c $ROOT/src/io/config.c" ;;
    *) echo "build.sh: unknown harness '$1'" >&2; return 1 ;;
    esac
}

NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(safetensors st_index config group tokenizer)
"$CC" --version | head -1
for n in "${NAMES[@]}"; do
    srcs=$(sources_for "$n")
    # shellcheck disable=SC2086
    "$CC" "${CFLAGS[@]}" -o "$OUT/fuzz_$n" "$ROOT/fuzz/fuzz_$n.c" "${CORE[@]}" $srcs "${LIBS[@]}"
    echo "built $OUT/fuzz_$n"
done
