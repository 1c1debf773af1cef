#!/usr/bin/env bash
# Installs every Debian package HAP needs to build, test and train (idempotent; run as root).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config
  clang-format                    # scripts/check-format (CI checks every source)
  libopenblas-openmp-dev          # CPU GEMM (OpenMP build, shares our thread pool)
  libdnnl-dev                     # CPU GEMM per instruction set (oneDNN: AVX2, AVX-512, BF16, AMX)
  libopenmpi-dev openmpi-bin      # MPI launch and CPU collectives
  libyaml-cpp-dev                 # configs
  libgtest-dev googletest         # tests
  coinor-libclp-dev               # LP solver for the sharding ratios
  nlohmann-json3-dev libcli11-dev # JSON logs/plans, command lines
  zlib1g-dev                      # CRC-32 checksums of checkpoints
  python3-torch python3-numpy     # PyTorch oracle tests and CPU benchmark peer
  python3-matplotlib python3-yaml # benchmark charts and drivers
  iproute2                        # hap-emulate: network namespaces, veth pairs, tc
  procps                          # pgrep: the mpirun tests signal and stop single ranks
  slurm-wlm                       # the slurm test: srun hap-train on a one-node local Slurm
  fortunes                        # default English training corpus (/usr/share/games/fortunes)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "setup: missing packages (${missing[*]}); run this script as root" >&2
  exit 1
fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
