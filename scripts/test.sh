#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (CTest).
#   scripts/test.sh                 Release build in build/
#   LS_SANITIZE=ON scripts/test.sh  AddressSanitizer + UBSan build in build-asan/
#   LS_WERROR=ON                    warnings are errors (CI)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
san=${LS_SANITIZE:-OFF}
dir=build
[ "$san" = ON ] && dir=build-asan
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLS_SANITIZE="$san" -DLS_WERROR="${LS_WERROR:-OFF}" >/dev/null
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j 1 ${CTEST_ARGS:-}
