#!/usr/bin/env bash
# rig.sh - a trainer and a server on one machine, joined by a shaped link:
# two network namespaces of this script's own (NAME-trn and NAME-srv, each
# with its loopback up), one veth pair between them made inside them (the
# root namespace never sees it), 10.231.0.1/30 on the trainer's end and
# 10.231.0.2/30 on the server's (addresses that exist only inside these
# namespaces), tc tbf at --rate on both ends, and per side the cores
# (taskset) and a CPU quota (cgroup v2's cpu.max, or v1's cpu controller,
# whichever this machine has).
#
#   rig.sh up NAME [options]      build the rig (torn down again on failure)
#   rig.sh exec NAME trn|srv -- CMD...
#                                 run CMD in a side's namespace, cgroup and
#                                 cores
#   rig.sh run NAME [options] -- CMD...
#                                 up, CMD on the trainer's side with
#                                 CG_RIG=NAME and CG_RIG_SERVER=10.231.0.2,
#                                 then down, whatever CMD does (trap);
#                                 exits with CMD's status
#   rig.sh down NAME              tear it down: idempotent, also after a
#                                 failed or interrupted up
#   rig.sh show NAME              what the rig is (one line per setting)
#   rig.sh check                  whether this machine can build a rig
#                                 (exit 0), else why not (exit 77)
#
# Options of up and run:
#   --rate R           tbf rate of both ends, tc's units (10gbit, 1gbit,
#                      500mbit); default 10gbit
#   --burst B          tbf burst (default: 4 ms at the rate, at least 64kb)
#   --mtu N            the veths' MTU (default 65535: a real NIC segments and
#                      coalesces in hardware, TSO and GRO, where a veth's
#                      1500-byte packets cost the kernel per packet on the
#                      very cores measured: 2-3 Gbit/s at most here)
#   --delay D          added one-way delay per end (netem; this script says
#                      so and fails where the kernel has no netem)
#   --trn-cpus LIST    trainer's cores (taskset -c list); default: all
#   --srv-cpus LIST    server's cores; default: all
#   --trn-quota P      trainer's CPU quota, percent of one core per 100 ms
#                      period (50: half a core); default: none
#   --srv-quota P      the server's
#
# Only root can make namespaces and qdiscs: as anyone else (or without
# CAP_NET_ADMIN, e.g. an unprivileged container) it says why and exits 77,
# the status ctest's SKIP_RETURN_CODE reads as skipped. NAME: up to 8
# letters and digits. Processes left in a rig's namespaces or cgroups when
# it goes down were started by this script's exec: down ends them (by pid)
# before removing what holds them.
set -euo pipefail

SKIP=77
TRN_ADDR=10.231.0.1
SRV_ADDR=10.231.0.2
PREFIX=30
DEV=cgv0
STATE_ROOT=${CG_RIG_STATE:-/run/convgrad-rig}

die() {
  echo "rig: $*" >&2
  exit 1
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# can_rig: empty when this machine can build a rig, else why not.
can_rig() {
  if [ "$(id -u)" != 0 ]; then
    echo "needs root (network namespaces, veth and tc need CAP_NET_ADMIN)"
    return
  fi
  local tool
  for tool in ip tc taskset nsenter; do
    if ! command -v "$tool" >/dev/null; then
      echo "needs $tool (iproute2, util-linux: tests/setup-debian.sh --tests)"
      return
    fi
  done
  local probe=cgprobe$$
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot make a network namespace (no CAP_NET_ADMIN here?)"
    return
  fi
  ip netns del "$probe"
}

# cgroup_kind: v2 where the unified hierarchy at /sys/fs/cgroup offers
# the cpu controller, v1 where a v1 hierarchy has cpu, else none.
cgroup_kind() {
  if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    echo v2
  elif [ -n "$(cgroup_v1_cpu_dir)" ]; then
    echo v1
  else
    echo none
  fi
}

cgroup_v1_cpu_dir() {
  awk '$3 == "cgroup" && $4 ~ /(^|,)cpu(,|$)/ { print $2; exit }' /proc/mounts
}

cgroup_dir() { # NAME SIDE
  case $(cgroup_kind) in
    v2) echo "/sys/fs/cgroup/cgrig-$1-$2" ;;
    v1) echo "$(cgroup_v1_cpu_dir)/cgrig-$1-$2" ;;
  esac
}

check_name() {
  [[ ${1:-} =~ ^[A-Za-z0-9]{1,8}$ ]] || die "NAME must be 1-8 letters or digits: '${1:-}'"
}

