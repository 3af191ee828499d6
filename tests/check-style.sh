#!/usr/bin/env bash
# Style gates of CI: every C file of the project matches .clang-format, no
# directory's files call each other in a circle (tests/check-layers.py), and
# the sources of the libraries, the server and the CLI have no clang-tidy
# finding under .clang-tidy.
# Usage: tests/check-style.sh [--format-only | --tidy-only] [build-dir]
# (build-dir: where clang-tidy's compile_commands.json is made; default
# build-ci/tidy). tests/run-all.sh runs the two apart: clang-format first,
# clang-tidy beside its build stages.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

format=1 tidy=1
case "${1:-}" in
  --format-only) tidy=0; shift ;;
  --tidy-only) format=0; shift ;;
esac

if [ "$format" = 1 ]; then
  mapfile -t files < <(git ls-files '*.c' '*.h')
  echo "== clang-format: ${#files[@]} files"
  clang-format --dry-run --Werror "${files[@]}"
  python3 "$root/tests/check-layers.py"
fi
[ "$tidy" = 1 ] || exit 0

build=${1:-$root/build-ci/tidy}
echo "== clang-tidy ($build)"
cmake -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# Generated protobuf-c sources must exist for the includes to resolve.
cmake --build "$build" -j "$(nproc)" --target cg_proto >/dev/null
run-clang-tidy -quiet -p "$build" -j "$(nproc)" \
  "$root/(server|client/src|client/cli|kernels/src|proto)/[^/]*\.c$"
