#!/usr/bin/env bash
# docker/test.sh - verifies the container deployment on a host without a
# Docker engine or a container registry: builds a Debian 12 base image with
# debootstrap from the host's apt mirror, builds docker/Dockerfile on it
# with podman, runs docker/compose.yaml with podman-compose (server
# replicas + Prometheus + the smoke client, whose exit code decides), then
# asks Prometheus (promtool, inside its container) that every replica is
# up and that the replicas' convgrad_requests_total adds up to the calls
# the smoke client made, then its trainer
# service (examples/train_digits.py, 2 processes, --compare: its exit code
# decides, and every replica must have served some of its calls) with
# replica 1 killed by SIGKILL in the middle of training (the trainer must
# still match local training, the restart policy bring the replica back
# and Prometheus scrape the new process), then
# checks on each replica the image's HEALTHCHECK, the non-root user, that
# round_robin sent it calls and that SIGTERM drains it to exit 0, and that
# a one-core cpuset sizes the server to one worker. Then installs the Debian
# packages the image build made (cmake/packaging.cmake) into a clean
# Debian 12 container with systemd and checks README.md's "On a Debian
# host" there (docker/debian-host.sh). Tears it all down (the base image
# and the layer cache stay, for the next run). Exits 0 only if every step
# passed.
#
# Needs root (podman rootful, debootstrap). Installs its tools from Debian
# when missing and writes /etc/containers/containers.conf.
#
# Environment:
#   CONVGRAD_BASE_IMAGE   base image name (default localhost/debian-bookworm-base);
#                         built once, then reused: `podman rmi` it to rebuild
#   CONVGRAD_IMAGE        project image tag (default convgrad:latest)
#   CONVGRAD_REPLICAS     server replicas (default 2)
#   CONVGRAD_DEBIAN_MIRROR  override the mirror taken from apt's sources
#   CONVGRAD_TEST_TIMEOUT seconds the compose run may take (default 180)
#   CONVGRAD_TEST_TRAINER 0 skips the trainer (its image adds ~100 s to a
#                         cold run and 2.1 GB of torch); default 1
#   CONVGRAD_TRAINER_IMAGE  trainer image tag (default convgrad-trainer:latest)
#   CONVGRAD_PROMETHEUS_IMAGE  Prometheus image tag (default
#                         convgrad-prometheus:latest)
#   CONVGRAD_TRAINER_TIMEOUT  seconds the trainer may take (default 300)
#   CONVGRAD_HOST_IMAGE   Debian host image with systemd (default
#                         convgrad-debian-host:latest)
#   CONVGRAD_APT_CACHE    apt's archives and lists for the Debian-host check,
#                         kept between runs (default /var/cache/convgrad-test-apt)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
compose_file="$here/compose.yaml"
base_image=${CONVGRAD_BASE_IMAGE:-localhost/debian-bookworm-base}
export CONVGRAD_IMAGE=${CONVGRAD_IMAGE:-convgrad:latest}
export CONVGRAD_REPLICAS=${CONVGRAD_REPLICAS:-2}
export CONVGRAD_TRAINER_IMAGE=${CONVGRAD_TRAINER_IMAGE:-convgrad-trainer:latest}
export CONVGRAD_PROMETHEUS_IMAGE=${CONVGRAD_PROMETHEUS_IMAGE:-convgrad-prometheus:latest}
CONVGRAD_HOST_IMAGE=${CONVGRAD_HOST_IMAGE:-convgrad-debian-host:latest}
trainer=${CONVGRAD_TEST_TRAINER:-1}
trainer_timeout=${CONVGRAD_TRAINER_TIMEOUT:-300}
export BASE_IMAGE=$base_image
run_timeout=${CONVGRAD_TEST_TIMEOUT:-180}
# One compose project per run (named after this shell's PID), so two runs
# on one host (a developer's and CI's) never touch each other's containers.
project=convgrad-test-$$
t_start=$(date +%s)

