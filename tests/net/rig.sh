#!/usr/bin/env bash
# rig.sh - a trainer and a server (or a pool of them) on one machine,
# joined by shaped links: network namespaces of this script's own
# (NAME-trn, NAME-srv, and with --replicas N also NAME-srv1 ... and a
# switch NAME-sw), each with its loopback up, veth pairs made inside them
# (the root namespace never sees one), tc tbf at --rate on both ends of
# every link, and per side the cores (taskset) and a CPU quota (cgroup
# v2's cpu.max, or v1's cpu controller, whichever this machine has).
#
# One replica (the default): one veth pair, 10.231.0.1/30 on the
# trainer's end and 10.231.0.2/30 on the server's (addresses that exist
# only inside these namespaces). N replicas: the trainer's link and one
# link per replica meet at a bridge in NAME-sw, a switch: the trainer's
# one NIC (10.231.0.1/24, --rate each way, shared by every replica's
# traffic) and each replica's own (10.231.0.2, .3, ... /24, --rate each).
#
#   rig.sh up NAME [options]      build the rig (torn down again on failure)
#   rig.sh exec NAME SIDE -- CMD...
#                                 run CMD in a side's namespace, cgroup and
#                                 cores; SIDE is trn, srv (replica 0) or
#                                 srvI (replica I, 1 <= I < N)
#   rig.sh quota NAME SIDE P      set a side's CPU quota now: P percent of
#                                 one core, or max (its processes stay; the
#                                 side needs a cgroup: up with a quota)
#   rig.sh run NAME [options] -- CMD...
#                                 up, CMD on the trainer's side with
#                                 CG_RIG=NAME, CG_RIG_SERVER=10.231.0.2 and
#                                 CG_RIG_SERVERS (every replica's address,
#                                 comma-separated), then down, whatever CMD
#                                 does (trap); exits with CMD's status
#   rig.sh down NAME              tear it down: idempotent, also after a
#                                 failed or interrupted up
#   rig.sh show NAME              what the rig is (one line per setting)
#   rig.sh check                  whether this machine can build a rig
#                                 (exit 0), else why not (exit 77)
#
# Options of up and run:
#   --rate R           tbf rate of both ends of each link, tc's units
#                      (10gbit, 1gbit, 500mbit); default 10gbit
#   --burst B          tbf burst (default: 4 ms at the rate, at least 64kb)
#   --mtu N            the veths' MTU (default 65535: a real NIC segments and
#                      coalesces in hardware, TSO and GRO, where a veth's
#                      1500-byte packets cost the kernel per packet on the
#                      very cores measured: 2-3 Gbit/s at most here)
#   --delay D          added one-way delay per end (netem; this script says
#                      so and fails where the kernel has no netem)
#   --replicas N       server namespaces, 1 to 8 (default 1)
#   --trn-cpus LIST    trainer's cores (taskset -c list); default: all
#   --srv-cpus LIST    server's cores (every replica's unless --srvI-cpus
#                      says otherwise); default: all
#   --srvI-cpus LIST   replica I's cores (1 <= I < N)
#   --trn-quota P      trainer's CPU quota, percent of one core per 100 ms
#                      period (50: half a core); default: none
#   --srv-quota P      the server's (every replica's unless --srvI-quota)
#   --srvI-quota P     replica I's
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
REPLICAS_MAX=8
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

# replica_sides N: the sides of N replicas (srv srv1 ... srvN-1).
replica_sides() {
  local i
  echo srv
  for ((i = 1; i < $1; i++)); do echo "srv$i"; done
}

# srv_addr N I: replica I's address in a rig of N replicas.
srv_addr() {
  if [ "$1" = 1 ]; then echo "$SRV_ADDR"; else echo "10.231.0.$((2 + $2))"; fi
}

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

