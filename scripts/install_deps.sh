#!/usr/bin/env bash
# Installs the Debian packages Kestrel needs to build and test, only those missing.
# Runs as root (CI, dev machines) or through sudo when available.
set -euo pipefail
PKGS=(cmake ninja-build ccache g++ pkg-config
      libgtest-dev libgmock-dev libbenchmark-dev
      libopenblas-dev libopenblas0-openmp libblis-dev libdnnl2 libdnnl-dev
      libopenmpi-dev openmpi-bin
      libicu-dev libxxhash-dev nlohmann-json3-dev libyaml-cpp-dev libomp-dev
      libsnappy-dev libzstd-dev zlib1g-dev
      # the fuzz preset only (fuzz/, tests/scripts/fuzz_smoke.sh): clang and its libFuzzer/sanitizer runtimes
      clang libclang-rt-14-dev
      # tests/scripts/run_report.sh renders the HTML run report in headless Chromium
      chromium-headless-shell fonts-dejavu-core)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "install_deps: installing ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install_deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  SUDO=sudo
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