log() { printf 'docker/test.sh: %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
step_time() { log "$1 done at +$(($(date +%s) - t_start)) s"; }

[ "$(id -u)" = 0 ] || die "must run as root (rootful podman, debootstrap)"

# --- tools -----------------------------------------------------------------
# Without recommends: those are for rootless use (slirp4netns, uidmap,
# fuse-overlayfs, dbus-user-session, which pulls in systemd) and a Docker
# daemon (docker-compose is only here for `config -q`). iptables is only
# "Suggested" by podman, but netavark cannot set up a bridge without it.
missing=()
for pkg in podman runc netavark aardvark-dns iptables debootstrap podman-compose \
  docker-compose; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' ||
    missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}" >/dev/null
fi
step_time "tools"

# --- podman configuration --------------------------------------------------
# crun fails on this kind of host and there is no systemd: runc, cgroupfs
# and a file events log. The nofile/nproc defaults keep gRPC and OpenMP
# threads within limits inside containers.
conf=/etc/containers/containers.conf
conf_text='# Written by convgrad docker/test.sh.
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"'
if [ "$(cat "$conf" 2>/dev/null)" != "$conf_text" ]; then
  if [ -e "$conf" ] && ! grep -q 'convgrad docker/test.sh' "$conf"; then
    cp "$conf" "$conf.convgrad-backup"
    log "saved the previous $conf as $conf.convgrad-backup"
  fi
  mkdir -p /etc/containers
  printf '%s\n' "$conf_text" >"$conf"
fi

# --- teardown --------------------------------------------------------------
compose() {
  podman-compose -p "$project" -f "$compose_file" "$@"
}
# Removes everything of compose project $1. --ignore: without it podman
# removes none of the containers when one of them is already gone, and the
# cpuset replica was left running after every run without a trainer.
remove_project() {
  podman-compose -p "$1" -f "$compose_file" down >/dev/null 2>&1
  podman rm -f -i -t 1 "${1}_cpuset" "${1}_trainer" "${1}_debian" >/dev/null 2>&1
  podman network rm -f "${1}_default" >/dev/null 2>&1
}
rootfs= debs=
cleanup() {
  local rc=$?
  set +e
  if [ -n "$rootfs" ]; then rm -rf "$rootfs"; fi
  if [ -n "$debs" ]; then rm -rf "$debs"; fi
  remove_project "$project"
  if [ "$rc" = 0 ]; then
    log "PASS in $(($(date +%s) - t_start)) s"
  else
    log "FAIL (exit $rc) after $(($(date +%s) - t_start)) s"
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

docker-compose -f "$compose_file" config -q || die "docker-compose config rejected $compose_file"

# --- 1. base image -----------------------------------------------------------
# The first URI of apt's sources (deb822 or one-line) that serves Debian
# itself, and the matching security archive if apt has one.
apt_uris() {
  {
    cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
      awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }'
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p'
  } | sed 's:/*$::'
}
if podman image exists "$base_image"; then
  log "base image $base_image exists, reused"
else
  mirror=${CONVGRAD_DEBIAN_MIRROR:-$(apt_uris | grep -m1 '/debian$' || true)}
  mirror=${mirror:-http://deb.debian.org/debian}
  security=$(apt_uris | grep -m1 '/debian-security$' || true)
  log "debootstrap bookworm from $mirror"
  rootfs=$(mktemp -d /var/tmp/convgrad-rootfs.XXXXXX)
  debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 ||
    { tail -20 "$rootfs.log" >&2; rm -f "$rootfs.log"; die "debootstrap failed"; }
  rm -f "$rootfs.log"
  # Same archives as the host, in the deb822 form of Debian's own images.
  rm -f "$rootfs/etc/apt/sources.list"
  {
    printf 'Types: deb\nURIs: %s\nSuites: bookworm bookworm-updates\nComponents: main\n' "$mirror"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ -n "$security" ]; then
      printf '\nTypes: deb\nURIs: %s\nSuites: bookworm-security\nComponents: main\n' "$security"
      printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
  } >"$rootfs/etc/apt/sources.list.d/debian.sources"
  # Like debian:bookworm-slim: no docs, manuals or translations in later
  # installs, and no package cache or lists left in the image.
  cat >"$rootfs/etc/dpkg/dpkg.cfg.d/slim" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
EOF
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - "$base_image" >/dev/null
  rm -rf "$rootfs"
  rootfs=
fi
step_time "base image"