# shape NS DEV: tbf at $rate (and netem's $delay before it) on DEV, NS's
# end of a link.
shape() {
  local n=$1 dev=$2
  if [ -n "$delay" ]; then
    if ! tc -n "$n" qdisc add dev "$dev" root handle 1: netem delay "$delay" 2>/dev/null; then
      die "--delay $delay: this kernel has no netem (sch_netem, CONFIG_NET_SCH_NETEM); no delay can be added"
    fi
    tc -n "$n" qdisc add dev "$dev" parent 1:1 handle 10: tbf rate "$rate" burst "$burst" latency 100ms
  else
    tc -n "$n" qdisc add dev "$dev" root tbf rate "$rate" burst "$burst" latency 100ms
  fi
}

# link NS1 DEV1 NS2 DEV2: a veth pair between two namespaces, up at $mtu
# and shaped on both ends.
link() {
  ip -n "$1" link add "$2" type veth peer name "$4" netns "$3"
  ip -n "$1" link set "$2" mtu "$mtu" up
  ip -n "$3" link set "$4" mtu "$mtu" up
  shape "$1" "$2"
  shape "$3" "$4"
}

# limit NAME SIDE QUOTA: the side's cgroup with QUOTA percent of a core
# (empty or max: no limit; a cgroup all the same, so that a process one
# side starts on the other, the server from the trainer's, leaves the
# first's).
limit() {
  local dir us=max
  [ -n "$3" ] && [ "$3" != max ] && us=$(quota_us "$3")
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
  rate=10gbit burst="" mtu=65535 delay="" replicas=1
  local -A cpus=() quota=()
  local side
  while [ $# -gt 0 ]; do
    [ $# -ge 2 ] || die "up: $1 needs a value"
    side=${1#--}
    case $1 in
      --rate) rate=$2 ;;
      --burst) burst=$2 ;;
      --mtu) mtu=$2 ;;
      --delay) delay=$2 ;;
      --replicas) replicas=$2 ;;
      --trn-cpus | --srv-cpus | --srv[1-7]-cpus) cpus[${side%-cpus}]=$2 ;;
      --trn-quota | --srv-quota | --srv[1-7]-quota) quota[${side%-quota}]=$2 ;;
      *) die "up: unknown option '$1'" ;;
    esac
    shift 2
  done
  [[ $replicas =~ ^[1-8]$ ]] || die "--replicas '$replicas': 1 to $REPLICAS_MAX"
  local sides i
  sides="trn $(replica_sides "$replicas" | tr '\n' ' ')"
  for side in "${!cpus[@]}" "${!quota[@]}"; do
    [[ " $sides " == *" $side "* ]] || die "--$side-*: no such side with --replicas $replicas"
  done
  # A replica without cores or a quota of its own has the server's.
  for side in $sides; do
    if [ "$side" != trn ]; then
      [ -n "${cpus[$side]:-}" ] || cpus[$side]=${cpus[srv]:-}
      [ -n "${quota[$side]:-}" ] || quota[$side]=${quota[srv]:-}
    fi
  done
  local bps
  bps=$(bytes_per_s "$rate")
  if [ -z "$burst" ]; then
    burst=$((bps / 250))
    [ "$burst" -lt 65536 ] && burst=65536
  fi
  for side in $sides; do check_cpus "${cpus[$side]:-}"; done
  [ -e "$STATE_ROOT/$name" ] && die "rig $name is up already (rig.sh down $name)"
  # Anything half made is removed on the way out.
  rig_name=$name
  trap 'cmd_down "$rig_name" >/dev/null 2>&1' EXIT
  mkdir -p "$STATE_ROOT/$name"
  local t sw="" addrs="" any_quota=""
  for side in $sides; do
    ip netns add "$(ns "$name" "$side")"
    ip -n "$(ns "$name" "$side")" link set lo up
  done
  t=$(ns "$name" trn)
  if [ "$replicas" = 1 ]; then
    link "$t" "$DEV" "$(ns "$name" srv)" "$DEV"
    ip -n "$t" addr add "$TRN_ADDR/$PREFIX" dev "$DEV"
    ip -n "$(ns "$name" srv)" addr add "$SRV_ADDR/$PREFIX" dev "$DEV"
    addrs=$SRV_ADDR
  else
    # The switch: a bridge joining the trainer's link and each replica's.
    sw=$(ns "$name" sw)
    ip netns add "$sw"
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 up
    link "$t" "$DEV" "$sw" cgt
    ip -n "$sw" link set cgt master br0
    ip -n "$t" addr add "$TRN_ADDR/24" dev "$DEV"
    for ((i = 0; i < replicas; i++)); do
      side=$(replica_sides "$replicas" | sed -n "$((i + 1))p")
      link "$(ns "$name" "$side")" "$DEV" "$sw" "cgr$i"
      ip -n "$sw" link set "cgr$i" master br0
      ip -n "$(ns "$name" "$side")" addr add "$(srv_addr "$replicas" "$i")/24" dev "$DEV"
      addrs+=${addrs:+,}$(srv_addr "$replicas" "$i")
    done
  fi
  for side in $sides; do any_quota+=${quota[$side]:-}; done
  if [ -n "$any_quota" ]; then
    for side in $sides; do limit "$name" "$side" "${quota[$side]:-}"; done
  fi
  {
    echo "rate=$rate"
    echo "burst=$burst"
    echo "mtu=$mtu"
    echo "delay=$delay"
    echo "replicas=$replicas"
    echo "servers=$addrs"
    # A side without cores of its own gets every core up had, not those
    # of the process that runs exec.
    for side in $sides; do
      echo "${side}_cpus=${cpus[$side]:-$(taskset -pc $$ | sed 's/.*: //')}"
    done
    for side in $sides; do echo "${side}_quota=${quota[$side]:-}"; done
    echo "cgroup=$(cgroup_kind)"
  } >"$STATE_ROOT/$name/config"
  trap - EXIT
  echo "rig $name up: $TRN_ADDR (trainer, $t) <-> $addrs ($replicas server(s)${sw:+ behind the switch $sw}), rate $rate burst $burst mtu $mtu${delay:+ delay $delay}"
}

