#!/usr/bin/env python3
"""Checks that the project's C++ includes follow its one dependency order (docs/architecture.md):

    proto -> common -> engine -> client (the SDK), server (lockd) -> lockctl -> tests

A file may include its own part and the parts before it, never one after it, and the SDK and
lockd never include each other. And only the verbs layer calls verbs and rdma_cm: no file but
common/rdma/verbs.cc, engine/verbs_memory.cc (the SDK's verbs backend), tests/rdma/raw_peer.cc
(the RDMA tests' hand-made peers) and deploy/perf/bare_lock.cc (the performance suite's bare lock)
makes a raw ibv_*/rdma_* call. The performance suite's C++ (deploy/perf) ranks with the tests.
Prints each offence and exits 1; prints "layout: includes follow the dependency order" and exits
0 otherwise. Usage: check_deps.py ROOT
"""
import os
import re
import sys

root = sys.argv[1]
RANK = {"proto": 0, "common": 1, "engine": 2, "client": 3, "server": 3, "lockctl": 4, "tests": 5}


def part_of_path(rel):
    if rel.startswith("proto/"):
        return "proto"
    if rel.startswith("common/"):
        return "common"
    if rel.startswith("engine/"):
        return "engine"
    if rel.startswith("server/"):
        return "server"
    if rel.startswith("client/lockctl/"):
        return "lockctl"
    if rel.startswith("client/") or rel.startswith("python/"):
        return "client"
    if rel.startswith("tests/") or rel.startswith("deploy/perf/"):
        return "tests"
    return None


def part_of_include(inc):
    # Public headers keep their installed names.
    for prefix, part in (("rdmalock/proto/", "proto"),):
        if inc.startswith(prefix):
            return part
    if inc.startswith("rdmalock/"):
        name = inc[len("rdmalock/"):]
        if os.path.exists(os.path.join(root, "common/include/rdmalock", name)):
            return "common"
        if os.path.exists(os.path.join(root, "client/include/rdmalock", name)):
            return "client"
        return None
    return part_of_path(inc)


RAW_ALLOWED = {
    "common/rdma/verbs.cc",
    "engine/verbs_memory.cc",
    "tests/rdma/raw_peer.cc",
    # The benchmark's bare ticket lock: on purpose as bare as possible, it posts and polls with
    # ibv_post_send/ibv_poll_cq itself, as the SDK's backend does, so that the ratio to it measures
    # what rdmalock adds and not a wrapper's cost.
    "deploy/perf/bare_lock.cc",
}
RAW_CALL = re.compile(r"\b(?:ibv|rdma)_[a-z0-9_]+\s*\(")

bad = []
checked = 0
for top in ("proto", "common", "engine", "server", "client", "tests", "deploy/perf"):
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in files:
            if not f.endswith((".h", ".cc", ".c")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            mine = part_of_path(rel)
            with open(path, encoding="utf-8", errors="replace") as fh:
                for n, line in enumerate(fh, 1):
                    code = line.split("//", 1)[0]
                    if rel not in RAW_ALLOWED and RAW_CALL.search(code):
                        bad.append(f"{rel}:{n}: a raw verbs/rdma_cm call outside the verbs layer")
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    checked += 1
                    inc = m.group(1)
                    theirs = part_of_include(inc)
                    if theirs is None:
                        bad.append(f"{rel}:{n}: \"{inc}\" is not from the repository root")
                    elif RANK[theirs] > RANK[mine] or (
                        RANK[theirs] == RANK[mine] and theirs != mine
                    ):
                        bad.append(f"{rel}:{n}: {mine} includes {theirs} (\"{inc}\")")
for b in bad:
    print("layout:", b)
if bad or checked == 0:
    sys.exit(1)
print(f"layout: includes follow the dependency order ({checked} includes checked), "
      "and only the verbs layer calls verbs")
