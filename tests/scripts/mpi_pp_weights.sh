#!/usr/bin/env bash
# The whole model from pipeline stages (pp > 1): the rollout's weight copy
# (tests/mpi/pp_weights_test.cpp: bit-identical to one process's copy for
# rollout tp 1, 2 and the world, f32 and bf16; refresh after a step; greedy
# generation equal to the whole model's) and the HF export
# (tests/mpi/pp_save_test.cpp: byte-identical folders to CausalLM::save of the
# whole model, sharded folders to io::save_weights_dir's). 2 ranks: PP2 and
# PP2 interleaved; 4 ranks: PP2xTP2, PP4 and PP2xTP2 interleaved.
# usage: bash tests/scripts/mpi_pp_weights.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
BIN="$BUILD/mpi_tests"
if [[ ! -x "$BIN" ]]; then
  if grep -q '^KESTREL_MPI:BOOL=OFF' "$BUILD/CMakeCache.txt" 2>/dev/null; then
    echo "mpi_pp_weights: skipped, built without MPI (-DKESTREL_MPI=OFF)"
    exit 0
  fi
  echo "mpi_pp_weights: $BIN not found; build the mpi_tests target" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1
FILTER='PpWeights*:PpSave*'
for np in 2 4; do
  echo "== mpirun -np $np mpi_tests --gtest_filter=$FILTER"
  if ! timeout -k 5 300 mpirun -np "$np" --oversubscribe --bind-to none "$BIN" --gtest_filter="$FILTER" --gtest_color=no; then
    echo "mpi_pp_weights: FAILED with $np ranks" >&2
    exit 1
  fi
done
echo "mpi_pp_weights: passed with 2 and 4 ranks"
