#!/usr/bin/env bash
# Style gates of CI: every C file of the project matches .clang-format, and
# the sources of the libraries, the server and the CLI have no clang-tidy
# finding under .clang-tidy. Usage: tests/check-style.sh [build-dir]
# (a configured build with compile_commands.json; default: a fresh one).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

mapfile -t files < <(git ls-files '*.c' '*.h')
echo "== clang-format: ${#files[@]} files"
clang-format --dry-run --Werror "${files[@]}"

build=${1:-$root/build-ci/tidy}
echo "== clang-tidy ($build)"
cmake -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# Generated protobuf-c sources must exist for the includes to resolve.
cmake --build "$build" -j "$(nproc)" --target cg_proto >/dev/null
run-clang-tidy -quiet -p "$build" -j "$(nproc)" \
  "$root/(server|client/src|client/cli|kernels/src|proto)/[^/]*\.c$"
