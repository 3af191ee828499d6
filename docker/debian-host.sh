#!/bin/bash
# docker/debian-host.sh - README.md's "On a Debian host", checked on a clean
# Debian 12 host: docker/test.sh runs it as root in a container of the
# Dockerfile's debian-host stage (systemd as PID 1, nothing else added),
# with the five .deb files of cmake/packaging.cmake in /debs.
#   - `apt-get install` of the packages; the package's postinst creates the
#     system user convgrad and enables and starts convgrad-server.service;
#   - systemd runs the unit's ExecStart as its User: READY (Type=notify)
#     with the readiness line, listening on 127.0.0.1:50051 and
#     /run/convgrad/convgrad.sock, sandboxed (no capabilities,
#     NoNewPrivileges, a seccomp filter); `systemd-analyze verify` of the
#     installed unit, and `systemd-analyze security` of the running one;
#   - `convgrad smoke` over TCP and, as a member of the group convgrad, over
#     the unix socket, which refuses a user outside the group; a trainer's
#     shared-memory region through the sandbox's /dev/shm, refused at mode
#     0600 and served with CONVGRAD_SHM_GROUP=convgrad;
#   - `import convgrad` finds libcgclient without CONVGRAD_LIBRARY;
#   - `systemctl reload` (SIGHUP) keeps it serving, `systemctl stop`
#     (SIGTERM) ends it with status 0, and every package purges cleanly.
# Exits 0 only if every step passed.
set -euo pipefail

unit=convgrad-server.service
log() { printf 'debian-host: %s\n' "$*" >&2; }
die() {
  log "FAIL: $*"
  journalctl -u "$unit" --no-pager 2>/dev/null | tail -20 | sed 's/^/journal: /' >&2
  exit 1
}

# Until systemd has opened its socket systemctl prints nothing; then
# --wait waits for the boot to finish.
state=
for _ in $(seq 1 100); do
  state=$(timeout 60 systemctl is-system-running --wait 2>/dev/null || true)
  [ -n "$state" ] && break
  sleep 0.1
done
case "$state" in
  running | degraded) ;;
  *) die "systemd is not up: '$state'" ;;
esac

