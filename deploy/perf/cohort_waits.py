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

With fencing tokens (both runs with --token) the count is also taken exactly, without the
clocks: a token is epoch | generation | ticket | local (docs/protocol.md, section 6), so
token >> 4 numbers the remote grants of the lock in the order lockd's word issued them, and the
local bits number the in-process handovers of one. LOCAL holds at most one remote ticket at a
time (only the thread that owns the cohort entry queues at lockd), so once REMOTE's ticket is
issued the only LOCAL grants it waits for are those of the remote grant just before its own in
that order, when that one is LOCAL's: "exact" counts them (at most 9).

Prints one line of JSON: the waits counted and, of LOCAL grants a wait by the clocks (clock_)
and with tokens exactly (exact_), the maximum, p99, mean and how many waits saw more than 9.
"""
import bisect
import json
import sys


def read(path):
    """(start, granted, token) a line; token 0 where the file has none or the run had none."""
    rows = []
    with open(path) as f:
        for line in f:
            v = [int(x) for x in line.split()]
            if v:
                rows.append((v[0], v[1], v[2] if len(v) > 2 else 0))
    return rows


def stats(prefix, counts):
    counts = sorted(counts)
    n = len(counts)
    return {
        prefix + "max": counts[-1],
        prefix + "p99": counts[min(n - 1, (99 * n) // 100)],
        prefix + "mean": round(sum(counts) / n, 2),
        prefix + "over_9": sum(1 for c in counts if c > 9),
    }


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: cohort_waits.py LOCAL.timeline REMOTE.timeline")
    local_rows = read(sys.argv[1])
    remote = read(sys.argv[2])
    if not local_rows or not remote:
        sys.exit("cohort_waits.py: an empty timeline (did both runs measure?)")
    local = sorted(g for _, g, _ in local_rows)
    lo, hi = local[0], local[-1]
    inside = [(s, g, t) for s, g, t in remote if s >= lo and g <= hi]
    if not inside:
        sys.exit("cohort_waits.py: no wait of the other process within the local run's span")
    out = {"waits": len(inside), "local_grants": len(local)}
    out.update(stats("clock_", [bisect.bisect_left(local, g) - bisect.bisect_right(local, s)
                      for s, g, _ in inside]))
    if all(t != 0 for _, _, t in local_rows) and all(t != 0 for _, _, t in remote):
        per_grant = {}  # LOCAL's grants by the remote grant (token >> 4) they came from
        for _, _, t in local_rows:
            per_grant[t >> 4] = per_grant.get(t >> 4, 0) + 1
        ids = sorted(set(per_grant) | {t >> 4 for _, _, t in remote})
        exact = []
        for _, _, t in inside:
            i = bisect.bisect_left(ids, t >> 4)
            exact.append(per_grant.get(ids[i - 1], 0) if i > 0 else 0)
        out.update(stats("exact_", exact))
        out["local_grants_per_remote_grant_max"] = max(per_grant.values())
    print(json.dumps(out, separators=(",", ":")))

if __name__ == "__main__":
    main()
