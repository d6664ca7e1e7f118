#!/usr/bin/env bash
# Hierarchical all-to-all-v and expert parallelism's token dispatcher under
# mpirun (tests/mpi/hier_a2a_test.cpp, ep_dispatch_test.cpp) with 2 and 4
# ranks: several "nodes" on this machine through comm::World::node_ids' test
# hook; the three-step exchange equals the flat all-to-all-v bit for bit and
# sends one inter-node message per node pair ("[hier a2a]" lines: the
# messages of each rank, flat against hierarchical); dispatch -> local
# experts -> combine equals every expert applied locally, over the flat and
# the hierarchical exchange, and combine is dispatch's adjoint; the MoE layer
# with its experts split over the ranks (tests/mpi/ep_model_test.cpp) gives
# one process's loss, log-probs and gradients (an expert's: summed over the
# ranks' tokens). The allgather dispatcher delivers and combines the
# all-to-all's bits (random routings, empty experts and ranks), every row
# comes back once, each dispatcher's bytes equal the closed forms ("[ep bytes]"
# lines: inter-node messages flat against hierarchical), and the EP model with
# the allgather dispatcher or the hierarchical exchange (two "nodes") gives
# the all-to-all's bits and trains 3 AdamW steps equal to one process.
# Checks that the tests ran.
# usage: bash tests/scripts/mpi_hier_a2a.sh <kestrel-binary> <build-dir>
set -euo pipefail
BUILD=${2:?usage: $0 <kestrel-binary> <build-dir>}
source "$(dirname "$0")/lib/mpi_env.sh"
mpi_env mpi_hier_a2a "$BUILD"
BIN="$BUILD/mpi_tests"
[[ -x "$BIN" ]] || { echo "mpi_hier_a2a: $BIN not found; build the mpi_tests target" >&2; exit 1; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
for np in 2 4; do
  mpi_gtests mpi_hier_a2a "$np" 300 'HierA2a.*:EpDispatch.*:EpModel.*:EpRollout.*' "$W/log$np.txt" \
    HierA2a.DeliversWhatTheFlatExchangeDelivers HierA2a.NodesComeFromMpiOrTheTestHook \
    EpDispatch.AllToAllEqualsLocalExpertsAndCombineIsTheAdjoint EpDispatch.ExpertsMustSplitOverTheGroup \
    EpModel.ExpertsOverTheGroupEqualOneProcess EpModel.SavingGathersEveryExpert \
    EpModel.TrainingEqualsOneProcess EpDispatch.AllGatherDeliversWhatAllToAllDelivers \
    EpDispatch.AllGatherRefusesTheHierarchicalExchange EpDispatch.BytesEqualTheFormulas \
    EpModel.AllGatherAndHierarchicalDispatchEqualOneProcess EpRollout.GreedyEqualsOneProcessWithIdleRanks
  grep '^\[hier a2a\]\|^\[ep bytes\]' "$W/log$np.txt" | sort
done
echo "mpi_hier_a2a: the hierarchical exchange equals the flat one with 2 and 4 ranks"