cd /debs
debs=(./*.deb)
[ ${#debs[@]} = 5 ] || die "expected 5 packages in /debs, found ${#debs[@]}"
# No fsync per unpacked file, as in Debian's own container images: the
# container is thrown away (halves the install's 25 s).
echo force-unsafe-io >/etc/dpkg/dpkg.cfg.d/unsafe-io
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${debs[@]}" >/tmp/apt.log 2>&1 || { tail -30 /tmp/apt.log >&2; die "apt-get install failed"; }
log "installed: $(dpkg-query -W -f='${Package} ${Version}, ' convgrad-server \
  libcgclient0.2 libcgclient-dev convgrad-cli python3-convgrad)"

# Every package names a maintainer one can write to, and its copyright
# file the license of LICENSE.
for pkg in convgrad-server libcgclient0.2 libcgclient-dev convgrad-cli python3-convgrad; do
  maintainer=$(dpkg-query -W -f='${Maintainer}' "$pkg")
  case "$maintainer" in
    *@localhost* | *@example.* | *@*.invalid* | *'<>'* | '') die "$pkg: placeholder Maintainer '$maintainer'" ;;
  esac
  grep -qx 'License: Apache-2.0' "/usr/share/doc/$pkg/copyright" ||
    die "$pkg: /usr/share/doc/$pkg/copyright declares no Apache-2.0 license"
done
log "maintainer: $maintainer; license: Apache-2.0"

# The system user and group of the package's postinst.
IFS=: read -r _ _ uid gid _ home shell < <(getent passwd convgrad) ||
  die "no user convgrad"
[ "$uid" -lt 1000 ] && [ "$shell" = /usr/sbin/nologin ] && [ "$home" = /nonexistent ] ||
  die "convgrad is not a system user: uid $uid, home $home, shell $shell"
[ "$(getent group convgrad | cut -d: -f3)" = "$gid" ] || die "no group convgrad"

# Enabled and started by the package, ready by its own notification.
[ "$(systemctl is-enabled "$unit")" = enabled ] || die "$unit is not enabled"
systemctl is-active --quiet "$unit" || die "$unit is not active"
status=$(systemctl show -p StatusText --value "$unit")
log "$status"
sock=/run/convgrad/convgrad.sock
case "$status" in
  "convgrad-server ready listen=127.0.0.1:50051 unix=$sock "*) ;;
  *) die "the unit's server is not READY on 127.0.0.1:50051 and $sock" ;;
esac
pid=$(systemctl show -p MainPID --value "$unit")
sandbox=$(awk '/^(Uid|NoNewPrivs|Seccomp|CapBnd|CapEff):/ { printf "%s %s ", $1, $2 }' \
  "/proc/$pid/status")
log "main process: $sandbox"
case "$sandbox" in
  "Uid: $uid CapEff: 0000000000000000 CapBnd: 0000000000000000 NoNewPrivs: 1 Seccomp: 2 ") ;;
  *) die "the server is not the sandboxed user convgrad" ;;
esac
[ "$(stat -c '%U:%G %a' "$sock")" = "convgrad:convgrad 660" ] ||
  die "socket $sock is $(stat -c '%U:%G %a' "$sock")"
path=$(systemctl show -p FragmentPath --value "$unit")
# The installed unit; its man page is not installed in this slim image.
out=$(systemd-analyze verify --man=no "$path" 2>&1) && [ -z "$out" ] ||
  die "systemd-analyze verify $path: $out"
exposure=$(systemd-analyze security "$unit" 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: //p')
log "systemd-analyze verify: OK; security: $exposure"

# Clients: smoke over TCP; over the socket as a member of the group
# convgrad; a user outside the group cannot connect.
useradd --create-home --groups convgrad trainer
useradd --create-home outsider
out=$(convgrad smoke --target 127.0.0.1:50051 2>&1) || die "smoke over TCP: $out"
log "TCP: ${out##*$'\n'}"
out=$(runuser -u trainer -- convgrad smoke --target "unix:$sock" 2>&1) ||
  die "smoke over $sock as trainer: $out"
log "unix socket, user trainer (group convgrad): ${out##*$'\n'}"
set +e
out=$(runuser -u outsider -- convgrad health --target "unix:$sock" --retries 0 2>&1)
rc=$?
set -e
[ "$rc" = 4 ] || die "a user outside the group convgrad reached the socket (exit $rc): $out"
log "unix socket, user outsider: refused (exit 4)"
# A region in /dev/shm, mapped by the sandboxed server: the library
# creates its objects with mode 0600, out of the service user's reach,
# unless CONVGRAD_SHM_GROUP gives them to a group the server is in.
shm_run=(convgrad run --target "unix:$sock" --shm --op ConvolutionBackwardData
  --in0-shape 2x8x8x4 --in1-shape 3x3x4x4 --pads-begin 1,1 --pads-end 1,1 --check)
set +e
out=$(runuser -u trainer -- "${shm_run[@]}" 2>&1)
rc=$?
set -e
[ "$rc" != 0 ] && [[ "$out" == *PERMISSION_DENIED* ]] ||
  die "trainer's 0600 region: expected PERMISSION_DENIED, got exit $rc: $out"
out=$(runuser -u trainer -- env CONVGRAD_SHM_GROUP=convgrad "${shm_run[@]}" 2>&1) ||
  die "run --shm as trainer with CONVGRAD_SHM_GROUP=convgrad: $out"
case "$out" in
  *'0 bytes up, 0 down'*'check: '*': OK'*) ;;
  *) die "run --shm moved tensor bytes or did not check: $out" ;;
esac
log "shared memory: trainer's region refused at mode 0600; with CONVGRAD_SHM_GROUP=convgrad its call moved 0 tensor bytes"

out=$(convgrad --version --target "unix:$sock")
case "$out" in
  *"server unix:$sock: convgrad-server "*", oneDNN "*", ISA "*) ;;
  *) die "convgrad --version: $out" ;;
esac
log "convgrad --version: $(echo "$out" | tr '\n' ';')"

# Python: the package finds libcgclient with no CONVGRAD_LIBRARY.
out=$(runuser -u trainer -- env -u CONVGRAD_LIBRARY python3 -c "
import convgrad, convgrad._lib as lib
c = convgrad.Client('unix:$sock')
print(lib.load()._name, convgrad.__file__, c.health(), c.info()['version'])" 2>&1) ||
  die "import convgrad: $out"
log "python3: $out"
case "$out" in
  "libcgclient.so.0.2 /usr/lib/python3/dist-packages/convgrad/__init__.py SERVING "*) ;;
  *) die "import convgrad did not load the packaged library: $out" ;;
esac

# Reload (SIGHUP) keeps it serving; stop (SIGTERM) drains, exits 0 and
# removes the socket.
systemctl reload "$unit" || die "systemctl reload failed"
journalctl -u "$unit" --no-pager | grep -q 'SIGHUP' || die "no SIGHUP in the journal"
convgrad health --target 127.0.0.1:50051 >/dev/null || die "not SERVING after reload"
systemctl stop "$unit"
result=$(systemctl show -p Result -p ExecMainStatus --value "$unit" | tr '\n' ' ')
[ "$result" = "success 0 " ] || die "stop: result and status '$result'"
[ ! -e "$sock" ] || die "the server left $sock behind"
log "reload: still SERVING; stop: exit 0"

# The maintainer scripts of removal and purge.
dpkg --purge python3-convgrad convgrad-cli libcgclient-dev convgrad-server \
  libcgclient0.2 >/tmp/purge.log 2>&1 || { cat /tmp/purge.log >&2; die "dpkg --purge failed"; }
for f in /usr/lib/python3/dist-packages/convgrad /etc/default/convgrad \
  /usr/lib/systemd/system/$unit /etc/systemd/system/multi-user.target.wants/$unit; do
  [ ! -e "$f" ] || die "$f left after purge"
done
log "PASS"
