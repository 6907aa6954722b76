#!/usr/bin/env python3
"""Checks deploy/monitoring's Grafana dashboard and Prometheus rules.

  check_monitoring.py dashboard [DIR]       the dashboard's JSON: it parses, has the template
                                            variables, and every panel the operators need, each
                                            with a data source, targets, a unit and a description;
                                            the rules have every alert; docs/operations.md
                                            describes each panel and alert
  check_monitoring.py served SCRAPE [DIR]   every metric (and every label value matched) that the
                                            dashboard and the rules use is in SCRAPE, the text of
                                            a live lockd's GET /metrics ("-" reads stdin)
  check_monitoring.py names [DIR]           prints the metric names they use

DIR is deploy/monitoring (default: this script's directory). Standard library only: it runs inside
the Soft-RoCE VM (tests/operator/run.sh) as well as on the host (ctest). Prints one line per
problem and a last line "check_monitoring: ... ok" or exits 1.
"""
import json
import os
import re
import sys

DASHBOARD = "rdmalock-dashboard.json"
RULES = "rdmalock-rules.yml"

# Series Prometheus makes itself, not lockd.
NOT_FROM_LOCKD = {"up"}
# Labels Prometheus attaches to every series of a target.
TARGET_LABELS = {"job", "instance"}
# What the dashboard must show (issue 20, item 3): each metric in some panel's expression.
REQUIRED = [
    "up",
    "rdmalock_lockd_sessions_connected",
    "rdmalock_lockd_handshakes_accepted_total",
    "rdmalock_lockd_connections_joined_total",
    "rdmalock_lockd_handshakes_rejected_total",
    "rdmalock_lockd_sessions_ended_total",
    "rdmalock_lockd_recovered_requests_total",
    "rdmalock_lockd_recovery_pending",
    "rdmalock_lockd_locks_held",
    "rdmalock_lockd_locks_contended",
    "rdmalock_lockd_locks_frozen",
    "rdmalock_lockd_lock_requests_total",
    "rdmalock_lockd_grace_remaining_seconds",
    "rdmalock_lockd_epoch",
]
# The alerts the rules must have.
ALERTS = [
    "RdmalockLockdDown",
    "RdmalockRefusalsRising",
    "RdmalockSessionsFenced",
    "RdmalockLocksFrozen",
    "RdmalockRecoveriesPending",
    "RdmalockRestartGrace",
]

PROMQL_WORDS = {
    # functions and aggregations the files use or may use
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv", "changes",
    "resets", "time", "timestamp", "vector", "scalar", "absent", "absent_over_time", "abs",
    "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "histogram_quantile",
    "label_replace", "label_join", "sort", "sort_desc", "avg_over_time", "min_over_time",
    "max_over_time", "sum_over_time", "count_over_time", "last_over_time", "present_over_time",
    "quantile_over_time", "label_values", "query_result",
    # keywords
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless",
    "bool", "offset", "inf", "nan",
}