ns() { echo "cgrig-$1-$2"; } # NAME SIDE

# bytes RATE: tc's rate (bit, kbit, mbit, gbit; k/m/g are 1000s) in bytes/s.
bytes_per_s() {
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+)([kmg]?)(bit|bps)?$ ]] || die "rate '$1': use e.g. 10gbit, 500mbit"
  n=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case $unit in k) n=$((n * 1000)) ;; m) n=$((n * 1000000)) ;; g) n=$((n * 1000000000)) ;; esac
  [ "${BASH_REMATCH[3]}" = bps ] && echo "$n" || echo $((n / 8))
}

quota_us() { # PERCENT
  if ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -lt 1 ]; then
    die "quota '$1': a percent of one core, at least 1"
  fi
  echo $(($1 * 1000))
}

# shape NS: tbf at $rate (and netem's $delay before it) on NS's end.
shape() {
  local n=$1
  if [ -n "$delay" ]; then
    if ! tc -n "$n" qdisc add dev "$DEV" root handle 1: netem delay "$delay" 2>/dev/null; then
      die "--delay $delay: this kernel has no netem (sch_netem, CONFIG_NET_SCH_NETEM); no delay can be added"
    fi
    tc -n "$n" qdisc add dev "$DEV" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  else
    tc -n "$n" qdisc add dev "$DEV" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

# limit NAME SIDE QUOTA: the side's cgroup with QUOTA percent of a core
# (empty: no limit; a cgroup all the same, so that a process one side
# starts on the other, the server from the trainer's, leaves the first's).
limit() {
  local dir us=max
  [ -n "$3" ] && us=$(quota_us "$3")
  dir=$(cgroup_dir "$1" "$2")
  case $(cgroup_kind) in
    v2)
      grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control ||
        echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
      mkdir -p "$dir"
      echo "$us 100000" >"$dir/cpu.max"
      ;;
    v1)
      mkdir -p "$dir"
      echo 100000 >"$dir/cpu.cfs_period_us"
      [ "$us" = max ] && us=-1
      echo "$us" >"$dir/cpu.cfs_quota_us"
      ;;
    *) die "a CPU quota needs cgroup v2's or v1's cpu controller; this machine has neither" ;;
  esac
}

check_cpus() { # LIST
  [ -z "$1" ] && return
  taskset -c "$1" true 2>/dev/null || die "cpus '$1': not cores this process may use ($(taskset -pc $$ | sed 's/.*: //'))"
}

cmd_up() {
  local name=$1
  shift
  rate=10gbit burst="" mtu=65535 delay="" trn_cpus="" srv_cpus="" trn_quota="" srv_quota=""
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) rate=$2 ;;
      --burst) burst=$2 ;;
      --mtu) mtu=$2 ;;
      --delay) delay=$2 ;;
      --trn-cpus) trn_cpus=$2 ;;
      --srv-cpus) srv_cpus=$2 ;;
      --trn-quota) trn_quota=$2 ;;
      --srv-quota) srv_quota=$2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
    shift 2 || die "up: $1 needs a value"
  done
  local bps
  bps=$(bytes_per_s "$rate")
  if [ -z "$burst" ]; then
    burst=$((bps / 250))
    [ "$burst" -lt 65536 ] && burst=65536
  fi
  check_cpus "$trn_cpus"
  check_cpus "$srv_cpus"
  [ -e "$STATE_ROOT/$name" ] && die "rig $name is up already (rig.sh down $name)"
  # Anything half made is removed on the way out.
  rig_name=$name
  trap 'cmd_down "$rig_name" >/dev/null 2>&1' EXIT
  mkdir -p "$STATE_ROOT/$name"
  local t s
  t=$(ns "$name" trn)
  s=$(ns "$name" srv)
  ip netns add "$t"
  ip netns add "$s"
  ip -n "$t" link set lo up
  ip -n "$s" link set lo up
  ip -n "$t" link add "$DEV" type veth peer name "$DEV" netns "$s"
  ip -n "$t" addr add "$TRN_ADDR/$PREFIX" dev "$DEV"
  ip -n "$s" addr add "$SRV_ADDR/$PREFIX" dev "$DEV"
  ip -n "$t" link set "$DEV" mtu "$mtu" up
  ip -n "$s" link set "$DEV" mtu "$mtu" up
  shape "$t"
  shape "$s"
  if [ -n "$trn_quota$srv_quota" ]; then
    limit "$name" trn "$trn_quota"
    limit "$name" srv "$srv_quota"
  fi
  # A side without cores of its own gets every core up had, not those of
  # the process that runs exec.
  [ -n "$trn_cpus" ] || trn_cpus=$(taskset -pc $$ | sed 's/.*: //')
  [ -n "$srv_cpus" ] || srv_cpus=$(taskset -pc $$ | sed 's/.*: //')
  cat >"$STATE_ROOT/$name/config" <<EOF
