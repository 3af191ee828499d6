#!/usr/bin/env bash
# Installs, from Debian 12's packages, what convgrad needs. Idempotent: only
# missing packages are installed. Needs root (or sudo).
#
# Usage: tests/setup-debian.sh [--tests | --bench]
#   (none)   the main job: build and serve (server/serve.sh), the C client,
#            the Python package's core (python3-numpy), the man pages
#            (help2man) and the Debian packages (cpack: dpkg-dev, which
#            build-essential brings, and file)
#   --tests  adds what only the tests use: torch (convgrad.torch, the
#            torch_* and python_* groups), sklearn (the digits example),
#            grpcio/protobuf/h2 (the server's wire tests), yaml (the k8s
#            manifests check), prometheus-client (the metrics parser),
#            clang and its runtimes (the libFuzzer target), openssl (test
#            certificates), systemd (systemd-analyze checks the unit),
#            iproute2 and util-linux (ip, tc, nsenter, taskset: the
#            namespaces and shaped link of tests/net/rig.sh).
#            torch alone is ~1 GB installed, so the main job does not pull
#            it in.
#   --bench  the tests' packages and torchvision, whose ResNet-18
#            tests/bench/bench_train.py times; no test needs it, so CI
#            does not install it.
set -euo pipefail

main_packages=(
  build-essential cmake pkg-config
  libgrpc-dev protobuf-compiler-grpc libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler libuv1-dev libmicrohttpd-dev libssl-dev libdnnl-dev
  libcmocka-dev libcjson-dev libsystemd-dev help2man file
  python3 python3-numpy
)
test_packages=(
  python3-torch python3-sklearn python3-grpcio python3-protobuf python3-h2
  python3-yaml python3-prometheus-client clang-format clang-tidy
  clang libclang-rt-14-dev openssl systemd iproute2 util-linux
)

packages=("${main_packages[@]}")
case "${1:-}" in
  "") ;;
  --tests) packages+=("${test_packages[@]}") ;;
  --bench) packages+=("${test_packages[@]}" python3-torchvision) ;;
  *) echo "usage: $0 [--tests | --bench]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq \
    --no-install-recommends "${missing[@]}"
fi
echo "setup: all packages present${1:+ ($1)}"
