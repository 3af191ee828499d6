"""The CPU quota this process runs under (a container's CPU limit, a
systemd CPUQuota=, tests/net/rig.sh's --trn-quota): what offload's
local_share="auto" needs to cost the trainer's own rows, and what
tests/bench/bench_train.py reports. Reads cgroup v2's cpu.max or v1's cpu
controller, whichever holds this process's cpu cgroup."""
import os


def _v1_cpu_mount(mounts):
    """cgroup v1's cpu controller's mount point, or None."""
    for line in mounts:
        f = line.split()
        if len(f) > 3 and f[2] == "cgroup" and "cpu" in f[3].split(","):
            return f[1]
    return None


def _cgroup_dirs(root, path):
    """root + path and each of its ancestors up to root, leaf first."""
    parts = [p for p in path.split("/") if p]
    return [os.path.join(root, *parts[:n]) for n in range(len(parts), -1, -1)]


def _read(path):
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return None


def cpu_quota(proc_cgroup="/proc/self/cgroup", proc_mounts="/proc/mounts",
              v2_root="/sys/fs/cgroup"):
    """(cores, throttled_ms): the CPU this process may use over time, in
    cores (0.5: half of one), the tightest quota of its cgroup and the
    cgroups above it, None without one; and the ms its own cgroup has
    been throttled so far (0.0 where unknown). The arguments are the
    files it reads, for tests."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
        with open(proc_mounts) as f:
            mounts = f.readlines()
    except OSError:
        return None, 0.0
    v1 = next((path for _, controllers, path in lines
               if "cpu" in controllers.split(",")), None)
    if v1 is not None:
        root = _v1_cpu_mount(mounts)
        if root is None:
            return None, 0.0
        dirs, v2 = _cgroup_dirs(root, v1), False
    else:
        path = next((path for hid, _, path in lines if hid == "0"), None)
        if path is None:
            return None, 0.0
        dirs, v2 = _cgroup_dirs(v2_root, path), True
    cores = None
    for d in dirs:
        if v2:
            f = _read(os.path.join(d, "cpu.max"))
            quota, period = (f[0], f[1]) if f and len(f) == 2 else ("max", 1)
        else:
            q = _read(os.path.join(d, "cpu.cfs_quota_us"))
            p = _read(os.path.join(d, "cpu.cfs_period_us"))
            quota, period = (q[0], p[0]) if q and p else ("-1", 1)
        if quota not in ("max", "-1") and int(period) > 0:
            c = int(quota) / int(period)
            cores = c if cores is None else min(cores, c)
    stat = _read(os.path.join(dirs[0], "cpu.stat")) or []
    stat = dict(zip(stat[::2], stat[1::2]))
    throttled = (int(stat.get("throttled_usec", 0)) / 1e3 if v2 else
                 int(stat.get("throttled_time", 0)) / 1e6)
    return cores, throttled


def sustained_ms(wall_ms, cpu_ms, cores):
    """What work that took wall_ms and cpu_ms of this process's CPU costs
    when it runs again and again under a quota of cores: at least its
    CPU over the quota's rate, which one run alone need not show (it can
    fit in a quota period's budget); wall_ms without a quota."""
    if cores is None or cores <= 0:
        return wall_ms
    return max(wall_ms, cpu_ms / cores)
