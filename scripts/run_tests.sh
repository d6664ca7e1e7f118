#!/usr/bin/env bash
# Runs every test of a build folder through CTest. OpenMPI refuses to run as
# root and to oversubscribe 2 cores unless told; the MPI tests need both.
set -euo pipefail
BUILD=${1:-build/dev}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
cd "$BUILD"
ctest --output-on-failure -j 2 --timeout 900
