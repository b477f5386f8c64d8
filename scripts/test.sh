#!/usr/bin/env bash
# Install dependencies, build, and run the whole test suite (CTest).
#   scripts/test.sh                 Release build in build/
#   LS_SANITIZE=ON scripts/test.sh  AddressSanitizer + UBSan build in build-asan/
#   LS_WERROR=ON                    warnings are errors (CI)
#   LS_MPI=AUTO|ON|OFF              MPI communicator (default AUTO: when found);
#                                   OFF builds the one-rank build in build-nompi/
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
san=${LS_SANITIZE:-OFF}
mpi=${LS_MPI:-AUTO}
dir=build
[ "$san" = ON ] && dir=build-asan
[ "$mpi" = OFF ] && dir=build-nompi
# OpenMPI in a container as root (the MPI tests set these too; exported here so
# anything ctest starts sees them): mpirun refuses root without the first two, the
# shared-memory single-copy path (CMA) needs ptrace rights a container may lack,
# and CI may have fewer cores than a test has ranks.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_rmaps_base_oversubscribe=1
cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DLS_SANITIZE="$san" -DLS_WERROR="${LS_WERROR:-OFF}" \
  -DLS_MPI="$mpi" >/dev/null
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j 1 ${CTEST_ARGS:-}
