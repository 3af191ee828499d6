#!/usr/bin/env bash
# Checks formatting and clang-tidy (tests/check-style.sh), fuzzes the
# request path for half a minute (tests/fuzz, clang's libFuzzer), then builds
# convgrad three times (release, ASan+UBSan, ThreadSanitizer) and runs every
# ctest entry in the first two, the server's and the client's asynchronous
# ones in the third. CI's budget is 20 minutes on 2 vCPUs (docker/test.sh
# included), so each sanitizer runs where it can find something: the
# sanitized builds set CG_SANITIZED (address or thread), by which the
# tests skip the lower ISAs (only oneDNN's uninstrumented JIT code changes
# with them) and shrink their big streams; tests/README.md says what runs
# where.
# Usage: tests/run-all.sh [build-root]   (default: build-ci)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/build-ci}
jobs=$(nproc)

# configure NAME [cmake args]: (re)configures $out/NAME quietly.
configure() {
  local name=$1; shift
  cmake -S "$root" -B "$out/$name" "$@" >/dev/null
}

# run_config NAME [--after-build COMMAND] [ctest args] -- [cmake args]
run_config() {
  local name=$1; shift
  local dir=$out/$name ctest_args=() after_build=:
  if [ "$1" = --after-build ]; then after_build=$2; shift 2; fi
  while [ "$1" != -- ]; do ctest_args+=("$1"); shift; done
  shift
  echo "== $name: configure and build"
  configure "$name" "$@"
  cmake --build "$dir" -j "$jobs"
  "$after_build"
  echo "== $name: ctest"
  (cd "$dir" && ctest --output-on-failure -j "$jobs" "${ctest_args[@]}")
}

# Work that needs no CPU of its own runs beside a stage at idle priority
# (SCHED_IDLE: it runs only when no normal task wants a core and is
# preempted at once, so it never slows that stage): idle_start COMMAND
# (a function too) starts it, one at a time, in its own process group, so
# that a run that stops early stops it too; idle_join NAME puts what is
# left of it back to normal priority (on a machine shared with other work
# it would otherwise wait behind all of it), waits for it, prints its
# output and fails the run if it failed.
idle_pid=
idle_log=$(mktemp)
trap '[ -z "$idle_pid" ] || kill -- -"$idle_pid" 2>/dev/null; rm -f "$idle_log"' EXIT
idle_start() {
  set -m
  { chrt --idle -p 0 "$BASHPID" >/dev/null && "$@"; } </dev/null >"$idle_log" 2>&1 &
  idle_pid=$!
  set +m
}
idle_join() {
  local rc=0 stat fields
  for stat in /proc/[0-9]*/stat; do
    # Field 5 is the process group; the name (field 2) may hold spaces.
    read -r fields <"$stat" 2>/dev/null || continue
    read -r -a fields <<<"${fields##*) }"
    [ "${fields[2]}" != "$idle_pid" ] ||
      chrt --all-tasks --other -p 0 "${stat//[^0-9]/}" >/dev/null 2>&1 || true
  done
  wait "$idle_pid" || rc=$?
  idle_pid=
  cat "$idle_log"
  [ "$rc" = 0 ] || { echo "== $1 failed ($rc)"; exit "$rc"; }
}

# Style first. clang-format takes seconds and fails fast. clang-tidy (its
# analyzer takes about 170 CPU-s over the project's sources) runs at idle
# priority beside the fuzz and release build stages: it gets only the CPU
# they leave (configure steps, the fuzzer's one process, link tails); what
# is left of it runs alone before the first ctest, which shares the CPU
# with nothing but the next two configure steps. Its report is printed
# there, and a finding fails the run there.
bash "$root/tests/check-style.sh" --format-only
idle_start bash "$root/tests/check-style.sh" --tidy-only "$out/tidy"
# The request path under libFuzzer with ASan+UBSan: the seed corpus
# replayed (ctest), then FUZZ_SECONDS (default 30) of new inputs; a crash
# fails the run and leaves its input in $out/fuzz/crash-*.
echo "== fuzz: configure and build"
configure fuzz -DCMAKE_C_COMPILER=clang -DCG_FUZZ=ON -DCG_WERROR=ON \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$out/fuzz" -j "$jobs"
(cd "$out/fuzz" && ctest --output-on-failure)
fuzz_work=$(mktemp -d)
echo "== fuzz: ${FUZZ_SECONDS:-30} s"
"$out/fuzz/tests/fuzz/fuzz_request" -max_total_time="${FUZZ_SECONDS:-30}" \
  -max_len=16384 -print_final_stats=1 -artifact_prefix="$out/fuzz/" "$fuzz_work" \
  "$root/tests/fuzz/corpus" 2>&1 | grep -v '^#[0-9]'
rm -rf "$fuzz_work"
# The sanitizer build is also the fault-injection build (CG_FAULT_INJECT:
# inert unless a test sets CONVGRAD_FAULT_*), where server_checks runs its
# injected-fault and broken-kernel tests, without a build of its own.
sanitize_cmake=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_SANITIZE=ON
                -DCG_FAULT_INJECT=ON -DCG_WERROR=ON)
tsan_cmake=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_TSAN=ON -DCG_WERROR=ON)
# The two sanitizer builds' first configure (about 12 s of one core each:
# compiler and package checks) runs at idle priority during the release
# ctest, whose tests leave most of the CPU idle; their run_config then
# only reconfigures (about 1.5 s).
configure_sanitizers() {
  configure sanitize "${sanitize_cmake[@]}"
  configure tsan "${tsan_cmake[@]}"
}
after_release_build() {
  idle_join clang-tidy
  idle_start configure_sanitizers
}
run_config release --after-build after_release_build -- \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCG_WERROR=ON
idle_join "sanitizer builds' configure"
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
  run_config sanitize -- "${sanitize_cmake[@]}"
# ThreadSanitizer (options and tests/tsan.supp come with each test's
# environment): the server's unit and end-to-end tests, where its threads
# meet (loop, completion queue, workers). Not server_attacks: its floods
# run 5-15 times slower under TSan and starve its legitimate client into
# DEADLINE_EXCEEDED, which measures the sanitizer, not the server. Not
# server_extremes (98 s under TSan): it sweeps integers through the
# request's validation and oneDNN's descriptors, which is ASan/UBSan's
# ground (both other builds run it); its calls meet the server's threads
# the way server_errors' and server_fuzz's do, which TSan runs. The
# kernels' tests have no threads of their own beside OpenMP's and gRPC's,
# which are uninstrumented; the client's asynchronous calls run on its
# engine thread beside the caller's (client_lib_e2e, client_proto_e2e,
# client_region_e2e: about 45 s under TSan), split calls on its split
# thread (client_split_e2e, 9 s) and its result checks on either
# (client_verify_e2e, 2 s). Not server_buf (10 s under TSan, 3 s in
# release): a race needs two threads, and the buffer cache's unit test
# calls it from one (it starts none, nor does server/buf.c); the cache's
# callers on the completion-queue thread and the workers meet in the
# end-to-end groups TSan runs (server_load, server_ops, ...).
run_config tsan -R '^(server_|client_(lib|proto|region|split|verify)_e2e$)' \
  -E '^server_(attacks|extremes|buf)$' --timeout 600 -- "${tsan_cmake[@]}"