# --- 2. project image ----------------------------------------------------------
# docker format: the OCI format has no HEALTHCHECK. Two jobs: the runtime
# stage installs its libraries while the build stage compiles.
podman build --format docker --layers --jobs 2 --build-arg "BASE_IMAGE=$base_image" \
  -f "$here/Dockerfile" -t "$CONVGRAD_IMAGE" "$root" ||
  die "podman build failed"
podman build --format docker --layers --build-arg "BASE_IMAGE=$base_image" \
  --target prometheus -f "$here/Dockerfile" -t "$CONVGRAD_PROMETHEUS_IMAGE" "$root" ||
  die "podman build --target prometheus failed"
step_time "image build"
if [ "$trainer" = 1 ]; then
  # Its torch layer comes from the base alone: built once, then cached.
  podman build --format docker --layers --build-arg "BASE_IMAGE=$base_image" \
    --target trainer -f "$here/Dockerfile" -t "$CONVGRAD_TRAINER_IMAGE" "$root" ||
    die "podman build --target trainer failed"
  step_time "trainer image build"
fi

# --- 3. compose stack ------------------------------------------------------------
# Leftovers of runs killed before their trap ran: projects whose shell is
# gone. Running ones are left alone.
for p in $({ podman ps -a --format '{{.Names}}'; podman network ls --format '{{.Name}}'; } |
  sed -n 's/^\(convgrad-test-[0-9]\+\)_.*/\1/p' | sort -u); do
  if ! kill -0 "${p##*-}" 2>/dev/null; then
    log "removing leftovers of $p"
    remove_project "$p"
  fi
done
# --exit-code-from implies --abort-on-container-exit: the run ends with the
# client and returns its exit code (-1, i.e. 255, if a server exits first).
# The services are named: podman-compose 1.0.3 ignores the trainer's
# profile and would start it too.
set +e
timeout "$run_timeout" podman-compose -p "$project" -f "$compose_file" \
  up --no-build --exit-code-from client server prometheus client
client_rc=$?
set -e
[ "$client_rc" = 124 ] && die "compose run exceeded ${run_timeout} s"
[ "$client_rc" = 0 ] || die "client exited with $client_rc"
step_time "compose run"

# --- 3a. Prometheus ------------------------------------------------------------
# The smoke client's summary line says how many Compute calls it made; each
# is counted once by the replica that served it. Prometheus scrapes every
# 2 s, so the sum is polled until it matches (or 60 s pass).
smoke=$(podman logs "${project}_client_1" 2>&1 | sed -n 's/^smoke: \([0-9]\+\)\/[0-9]\+ passed.*/\1/p')
[ -n "$smoke" ] || die "no 'smoke: N/N passed' line in the client's log"
prom="${project}_prometheus_1"
# The number of an instant query's only result ("{} => 142 @[...]"), or
# nothing when it has none yet.
query() {
  podman exec "$prom" promtool query instant http://127.0.0.1:9090 "$1" 2>/dev/null |
    sed -n 's/.*=> \([0-9.e+]\+\) @.*/\1/p' | head -1
}
up= total=
for _ in $(seq 1 60); do
  up=$(query 'count(up{job="convgrad"} == 1)')
  total=$(query 'sum(convgrad_requests_total{job="convgrad"})')
  [ "$up" = "$CONVGRAD_REPLICAS" ] && [ "$total" = "$smoke" ] && break
  sleep 1
done
log "prometheus: ${up:-no} replicas up, sum(convgrad_requests_total) = ${total:-none}, smoke made $smoke calls"
[ "$up" = "$CONVGRAD_REPLICAS" ] || die "prometheus does not see every replica up"
[ "$total" = "$smoke" ] || die "the replicas' request counters do not add up to the smoke client's calls"
step_time "prometheus"

# The server logs one "compute ... status=OK" line per op call served.
served() { podman logs "$1" 2>&1 | grep -c ' compute id=.* status=OK' || true; }

