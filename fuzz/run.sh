#!/usr/bin/env bash
# run.sh — run the libFuzzer harnesses built by fuzz/build.sh.
#
#   fuzz/run.sh [SECONDS] [NAME...]     # default: 60 s each; safetensors st_index config group tokenizer
#   LS_FUZZ_JOBS=2 fuzz/run.sh 600      # two fuzzers at a time (one per core)
#
# Everything written goes under $LS_FUZZ_DIR (default /tmp/ls-fuzz), outside the tree:
#   corpus/<name>/     the growing corpus (the seeds in fuzz/corpus/<name>/ are read, never written)
#   artifacts/<name>/  crash-*, leak-*, timeout-*, oom-* inputs
#   logs/<name>.log    libFuzzer's output; the summary below is taken from its last lines
# The harnesses' TMPDIR (st_index writes its index file there on every input) is
# $LS_FUZZ_TMP, default /dev/shm/ls-fuzz-tmp: on ext4 /tmp, rewriting a file costs a
# flush (auto_da_alloc) and st_index ran 50x slower.
# Reproduce a finding:  $LS_FUZZ_DIR/bin/fuzz_<name> <artifact file>
# Exit status: 1 when any fuzzer left an artifact or stopped early, else 0.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DIR=${LS_FUZZ_DIR:-/tmp/ls-fuzz}
SECS=${1:-60}
shift || true
NAMES=("$@")
[ ${#NAMES[@]} -eq 0 ] && NAMES=(safetensors st_index config group tokenizer)
JOBS=${LS_FUZZ_JOBS:-1}
TMP=${LS_FUZZ_TMP:-/dev/shm/ls-fuzz-tmp}
[ -n "${LS_FUZZ_TMP:-}" ] || [ -w /dev/shm ] || TMP=$DIR/tmp
case "$SECS" in ''|*[!0-9]*) echo "run.sh: SECONDS must be a positive integer, got '$SECS'" >&2; exit 2 ;; esac

max_len() {
    case "$1" in
    safetensors) echo 65536 ;; # the largest seed is a 46 KB fixture shard
    *) echo 8192 ;;
    esac
}

run_one() {
    local n=$1 bin="$DIR/bin/fuzz_$1"
    [ -x "$bin" ] || { echo "run.sh: $bin not built (run fuzz/build.sh)" >&2; return 1; }
    mkdir -p "$DIR/corpus/$n" "$DIR/artifacts/$n" "$DIR/logs" "$TMP"
    TMPDIR="$TMP" UBSAN_OPTIONS=print_stacktrace=1 \
    "$bin" -max_total_time="$SECS" -max_len="$(max_len "$n")" -timeout=10 -rss_limit_mb=2048 \
        -dict="$ROOT/fuzz/dict/$n.dict" -print_final_stats=1 \
        -artifact_prefix="$DIR/artifacts/$n/" \
        "$DIR/corpus/$n" "$ROOT/fuzz/corpus/$n" >"$DIR/logs/$n.log" 2>&1
    echo $? >"$DIR/logs/$n.rc"
}

echo "fuzzing ${NAMES[*]} for $SECS s each, $JOBS at a time; output in $DIR"
running=0
for n in "${NAMES[@]}"; do
    run_one "$n" &
    running=$((running + 1))
    if [ "$running" -ge "$JOBS" ]; then
        wait -n
        running=$((running - 1))
    fi
done
wait

status=0
printf '%-12s %4s %12s %8s %7s %8s %16s %10s\n' fuzzer rc execs exec/s cov ft corpus artifacts
for n in "${NAMES[@]}"; do
    log="$DIR/logs/$n.log"
    rc=$(cat "$DIR/logs/$n.rc" 2>/dev/null || echo '?')
    last=$(grep -E '^#[0-9]+' "$log" 2>/dev/null | tail -1)
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
    ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
    corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$last")
    arts=$(find "$DIR/artifacts/$n" -type f 2>/dev/null | wc -l)
    printf '%-12s %4s %12s %8s %7s %8s %16s %10s\n' "$n" "$rc" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" \
        "${corp:-?}" "$arts"
    [ "$rc" = 0 ] && [ "$arts" -eq 0 ] || status=1
done
[ $status -eq 0 ] || echo "run.sh: findings or failures: see $DIR/logs and $DIR/artifacts" >&2
exit $status
