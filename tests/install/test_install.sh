#!/usr/bin/env bash
# Installs HAP from a build tree into a temporary prefix, checks that the installed headers only
# include installed headers, then builds examples/custom_model against the install (find_package)
# and runs it: the example exits 0 only if its training loss fell below 10% of the initial loss.
#
# Usage: tests/install/test_install.sh BUILD_DIR SOURCE_DIR
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
SOURCE_DIR=$(cd "$2" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/hap_install_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
PREFIX="$WORK/prefix"

fail() {
  echo "test_install: $*" >&2
  exit 1
}

echo "== building and installing $BUILD_DIR into $PREFIX"
# The install rules name the library and the apps: bring the tree up to date first (a no-op in a
# tree that ctest runs from).
cmake --build "$BUILD_DIR" >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log" >&2; fail "building $BUILD_DIR failed"; }
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >"$WORK/install.log" 2>&1 ||
  { cat "$WORK/install.log" >&2; fail "cmake --install failed"; }

INCLUDE="$PREFIX/include/hap"
[[ -f "$INCLUDE/hap.h" ]] || fail "hap.h was not installed to $INCLUDE"

echo "== checking that installed headers include only installed headers"
missing=0
while IFS= read -r header; do
  while IFS= read -r inc; do
    if [[ ! -f "$INCLUDE/$inc" ]]; then
      echo "  ${header#"$INCLUDE"/} includes \"$inc\", which is not installed" >&2
      missing=1
    fi
  done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$header")
done < <(find "$INCLUDE" -name '*.h')
[[ $missing -eq 0 ]] || fail "installed headers are not self-sufficient"

echo "== building examples/custom_model against the install"
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
cmake -S "$SOURCE_DIR/examples/custom_model" -B "$WORK/example" "${GENERATOR[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log" >&2; fail "configuring the example failed"; }
cmake --build "$WORK/example" >"$WORK/example_build.log" 2>&1 ||
  { cat "$WORK/example_build.log" >&2; fail "building the example failed"; }

echo "== running the example"
status=0
"$WORK/example/custom_model" || status=$?
if [[ $status -ne 0 ]]; then
  fail "custom_model exited with status $status (its loss did not fall below 10% of the initial loss?)"
fi
echo "test_install: ok"
