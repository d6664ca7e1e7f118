# The device machine's environment for the bundle (scripts/device_bundle.sh),
# sourced by device_check.sh and device_cpu_targets.sh with B set to the
# bundle folder: OpenBLAS where the CPU backend looks for it, the bundle's
# binaries and libraries unpacked to $U, LD_LIBRARY_PATH for them (and the
# CUDA libraries of the image's PyTorch wheel), and PY: python3 with the
# image's own library path, for the peers.
# OpenBLAS where the CPU backend looks for it (a fixed Debian path); the other libraries by LD_LIBRARY_PATH.
OB=/usr/lib/x86_64-linux-gnu/openblas-openmp
if [[ ! -f $OB/libopenblas.so.0 ]]; then mkdir -p "$OB" && xz -dc "$B/lib/libopenblas.so.0.xz" > "$OB/libopenblas.so.0"; fi
# The bundle's binaries and libraries travel xz-compressed (scripts/device_bundle.sh);
# they are unpacked outside the carried folder, which the next call carries again.
U=${TMPDIR:-/tmp}/kestrel_device_bundle
mkdir -p "$U/bin" "$U/lib"
for z in "$B"/bin/*.xz "$B"/lib/*.xz; do
  case $z in */libopenblas.so.0.xz) continue ;; esac
  d=$U/${z#"$B"/}
  d=${d%.xz}
  [[ -f $d ]] || xz -dc "$z" > "$d"
  [[ $z == "$B"/bin/* ]] && chmod +x "$d"
done
# The tests read the goldens of the carried source tree (the repository root the device tool runs in).
export KESTREL_SOURCE_DIR=${KESTREL_SOURCE_DIR:-$(pwd)}
CUDA_LIBS=$(python3 - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for s in site.getsitepackages():
    dirs += glob.glob(os.path.join(s, "nvidia", "*", "lib"))
print(":".join(dirs))
PY
)
# PyTorch keeps the image's own library path: the bundle's libstdc++ (GCC 12)
# is older than the one the image's torch needs.
PY_LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}
PY=(env "LD_LIBRARY_PATH=$PY_LD_LIBRARY_PATH" python3)
export LD_LIBRARY_PATH="$U/lib:/usr/local/cuda/lib64:${CUDA_LIBS}:${LD_LIBRARY_PATH:-}"