config() { # NAME KEY
  local f=$STATE_ROOT/$1/config
  [ -f "$f" ] || die "rig $1 is not up"
  sed -n "s/^$2=//p" "$f"
}

# check_side NAME SIDE: dies unless SIDE is one of rig NAME's.
check_side() {
  local n
  n=$(config "$1" replicas)
  n=${n:-1}
  [[ " trn $(replica_sides "$n" | tr '\n' ' ')" == *" $2 "* ]] ||
    die "side is trn, srv or srv1 to srv$((n - 1)) (rig $1 has $n replicas), not '$2'"
}

cmd_quota() {
  local name=$1 side=${2:-} pct=${3:-} dir
  [ -n "$pct" ] || usage
  check_side "$name" "$side"
  dir=$(cgroup_dir "$name" "$side")
  if [ -z "$dir" ] || [ ! -d "$dir" ]; then
    die "quota: $side has no cgroup (up with a quota, e.g. --$side-quota max)"
  fi
  limit "$name" "$side" "$pct"
  echo "rig $name: $side quota $pct"
}

cmd_exec() {
  local name=$1 side=${2:-}
  shift 2 || usage
  [ "${1:-}" = -- ] && shift
  [ $# -gt 0 ] || usage
  check_side "$name" "$side"
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
  # Every side a rig can have: down also ends a rig whose config up never
  # wrote.
  for side in trn sw $(replica_sides "$REPLICAS_MAX"); do
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
  CG_RIG=$name CG_RIG_SERVER=$SRV_ADDR CG_RIG_SERVERS=$(config "$name" servers) "$0" exec "$name" trn -- "$@" &
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
  up | run | down | exec | show | quota)
    check_name "${1:-}"
    if [ "$cmd" = up ] || [ "$cmd" = run ]; then
      why=$(can_rig)
      [ -z "$why" ] || { echo "rig: skipped: $why" >&2; exit "$SKIP"; }
    fi
    "cmd_$cmd" "$@"
    ;;
  *) usage ;;
esac
