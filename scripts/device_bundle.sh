#!/usr/bin/env bash
# Builds what scripts/device_check.sh runs on a GPU machine and gathers it in
# device_bundle/ (ignored by git; name it in the device tool's `carry`):
# the cuda preset's test binaries and the kestrel binary (built without MPI
# in build/cuda-bundle: the image has no OpenMPI, so one process per GPU;
# multi-process runs load NCCL at run time), stripped, and the shared libraries they reach that the
# device image lacks (it has the CUDA runtime and cuBLAS, no Debian
# packages): libgomp, OpenBLAS (xz-compressed; the CPU side of the
# consistency harness and of the CPU-against-GPU runs) and its Fortran
# runtime, ICU (its data xz-compressed), yaml-cpp, snappy, zstd, xxhash and
# this machine's libstdc++, all xz-compressed; with them oneDNN (libdnnl2)
# and the release builds of the two CPU benchmarks for device_cpu_targets.sh,
# which measures issue 21's targets on the device's host CPU. About 30 MB,
# which with the source tree (about 18 MB) stays under the 64 MiB a device
# call carries.
#   bash scripts/device_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvcc >/dev/null || { echo "device_bundle: nvcc not found (the CUDA toolkit builds the cuda preset)" >&2; exit 1; }
cmake --preset cuda -B build/cuda-bundle -DKESTREL_MPI=OFF >/dev/null
cmake --build build/cuda-bundle -j "${JOBS:-2}" --target test_ops test_cuda test_on_device test_backend_cpu kestrel bench_cuda_ops \
  bench_train_step_bench bench_rollout_bench
# The CPU benchmarks of issue 21 (device_cpu_targets.sh, on the device's host
# CPU) from the release preset, as docs/benchmarks.md measures them.
cmake --preset release -B build/release-bundle -DKESTREL_MPI=OFF >/dev/null
cmake --build build/release-bundle -j "${JOBS:-2}" --target bench_train_step_bench bench_rollout_bench
rm -rf device_bundle
mkdir -p device_bundle/bin device_bundle/lib
# Stripped and xz-compressed (device_env.sh unpacks them): with the benchmarks
# the plain binaries and libraries would not fit the 64 MiB a call carries
# beside the source tree.
for t in test_ops test_cuda test_on_device test_backend_cpu kestrel bench_cuda_ops bench_train_step_bench bench_rollout_bench; do
  strip -o "device_bundle/bin/$t" "build/cuda-bundle/$t"
  xz -T2 -6 "device_bundle/bin/$t"
done
for t in bench_train_step_bench bench_rollout_bench; do
  strip -o "device_bundle/bin/release_$t" "build/release-bundle/$t"
  xz -T2 -6 "device_bundle/bin/release_$t"
done
L=/usr/lib/x86_64-linux-gnu
for f in libgomp.so.1 libgfortran.so.5 libquadmath.so.0 libicuuc.so.72 libicui18n.so.72 libicudata.so.72 libyaml-cpp.so.0.7 \
         libsnappy.so.1 libzstd.so.1 libxxhash.so.0 libstdc++.so.6 libdnnl.so.2; do
  xz -T2 -6 -c "$L/$f" > "device_bundle/lib/$f.xz"
done
xz -T2 -6 -c "$L/openblas-openmp/libopenblas.so.0" > device_bundle/lib/libopenblas.so.0.xz
cp scripts/device_check.sh scripts/device_env.sh scripts/device_cpu_targets.sh bench/peers/torch_cuda_ops.py \
  tests/cuda_emu/grpo_on_device.sh device_bundle/
git rev-parse --short HEAD > device_bundle/commit 2>/dev/null || echo unknown > device_bundle/commit
du -sh device_bundle
echo "device_bundle: ready; on the device: bash device_bundle/device_check.sh (carry device_bundle)"
