#!/usr/bin/env bash
# Installs, from Debian 12's packages, everything convgrad builds and tests
# with. Idempotent: only missing packages are installed. Needs root.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libgrpc-dev protobuf-compiler-grpc libprotobuf-c-dev protobuf-c-compiler
  protobuf-compiler libuv1-dev libdnnl-dev libcmocka-dev libcjson-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-torch
  python3-h2 clang-format clang-tidy python3-sklearn
)

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
echo "setup: all packages present"
