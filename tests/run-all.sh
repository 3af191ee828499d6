#!/usr/bin/env bash
# Builds convgrad twice (release, then ASan+UBSan) and runs every ctest
# entry in both. Usage: tests/run-all.sh [build-root]   (default: build-ci)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-ci}
jobs=$(nproc)

run_config() {
  local name=$1; shift
  local dir=$out/$name
  echo "== $name: configure and build"
  cmake -S "$root" -B "$dir" "$@" >/dev/null
  cmake --build "$dir" -j "$jobs"
  echo "== $name: ctest"
  (cd "$dir" && ctest --output-on-failure -j "$jobs")
}

run_config release -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_WERROR=ON
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  run_config sanitize -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_SANITIZE=ON \
    -DCG_WERROR=ON