def rule_exprs(path):
    """(alert name, expr) of each rule, from the YAML without a YAML library: `expr:` inline or
    as a block scalar (| or >), which is how rdmalock-rules.yml writes them."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out = []
    name = None
    i = 0
    while i < len(lines):
        line = lines[i]
        m = re.match(r"^\s*- (?:alert|record):\s*(\S+)", line)
        if m:
            name = m.group(1)
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if m:
            indent, rest = len(m.group(1)), m.group(2).strip()
            if rest[:1] in ("|", ">"):
                body = []
                i += 1
                while i < len(lines) and (not lines[i].strip() or
                                          len(lines[i]) - len(lines[i].lstrip()) > indent):
                    body.append(lines[i].strip())
                    i += 1
                out.append((name, " ".join(b for b in body if b)))
                continue
            if rest[:1] in ("'", '"'):
                rest = rest[1:-1]
            out.append((name, rest))
        i += 1
    return out


def flatten(panels):
    for p in panels:
        yield p
        yield from flatten(p.get("panels", []))


def dashboard_exprs(dash):
    """(where, expr) of every query in the dashboard: panel targets, template variables and
    annotation queries."""
    out = []
    for p in flatten(dash.get("panels", [])):
        for t in p.get("targets", []):
            out.append((f"panel '{p.get('title')}'", t.get("expr", "")))
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query":
            out.append((f"variable {v.get('name')}", q.get("query") if isinstance(q, dict) else q))
    for a in dash.get("annotations", {}).get("list", []):
        if a.get("expr"):
            out.append((f"annotation '{a.get('name')}'", a["expr"]))
    return out


def selectors(expr):
    """(metric, [(label, op, value)]) of each series selector in a PromQL expression (or a
    Grafana label_values() query). A selector with no metric name before its braces is returned
    with the name ""."""
    blocks = []

    def keep(m):
        blocks.append(m.group(0))
        return f" @{len(blocks) - 1}@ "

    s = re.sub(r'\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\}', keep, expr)  # label matchers, set aside
    s = re.sub(r'"(?:[^"\\]|\\.)*"', " ", s)  # other strings (label_replace's arguments)
    s = re.sub(r"\[[^\]]*\]", " ", s)  # range and subquery durations
    # label lists: by (...), without (...), on (...), ignoring (...), group_left (...)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    s = re.sub(r"\blabel_values\s*\(([^,()]*),[^()]*\)", r" \1 ", s)  # its label argument
    found = []
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)?(\s*@(\d+)@)?|\S", s):
        name, block = m.group(1), m.group(3)
        if not name and block is None:
            continue
        rest = s[m.end():].lstrip()
        if name and (rest.startswith("(") or name.lower() in PROMQL_WORDS):
            continue
        if name and m.start() > 0 and (s[m.start() - 1].isdigit() or s[m.start() - 1] == "."):
            continue  # the exponent or unit of a number
        matchers = []
        if block is not None:
            for lm in re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"',
                                  blocks[int(block)]):
                matchers.append((lm.group(1), lm.group(2), lm.group(3)))
        found.append((name or "", matchers))
    return found


def parse_scrape(text):
    """{metric: {label: set(values)}} of the exposition text, with _bucket/_sum/_count for
    histograms and _sum/_count for summaries."""
    series = {}
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            parts = line.split()
            if len(parts) >= 4:
                types[parts[2]] = parts[3]
            continue
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s+\S+", line)
        if not m:
            continue
        labels = series.setdefault(m.group(1), {})
        for lm in re.finditer(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""):
            labels.setdefault(lm.group(1), set()).add(lm.group(2))
    for name, t in types.items():
        suffixes = {"histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}
        for suf in suffixes.get(t, []):
            series.setdefault(name + suf, {})
        series.setdefault(name, {})
    return series


def used(d):
    """[(where, metric, matchers)] over the dashboard and the rules in directory d."""
    dash = json.load(open(os.path.join(d, DASHBOARD), encoding="utf-8"))
    out = []
    for where, expr in dashboard_exprs(dash):
        for metric, matchers in selectors(expr or ""):
            out.append((f"{DASHBOARD}: {where}", metric, matchers))
    for name, expr in rule_exprs(os.path.join(d, RULES)):
        for metric, matchers in selectors(expr):
            out.append((f"{RULES}: {name}", metric, matchers))
    return out


def check_served(scrape_text, d):
    served = parse_scrape(scrape_text)
    problems = []
    names = set()
    for where, metric, matchers in used(d):
        if not metric:
            problems.append(f"{where}: a selector without a metric name")
            continue
        names.add(metric)
        if metric in NOT_FROM_LOCKD:
            continue
        if metric not in served:
            problems.append(f"{where}: {metric} is not served by lockd")
            continue
        for label, op, value in matchers:
            if label in TARGET_LABELS or "$" in value:
                continue
            have = served[metric].get(label)
            if have is None:
                problems.append(f"{where}: {metric} has no label {label}")
                continue
            words = value.split("|") if op in ("=~", "!~") else [value]
            for w in words:
                if not re.fullmatch(r"[A-Za-z0-9_]+", w):
                    continue  # a real regex: not checked value by value
                if w not in have:
                    problems.append(f'{where}: {metric}{{{label}="{w}"}} is not served by lockd '
                                    f"(it serves {', '.join(sorted(have))})")
    for p in problems:
        print(f"check_monitoring: {p}")
    if problems:
        return 1
    print(f"check_monitoring: {len(names)} metric names used by {DASHBOARD} and {RULES}, all "
          f"served by lockd (or by Prometheus: {', '.join(sorted(NOT_FROM_LOCKD & names))}): ok")
    return 0


def check_dashboard(d):
    problems = []
    path = os.path.join(d, DASHBOARD)
    try:
        dash = json.load(open(path, encoding="utf-8"))
    except (OSError, ValueError) as e:
        print(f"check_monitoring: {path} does not parse: {e}")
        return 1
    for key in ("uid", "title", "schemaVersion", "panels", "templating"):
        if key not in dash:
            problems.append(f"no '{key}'")
    if dash.get("schemaVersion", 0) < 36:
        problems.append(f"schemaVersion {dash.get('schemaVersion')} is older than Grafana 9's")
    variables = {v.get("name"): v for v in dash.get("templating", {}).get("list", [])}
    ds = variables.get("datasource")
    if not ds or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        problems.append("no 'datasource' template variable of Prometheus data sources")
    if "instance" not in variables:
        problems.append("no 'instance' template variable")
    ids = set()
    exprs = []
    count = 0
    for p in flatten(dash.get("panels", [])):
        title = p.get("title", "?")
        if p.get("id") in ids:
            problems.append(f"panel '{title}': id {p.get('id')} used twice")
        ids.add(p.get("id"))
        if "gridPos" not in p:
            problems.append(f"panel '{title}': no gridPos")
        if p.get("type") == "row":
            continue
        count += 1
        src = p.get("datasource") or {}
        if src.get("uid") != "${datasource}" or src.get("type") != "prometheus":
            problems.append(f"panel '{title}': its datasource is not the 'datasource' variable")
        if not p.get("description"):
            problems.append(f"panel '{title}': no description")
        if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
            problems.append(f"panel '{title}': no unit")
        targets = p.get("targets") or []
        if not targets:
            problems.append(f"panel '{title}': no targets")
        refs = set()
        for t in targets:
            if not t.get("expr"):
                problems.append(f"panel '{title}': a target without an expression")
            if not t.get("refId") or t.get("refId") in refs:
                problems.append(f"panel '{title}': a target without a unique refId")
            refs.add(t.get("refId"))
            tsrc = t.get("datasource") or {}
            if tsrc and tsrc.get("uid") != "${datasource}":
                problems.append(f"panel '{title}': a target with another data source")
            for metric, matchers in selectors(t.get("expr", "")):
                exprs.append(metric)
                if metric and not any(l == "instance" and "$instance" in v
                                      for l, _, v in matchers):
                    problems.append(f"panel '{title}': {metric} is not filtered by $instance")
    for m in REQUIRED:
        if m not in exprs:
            problems.append(f"no panel shows {m}")
    alerts = [n for n, _ in rule_exprs(os.path.join(d, RULES))]
    for a in ALERTS:
        if a not in alerts:
            problems.append(f"{RULES} has no alert {a}")
    # docs/operations.md describes each panel (a row of its table) and each alert (a section).
    ops = os.path.join(d, "..", "..", "docs", "operations.md")
    if os.path.exists(ops):
        text = open(ops, encoding="utf-8").read()
        for p in flatten(dash.get("panels", [])):
            if p.get("type") != "row" and f"\n| {p.get('title')} |" not in text:
                problems.append(f"docs/operations.md does not describe panel '{p.get('title')}'")
        for a in alerts:
            if f"\n##### {a}\n" not in text:
                problems.append(f"docs/operations.md has no section for alert {a}")
    for p in problems:
        print(f"check_monitoring: {DASHBOARD}: {p}")
    if problems:
        return 1
    print(f"check_monitoring: {DASHBOARD}: {count} panels, each with the datasource variable, "
          f"targets, a unit and a description; {len(set(REQUIRED))} required metrics shown; "
          f"{len(alerts)} alerts in {RULES}"
          f"{', all described in docs/operations.md' if os.path.exists(ops) else ''}: ok")
    return 0


def main(argv):
    if len(argv) < 2 or argv[1] not in ("dashboard", "served", "names"):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    here = os.path.dirname(os.path.abspath(__file__))
    if argv[1] == "served":
        if len(argv) < 3:
            print("check_monitoring: served needs the scrape's file (or -)", file=sys.stderr)
            return 2
        text = sys.stdin.read() if argv[2] == "-" else open(argv[2], encoding="utf-8").read()
        return check_served(text, argv[3] if len(argv) > 3 else here)
    d = argv[2] if len(argv) > 2 else here
    if argv[1] == "names":
        for n in sorted({m for _, m, _ in used(d)}):
            print(n)
        return 0
    return check_dashboard(d)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