# --- 3b. trainer, and a replica killed under it ------------------------------------
# After the smoke run, against the replicas it left up. `compose run` gives
# no exit code back, so the container is detached and waited for.
# Chaos: when the trainer logs its first progress line (step 20 of its
# 177 offloaded steps, with compose's defaults), replica 1's server
# process is killed with SIGKILL by its host PID, as a crash or the OOM
# killer would. Its calls in flight fail UNAVAILABLE and the client
# retries them on the other replica (the ops are pure; a staged input the
# restarted replica lost is sent again as bytes), so the trainer's
# --compare must still pass: its loss curve within 1e-4 of local
# training's, its test accuracy that of the local run. Then the restart
# policy (`restart: unless-stopped`) must have started the replica again
# (podman's conmon does it; no systemd needed), and Prometheus must scrape
# the new process. `podman kill` would not do: podman counts it as stopped
# by the user and does not restart the container.
if [ "$trainer" = 1 ]; then
  before=()
  for n in $(seq 1 "$CONVGRAD_REPLICAS"); do
    before[n]=$(served "${project}_server_$n")
  done
  victim="${project}_server_1"
  ip_of() { podman inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "$1"; }
  victim_pid=$(podman inspect -f '{{.State.Pid}}' "$victim")
  victim_started=$(query "process_start_time_seconds{job=\"convgrad\",instance=\"$(ip_of "$victim"):9464\"}")
  [ -n "$victim_started" ] || die "prometheus has no process_start_time_seconds of $victim"
  t="${project}_trainer"
  compose run -d -T --no-deps --name "$t" trainer >/dev/null ||
    die "podman-compose run trainer failed"
  # The trainer's log, followed as it is written; the first progress line
  # of the offloaded run pulls the trigger.
  exec {follow}< <(timeout "$trainer_timeout" podman logs -f "$t" 2>&1)
  follow_pid=$!
  trigger=
  while IFS= read -r -u "$follow" line; do
    case "$line" in *'offloaded step '*) trigger=$line; break ;; esac
  done
  [ -n "$trigger" ] && kill -KILL "$victim_pid"
  t_kill_ms=$(date +%s%3N)
  kill "$follow_pid" 2>/dev/null || true
  exec {follow}<&-
  [ -n "$trigger" ] || die "the trainer ended without a progress line: $(podman logs "$t" 2>&1 | tail -5)"
  # Conservative: steps logged while this snapshot was taken count as before.
  steps_at_kill=$(podman logs "$t" 2>&1 | grep -c 'offloaded step' || true)
  log "chaos: killed $victim (host pid $victim_pid) with SIGKILL at the trainer's '$trigger'"
  set +e
  trainer_rc=$(timeout "$trainer_timeout" podman wait "$t")
  wait_rc=$?
  set -e
  trainer_log=$(podman logs "$t" 2>&1)
  sed 's/^/trainer: /' <<<"$trainer_log" >&2
  [ "$wait_rc" = 124 ] && die "the trainer exceeded ${trainer_timeout} s"
  [ "$trainer_rc" = 0 ] || die "the trainer exited with ${trainer_rc:-no code}"
  steps_total=$(grep -c 'offloaded step' <<<"$trainer_log" || true)
  [ "$steps_total" -gt "$steps_at_kill" ] ||
    die "the kill did not land mid-training: no offloaded step was logged after it"
  # "test accuracy A% (local B%)": the same to within one of the 359 test
  # images, 0.28 points (a near tie could flip with the 1e-5 weight
  # differences of offloaded and local training, kill or no kill).
  read -r acc lacc < <(sed -n 's/^compare: .*test accuracy \([0-9.]*\)% (local \([0-9.]*\)%).*/\1 \2/p' <<<"$trainer_log")
  [ -n "$acc" ] || die "no 'compare:' line in the trainer's log"
  awk -v a="$acc" -v b="$lacc" 'BEGIN { d = a - b; exit !(d * d <= 0.3 * 0.3) }' ||
    die "test accuracy $acc% after the kill, $lacc% without it"
  for n in $(seq 1 "$CONVGRAD_REPLICAS"); do
    c="${project}_server_$n"
    calls=$(($(served "$c") - before[n]))
    log "$c: served $calls trainer calls"
    [ "$calls" -gt 0 ] || die "$c served no trainer calls: round_robin did not reach it"
  done
  # The restart policy: a new process, a restart counted, ready again and
  # SERVING (the HEALTHCHECK's command).
  state=
  for _ in $(seq 1 60); do
    state=$(podman inspect -f '{{.State.Status}} {{.State.Pid}} {{.RestartCount}} {{.State.StartedAt.UnixMilli}}' "$victim")
    read -r status pid restarts started_ms <<<"$state"
    [ "$status" = running ] && [ "$pid" != "$victim_pid" ] && [ "$restarts" -ge 1 ] &&
      podman healthcheck run "$victim" >/dev/null 2>&1 && break
    state=
    sleep 0.5
  done
  [ -n "$state" ] || die "$victim was not restarted and healthy in 30 s: $(podman inspect -f '{{.State.Status}} exit {{.State.ExitCode}} restarts {{.RestartCount}}' "$victim")"
  ready=$(podman logs "$victim" 2>&1 | grep -c 'convgrad-server ready' || true)
  [ "$ready" = 2 ] || die "$victim logged $ready ready lines, not 2 (started, restarted)"
  log "chaos: $victim restarted by its policy: restarts $restarts, pid $victim_pid -> $pid, started again $(awk -v a="$started_ms" -v b="$t_kill_ms" 'BEGIN { printf "%.1f", (a - b) / 1e3 }') s after the kill, healthy"
  # Prometheus: the replica's target (its address, whether or not it
  # changed) is up again and reports the new process's start time.
  instance="$(ip_of "$victim"):9464"
  up= started=
  for _ in $(seq 1 60); do
    up=$(query "up{job=\"convgrad\",instance=\"$instance\"}")
    started=$(query "process_start_time_seconds{job=\"convgrad\",instance=\"$instance\"}")
    [ "$up" = 1 ] && [ -n "$started" ] &&
      awk -v a="$started" -v b="$victim_started" 'BEGIN { exit !(a > b) }' && break
    started=
    sleep 1
  done
  resets=$(query "sum(resets(convgrad_requests_total{job=\"convgrad\",instance=\"$instance\"}[10m]))")
  log "chaos: prometheus: up{instance=\"$instance\"} = ${up:-none}, process_start_time_seconds $victim_started -> ${started:-not newer}, convgrad_requests_total resets ${resets:-none}"
  [ "$up" = 1 ] && [ -n "$started" ] || die "prometheus does not scrape the restarted $victim"
  step_time "trainer run with a replica killed"
