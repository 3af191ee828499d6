#!/usr/bin/env bash
# The main job: builds convgrad (Release), starts convgrad-server on
# $CONVGRAD_LISTEN (default 127.0.0.1:50051), makes a smoke call that runs
# every op against it, then keeps serving until Ctrl-C / SIGTERM.
# Usage: server/serve.sh [--once]   (--once: stop after the smoke call)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${CONVGRAD_BUILD_DIR:-$root/build}
listen=${CONVGRAD_LISTEN:-127.0.0.1:50051}
once=0
[ "${1:-}" = "--once" ] && once=1

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j "$(nproc)" --target convgrad-server convgrad

"$build/server/convgrad-server" --listen "$listen" &
server_pid=$!
stop_server() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" || true
}
trap stop_server EXIT

"$build/client/convgrad" smoke --quiet --target "$listen" --wait 60

if [ "$once" -eq 1 ]; then
  exit 0
fi
echo "serving on $listen; Ctrl-C stops the server gracefully"
trap - EXIT
wait "$server_pid"
