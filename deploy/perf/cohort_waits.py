#!/usr/bin/env python3
"""The cohort bound seen from the other process (issue 19, item 4), from two `lockctl bench
--timeline` files of one host: LOCAL (4 threads of one process, handing one lock over
in-process) and REMOTE (1 thread of another process on the same lock).

For each of REMOTE's acquisitions, counts LOCAL's grants between its start and its grant (both
CLOCK_MONOTONIC). Only waits inside LOCAL's recorded span count (LOCAL records its measured
window only, so a wait outside it would show too few grants).

What bounds the count: once REMOTE's FETCH_AND_ADD is at lockd, LOCAL's session has at most one
ticket ahead of it, and one remote grant goes through at most kMaxLocalHandovers (8) local
handovers, so at most 9 of LOCAL's grants; LOCAL's grants between REMOTE's start and the moment
its FETCH_AND_ADD reached lockd (one round trip), and grants made before REMOTE's start but seen
by their thread (and timed) after it, come on top. A LOCAL grant timed after REMOTE's own grant
was made after it, which its release must follow, so none is counted by mistake.

Prints one line of JSON: the waits counted, the maximum, p99 and mean of LOCAL grants a wait,
and how many waits saw more than 9.
"""
import bisect
import json
import sys


def read(path):
    with open(path) as f:
        return [tuple(int(x) for x in line.split()) for line in f if line.strip()]


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cohort_waits.py LOCAL.timeline REMOTE.timeline")
    local = sorted(g for _, g in read(sys.argv[1]))
    remote = read(sys.argv[2])
    if not local or not remote:
        sys.exit("cohort_waits.py: an empty timeline (did both runs measure?)")
    lo, hi = local[0], local[-1]
    counts = sorted(
        bisect.bisect_left(local, g) - bisect.bisect_right(local, s)
        for s, g in remote
        if s >= lo and g <= hi
    )
    if not counts:
        sys.exit("cohort_waits.py: no wait of the other process within the local run's span")
    n = len(counts)
    print(json.dumps({
        "waits": n,
        "max": counts[-1],
        "p99": counts[min(n - 1, (99 * n) // 100)],
        "mean": round(sum(counts) / n, 2),
        "over_9": sum(1 for c in counts if c > 9),
        "local_grants": len(local),
    }))


if __name__ == "__main__":
    main()