fi

# --- 4. what the run left to check -------------------------------------------------
# The servers are still up (compose down runs in the trap). The image's
# HEALTHCHECK is run by hand: without systemd nothing schedules it.
# The server logs one "compute ... status=OK" line per op call served, so
# each replica having some shows that round_robin spread the smoke run.
for n in $(seq 1 "$CONVGRAD_REPLICAS"); do
  c="${project}_server_$n"
  podman healthcheck run "$c" >/dev/null || die "$c: image HEALTHCHECK failed"
  uid=$(podman exec "$c" id -u) || die "$c: podman exec failed"
  [ "$uid" != 0 ] || die "$c runs as root"
  calls=$(served "$c")
  log "$c: healthy, uid $uid, served $calls calls"
  [ "$calls" -gt 0 ] || die "$c served no calls: round_robin did not reach it"
done

# Shared-memory regions from a sidecar: a client container in replica 1's
# IPC and network namespaces (what a pod's containers share) passes its
# tensors by region over loopback (the default --shm local) and checks the
# result; no tensor byte crosses the socket, and the replica logs the
# registration. The same client in an IPC namespace of its own is told
# NOT_FOUND for its key (README, "Shared-memory regions").
c="${project}_server_1"
shm_run() {
  podman run --rm --ipc "$1" --network "container:$c" --entrypoint convgrad \
    "$CONVGRAD_IMAGE" run --target 127.0.0.1:50051 --shm \
    --op ConvolutionBackwardData --in0-shape 2x8x8x4 --in1-shape 3x3x4x4 \
    --pads-begin 1,1 --pads-end 1,1 --check 2>&1
}
out=$(shm_run "container:$c") || die "sidecar run --shm failed: $out"
case "$out" in
  *'0 bytes up, 0 down'*'check: '*': OK'*) ;;
  *) die "sidecar run --shm moved tensor bytes or did not check: $out" ;;
esac
# grep -c reads the whole log: with -q, podman could die of SIGPIPE and
# pipefail would fail the check.
registered=$(podman logs "$c" 2>&1 | grep -c 'region op=register .* status=OK' || true)
[ "$registered" -gt 0 ] || die "$c logged no region registration"
set +e
out=$(shm_run private)
shm_rc=$?
set -e
if [ "$shm_rc" = 0 ] || [[ "$out" != *NOT_FOUND*key:* ]]; then
  die "a client in another IPC namespace was not refused NOT_FOUND (exit $shm_rc): $out"
