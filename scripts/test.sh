#!/usr/bin/env bash
# Builds HAP and runs the whole test suite (unit, oracle; gpu tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
BUILD_DIR=${HAP_BUILD_DIR:-build}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" ${HAP_CTEST_ARGS:-}
