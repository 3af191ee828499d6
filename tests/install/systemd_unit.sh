#!/bin/sh
# Usage: systemd_unit.sh BUILD_DIR [MAX_EXPOSURE]
# Installs BUILD_DIR's server component (server, unit, settings, man page)
# into a temporary prefix and checks the unit as that prefix's:
# `systemd-analyze verify` (directives, ExecStart and /bin/kill
# executable, the man page of Documentation=) must pass, and `systemd-analyze
# security --offline` must rate its exposure at most MAX_EXPOSURE (default
# 2.0 of 10; the unit rates 1.2, README.md "On a Debian host"). The unit is
# the installed text, only its prefix differs from the package's. Exits 77
# (skip) without systemd-analyze (Debian's systemd package).
set -eu
build=$1 max=${2:-2.0}
command -v systemd-analyze >/dev/null || { echo "no systemd-analyze: skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/cg-unit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
  echo "systemd_unit: $*" >&2
  exit 1
}

cmake --install "$build" --prefix "$tmp" --component server >"$tmp/install.log" ||
  { cat "$tmp/install.log" >&2; fail "cmake --install failed"; }
unit=$tmp/lib/systemd/system/convgrad-server.service
[ -f "$unit" ] || fail "no $unit installed"
grep -qx "ExecStart=$tmp/bin/convgrad-server" "$unit" ||
  fail "ExecStart does not name the installed server: $(grep ExecStart "$unit")"

MANPATH=$tmp/share/man systemd-analyze verify "$unit" >"$tmp/verify.log" 2>&1 ||
  { cat "$tmp/verify.log" >&2; fail "systemd-analyze verify failed"; }
# Warnings do not change verify's exit code; none may appear either.
if [ -s "$tmp/verify.log" ]; then
  cat "$tmp/verify.log" >&2
  fail "systemd-analyze verify printed warnings"
fi
echo "systemd-analyze verify: OK"

# --threshold is in tenths: 2.0 -> 20.
threshold=$(echo "$max" | awk '{ printf "%d", $1 * 10 + 0.5 }')
set +e
systemd-analyze security --offline=true --threshold="$threshold" "$unit" \
  >"$tmp/security.log" 2>&1
rc=$?
set -e
grep '^✗' "$tmp/security.log" || true
score=$(sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' "$tmp/security.log")
[ -n "$score" ] || { cat "$tmp/security.log" >&2; fail "no exposure level"; }
echo "systemd-analyze security: exposure $score (at most $max)"
[ "$rc" = 0 ] || fail "exposure $score is above $max"
