#!/usr/bin/env bash
# The install tests' fixture: installs HAP from a build tree into WORK/prefix, checks that the
# installed headers only include installed headers and that the installed apps run from the
# prefix (from another working directory), then builds examples/custom_model against the install
# (find_package(hap), hap::train) into WORK/example. The tests that use it run the example.
#
# Usage: tests/install/install_example.sh BUILD_DIR SOURCE_DIR WORK
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR WORK" >&2
  exit 2
fi
BUILD_DIR=$(cd "$1" && pwd)
SOURCE_DIR=$(cd "$2" && pwd)
WORK=$3
rm -rf "$WORK"
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
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

echo "== running the installed apps from the prefix (and another working directory)"
SHARE="$PREFIX/share/hap/configs"
(cd / && "$PREFIX/bin/hap-plan" --config "$SHARE/gpt-tiny.yaml" --cluster "$SHARE/clusters/two-devices.yaml" \
   >"$WORK/plan.log" 2>&1) || { cat "$WORK/plan.log" >&2; fail "the installed hap-plan does not run"; }
grep -q "predicted step time" "$WORK/plan.log" || fail "the installed hap-plan printed no plan"
(cd / && "$PREFIX/bin/hap-train" --config "$SHARE/gpt-tiny.yaml" --set train.steps=2 --quiet \
   >"$WORK/train.log" 2>&1) || { cat "$WORK/train.log" >&2; fail "the installed hap-train does not run"; }
# Its default --config is the installed configs/gpt.yaml, whatever the working directory.
(cd / && "$PREFIX/bin/hap-profile" --out "$WORK/profiled.yaml" --quick >"$WORK/profile.log" 2>&1) ||
  { cat "$WORK/profile.log" >&2; fail "the installed hap-profile does not run"; }
grep -q "share/hap/configs/gpt.yaml" "$WORK/profiled.yaml" || fail "hap-profile did not time the installed gpt.yaml"
for lib in "$PREFIX"/lib/libhap*.so; do
  ldd "$lib" | grep -q "not found" && { ldd "$lib" >&2; fail "$lib has unresolved libraries"; }
done

echo "== building examples/custom_model against the install"
GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
cmake -S "$SOURCE_DIR/examples/custom_model" -B "$WORK/example" "${GENERATOR[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" >"$WORK/configure.log" 2>&1 ||
  { cat "$WORK/configure.log" >&2; fail "configuring the example failed"; }
cmake --build "$WORK/example" >"$WORK/example_build.log" 2>&1 ||
  { cat "$WORK/example_build.log" >&2; fail "building the example failed"; }

echo "install_example: ok ($WORK/example/custom_model)"
