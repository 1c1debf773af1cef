#!/usr/bin/env bash
# Configures and builds HAP (Release) into ./build (or $HAP_BUILD_DIR).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${HAP_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${HAP_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$(nproc)"
