#!/usr/bin/env bash
# The NCCL transport's tests (tests/nccl) under mpirun: collectives and point
# to point on device buffers against MPI, and training on the device under
# TP / TP+SP / DP with the distributed optimizer against the CPU. CTest runs
# it on the emulator (cuda-emu build, label nccl: the fake NCCL over MPI);
# on GPUs run it by hand from the cuda build, one GPU per rank:
#   bash tests/nccl/run.sh build/cuda/nccl_tests 2 ['<gtest filter>']
set -euo pipefail
BIN=${1:?usage: $0 <nccl_tests binary> [ranks] [gtest filter]}
NP=${2:-2}
FILTER=${3:-*}
source "$(dirname "$0")/../scripts/lib/mpi_env.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
# mpi_gtests checks that some test ran and every rank passed.
mpi_gtests nccl_tests "$NP" 600 "$FILTER" "$W/log"
grep -E '^\[  (PASSED|SKIPPED) ' "$W/log" || true
echo "nccl_tests: passed with $NP ranks"