rate=$rate
burst=$burst
mtu=$mtu
delay=$delay
trn_cpus=$trn_cpus
srv_cpus=$srv_cpus
trn_quota=$trn_quota
srv_quota=$srv_quota
cgroup=$(cgroup_kind)
EOF
  trap - EXIT
  echo "rig $name up: $TRN_ADDR (trainer, $t) <-> $SRV_ADDR (server, $s), rate $rate burst $burst mtu $mtu${delay:+ delay $delay}"
}

config() { # NAME KEY
  local f=$STATE_ROOT/$1/config
  [ -f "$f" ] || die "rig $1 is not up"
  sed -n "s/^$2=//p" "$f"
}

cmd_exec() {
  local name=$1 side=${2:-}
  shift 2 || usage
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || usage
  case $side in trn | srv) ;; *) die "exec: side is trn or srv, not '$side'" ;; esac
  local dir
  dir=$(cgroup_dir "$name" "$side")
  # This shell joins the side's cgroup, if it has one; CMD (exec'd below)
  # stays in it.
  if [ -n "$dir" ] && [ -d "$dir" ]; then
    echo $$ >"$dir/cgroup.procs"
  fi
  # nsenter, not ip netns exec: that one mounts a /sys of its own, where
  # the cgroup hierarchies are missing for CMD's own exec of the other side.
  exec nsenter --net="/var/run/netns/$(ns "$name" "$side")" \
    taskset -c "$(config "$name" "${side}_cpus")" "$@"
}

# end_pids PID...: SIGTERM, up to 5 s, then SIGKILL: processes exec put
# in a rig's namespaces or cgroups.
end_pids() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local _
  for _ in $(seq 50); do
    kill -0 "$@" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

cmd_down() {
  local name=$1 side n dir
  for side in trn srv; do
    n=$(ns "$name" "$side")
    if [ -e "/var/run/netns/$n" ]; then
      # shellcheck disable=SC2046
      end_pids $(ip netns pids "$n")
      ip netns del "$n"
    fi
    dir=$(cgroup_dir "$name" "$side")
    if [ -n "$dir" ] && [ -d "$dir" ]; then
      if [ -f "$dir/cgroup.procs" ]; then
        # shellcheck disable=SC2046
        end_pids $(cat "$dir/cgroup.procs")
      fi
      rmdir "$dir"
    fi
  done
  rm -rf "${STATE_ROOT:?}/$name"
  echo "rig $name down"
}

cmd_show() {
  local f=$STATE_ROOT/$1/config
  [ -f "$f" ] || die "rig $1 is not up"
  echo "trn_addr=$TRN_ADDR"
  echo "srv_addr=$SRV_ADDR"
  cat "$f"
}

cmd_run() {
  local name=$1
  shift
  local up=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    up+=("$1")
    shift
  done
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || usage
  cmd_up "$name" "${up[@]}"
  # Down whatever happens to CMD: its exit, an error, or a signal to us
  # (wait returns at once on a trapped signal; down ends CMD then).
  trap 'cmd_down "$rig_name" >/dev/null' EXIT
  trap 'exit 130' INT TERM
  CG_RIG=$name CG_RIG_SERVER=$SRV_ADDR "$0" exec "$name" trn -- "$@" &
  local rc=0
  wait $! || rc=$?
  exit "$rc"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
  check)
    why=$(can_rig)
    [ -z "$why" ] && { echo "rig: this machine can build a rig (cgroup: $(cgroup_kind))"; exit 0; }
    echo "rig: skipped: $why"
    exit "$SKIP"
    ;;
  up | run | down | exec | show)
    check_name "${1:-}"
    if [ "$cmd" = up ] || [ "$cmd" = run ]; then
      why=$(can_rig)
      [ -z "$why" ] || { echo "rig: skipped: $why" >&2; exit "$SKIP"; }
    fi
    "cmd_$cmd" "$@"
    ;;
  *) usage ;;
esac
