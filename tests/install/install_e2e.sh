#!/bin/sh
# Usage: install_e2e.sh BUILD_DIR SERVER CC LIBDIR [EXTRA_CFLAGS]
# Installs BUILD_DIR into a temporary prefix, checks that the installed
# server finds its libraries there, builds consumer/health.c
# against it once with pkg-config and once with find_package(convgrad),
# and runs both against a live SERVER on an ephemeral port. EXTRA_CFLAGS
# (the sanitizer flags of a sanitized build) go to both consumer builds.
set -eu
build=$1 server=$2 cc=$3 libdir=$4 extra=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
# Canonical, so that the paths ldd prints compare equal to it.
tmp=$(cd "$(mktemp -d "${TMPDIR:-/tmp}/cg-install.XXXXXX")" && pwd -P)
spid=
cleanup() {
  if [ -n "$spid" ]; then
    kill "$spid" 2>/dev/null || true
    wait "$spid" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "install_e2e: $*" >&2
  exit 1
}

prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" ||
  { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }
for f in include/cg/problem.h include/cgc/client.h \
         "$libdir/pkgconfig/cgclient.pc" "$libdir/pkgconfig/cgcore.pc" \
         "$libdir/cmake/convgrad/convgradConfig.cmake" \
         "$libdir/cmake/convgrad/convgradConfigVersion.cmake"; do
  [ -e "$prefix/$f" ] || fail "$f not installed"
done

# The installed server loads its private libcgkernels from LIBDIR/convgrad
# (its RUNPATH) and the core beside it, not the build tree's.
"$prefix/bin/convgrad-server" --version >"$tmp/version.log" 2>&1 ||
  { cat "$tmp/version.log" >&2; fail "the installed server does not start"; }
# The file the loader maps for library $1 of the installed server.
loaded() {
  f=$(ldd "$prefix/bin/convgrad-server" | sed -n "s/^[[:space:]]*$1[^ ]* => \([^ ]*\) .*/\1/p")
  [ -n "$f" ] && readlink -f "$f"
}
case "$(loaded libcgkernels)" in
  "$prefix/$libdir/convgrad/"*) ;;
  *) fail "the installed server does not load $libdir/convgrad/libcgkernels" ;;
esac
case "$(loaded libcgcore)" in
  "$prefix/$libdir/"*) ;;
  *) fail "the installed server does not load the installed libcgcore" ;;
esac

# Readiness line: "convgrad-server ready listen=127.0.0.1:PORT ...".
mkfifo "$tmp/ready"
"$server" --listen 127.0.0.1:0 --workers 1 >"$tmp/ready" 2>"$tmp/server.log" &
spid=$!
exec 3<"$tmp/ready"
read -r line <&3 || { cat "$tmp/server.log" >&2; fail "server exited"; }
port=$(echo "$line" | sed -n 's/.* listen=[^ ]*:\([0-9][0-9]*\).*/\1/p')
[ -n "$port" ] || fail "no port in readiness line '$line'"
target=127.0.0.1:$port

# pkg-config; the rpath makes the program load the installed libraries,
# which the ldd check below confirms.
export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
pcflags=$(pkg-config --cflags cgclient) || fail "pkg-config --cflags"
pclibs=$(pkg-config --libs cgclient) || fail "pkg-config --libs"
pclib=$(cd "$(pkg-config --variable=libdir cgclient)" && pwd -P) ||
  fail "pkg-config's libdir is not a directory"
# shellcheck disable=SC2086 # word splitting of the flag lists is wanted
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror $extra $pcflags \
  -o "$tmp/health_pc" "$here/consumer/health.c" $pclibs \
  -Wl,-rpath,"$pclib" || fail "build with pkg-config failed"
ldd "$tmp/health_pc" | grep -q "$prefix/$libdir/libcgclient.so" ||
  fail "health_pc does not load the installed libcgclient"
out=$("$tmp/health_pc" "$target") || fail "health_pc: exit $? ($out)"
[ "$out" = SERVING ] || fail "health_pc printed '$out'"
echo "pkg-config build: $out"

# find_package(convgrad).
cmake -S "$here/consumer" -B "$tmp/consumer" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$extra" \
  >"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log" >&2; fail "configure"; }
cmake --build "$tmp/consumer" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; fail "build with find_package failed"; }
ldd "$tmp/consumer/health" | grep -q "$prefix/$libdir/libcgclient.so" ||
  fail "the find_package build does not load the installed libcgclient"
out=$("$tmp/consumer/health" "$target") || fail "health: exit $? ($out)"
[ "$out" = SERVING ] || fail "health printed '$out'"
echo "find_package build: $out"