fi
log "shared memory: a sidecar's call moved 0 tensor bytes; another IPC namespace got NOT_FOUND"

# SIGTERM (the image's STOPSIGNAL) must drain and exit 0 with the server as
# PID 1; compose down would kill after 1 s, so stop the replicas first.
for n in $(seq 1 "$CONVGRAD_REPLICAS"); do
  c="${project}_server_$n"
  podman stop -t 20 "$c" >/dev/null || die "$c: podman stop failed"
  code=$(podman inspect --format '{{.State.ExitCode}}' "$c")
  [ "$code" = 0 ] || die "$c exited with $code after SIGTERM"
done
# unless-stopped: a replica stopped on purpose stays down (the first was
# stopped a drain ago, time enough for a restart).
for n in $(seq 1 "$CONVGRAD_REPLICAS"); do
  c="${project}_server_$n"
  status=$(podman inspect --format '{{.State.Status}}' "$c")
  [ "$status" = exited ] || die "$c is $status after podman stop: the restart policy restarted it"
done
log "replicas stopped by SIGTERM with exit code 0, and stayed stopped"

# --- 5. cpuset sizing ---------------------------------------------------------------
# podman-compose ignores `cpuset`, so check the image under plain podman: on
# one core the server must size itself to one worker pinned to that core.
podman run -d --name "${project}_cpuset" --cpuset-cpus 0 "$CONVGRAD_IMAGE" >/dev/null ||
  die "podman run --cpuset-cpus 0 failed"
ready=
for _ in $(seq 1 40); do
  ready=$(podman logs "${project}_cpuset" 2>/dev/null | grep -m1 'convgrad-server ready' || true)
  [ -n "$ready" ] && break
  sleep 0.25
done
log "cpuset 0: ${ready:-no ready line}"
case "$ready" in
  *' workers=1 '*' cpus=0 '*) ;;
  *) die "with --cpuset-cpus 0 the server did not size itself to 1 worker on cpu 0" ;;
esac
step_time "checks"

# --- 6. Debian packages on a clean host ------------------------------------------
# The .deb files of the build stage (cached: no second build), installed
# by apt-get into a fresh container of the Dockerfile's debian-host stage
# (the base image with systemd as PID 1), then README.md's "On a Debian
# host" checked there (docker/debian-host.sh): systemd runs the unit as the
# package set it up. apt's downloads and lists persist in $apt_cache
# between runs (the container itself starts clean each time), so a warm
# run downloads nothing; `rm -rf` it to start cold.
debs=$(mktemp -d /var/tmp/convgrad-debs.XXXXXX)
apt_cache=${CONVGRAD_APT_CACHE:-/var/cache/convgrad-test-apt}
mkdir -p "$apt_cache/archives/partial" "$apt_cache/lists/partial"
podman build --format docker --layers --build-arg "BASE_IMAGE=$base_image" \
  --target debs --output "type=local,dest=$debs" -f "$here/Dockerfile" "$root" \
  >/dev/null || die "podman build --target debs failed"
log "packages: $(cd "$debs" && ls -s --block-size=K ./*.deb | tr '\n' ' ')"
podman build --format docker --layers --build-arg "BASE_IMAGE=$base_image" \
  --target debian-host -t "$CONVGRAD_HOST_IMAGE" -f "$here/Dockerfile" "$root" \
  >/dev/null || die "podman build --target debian-host failed"
host="${project}_debian"
podman run -d --systemd=always --name "$host" -v "$debs:/debs:ro" \
  -v "$apt_cache/archives:/var/cache/apt/archives" \
  -v "$apt_cache/lists:/var/lib/apt/lists" \
  -v "$here/debian-host.sh:/debian-host.sh:ro" "$CONVGRAD_HOST_IMAGE" >/dev/null ||
  die "podman run $CONVGRAD_HOST_IMAGE failed"
podman exec "$host" bash /debian-host.sh || die "the Debian packages failed on a clean host"
podman rm -f -t 5 "$host" >/dev/null
step_time "debian host"
