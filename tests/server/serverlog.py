"""serverlog.py - reading convgrad-server's log in the server tests: the
times of its lines (UTC, millisecond stamps), for tests that assert how
long after one event another came."""
import time


def log_time(line):
    """The seconds of a server log line's UTC timestamp (comparable with
    other lines' only)."""
    return time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S")) + \
        float(line[19:23])


def line_times(path, needle):
    """The times of the log's lines holding needle, in order."""
    with open(path) as f:
        return [log_time(line) for line in f if needle in line]


def first_after(path, t, needle, wait_s):
    """The time of the first line with needle at or after t, waiting up to
    wait_s for it; None if it never came."""
    end = time.time() + wait_s
    while True:
        times = [x for x in line_times(path, needle) if x >= t]
        if times:
            return times[0]
        if time.time() > end:
            return None
        time.sleep(0.2)
