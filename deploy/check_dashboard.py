#!/usr/bin/env python3
"""Checks deploy/grafana/tollgate.json against a real Prometheus.

Every query of every panel is sent to Prometheus's HTTP API (/api/v1/query), the way
Grafana would send it: the dashboard's variables replaced by the values given with
--var, Grafana's $__rate_interval by --rate-interval. Each must parse and return at
least one series with a number (not only NaN). The dashboard's structure is checked
too: unique panel ids, every panel on the ${datasource} variable, every variable a
query uses defined in the templating list.

Usage: check_dashboard.py DASHBOARD PROMETHEUS_URL [--var NAME=VALUE]...
                          [--rate-interval 5m] [--wait SECONDS]
Polls (bounded by --wait) until every query returns data; exits 1 listing the ones
that never did.
"""

import argparse
import json
import math
import re
import sys
import time
import urllib.parse
import urllib.request


def targets(dashboard):
    """(panel title, refId, expr) of every query, rows' nested panels included."""
    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    for p in walk(dashboard.get("panels", [])):
        for t in p.get("targets", []):
            yield p, t.get("refId", "?"), t.get("expr", "")


def structure(dashboard):
    problems = []
    ids = [p["id"] for p, _, _ in targets(dashboard)]
    all_ids = [p.get("id") for p in dashboard.get("panels", [])]
    if len(all_ids) != len(set(all_ids)):
        problems.append("panel ids are not unique")
    if not ids:
        problems.append("no panel has a query")
    defined = {v["name"] for v in dashboard.get("templating", {}).get("list", [])}
    for p, ref, expr in targets(dashboard):
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problems.append(f"{p['title']}: datasource must be the ${{datasource}} variable")
        if not expr.strip():
            problems.append(f"{p['title']} [{ref}]: empty expr")
        for name in re.findall(r"\$(\w+)", expr):
            if not name.startswith("__") and name not in defined:
                problems.append(f"{p['title']} [{ref}]: ${name} is not a dashboard variable")
    return problems


def promql_regex(value):
    """A variable's value as Grafana writes it into a =~ matcher: regex
    metacharacters escaped, the backslash doubled inside the PromQL string; an
    unset variable is its "All" value."""
    if value is None:
        return ".*"
    return re.sub(r"([\\.^$*+?()\[\]{}|])", r"\\\\\1", value)


def query(url, expr):
    q = urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(f"{url}/api/v1/query?{q}", timeout=5) as r:
            body = json.load(r)
    except urllib.error.HTTPError as e:
        body = json.load(e)
    except OSError as e:
        return None, f"cannot reach Prometheus: {e}"
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    return body["data"]["result"], None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dashboard")
    ap.add_argument("prometheus")
    ap.add_argument("--var", action="append", default=[])
    ap.add_argument("--rate-interval", default="5m")
    ap.add_argument("--wait", type=float, default=30)
    a = ap.parse_args()

    with open(a.dashboard) as f:
        dashboard = json.load(f)
    problems = structure(dashboard)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        sys.exit(1)
    values = dict(v.split("=", 1) for v in a.var)

    def expand(expr):
        expr = expr.replace("$__rate_interval", a.rate_interval)
        return re.sub(r"\$(\w+)", lambda m: promql_regex(values.get(m.group(1))), expr)

    pending = list(targets(dashboard))
    why = {}
    deadline = time.monotonic() + a.wait
    while True:
        still = []
        for p, ref, expr in pending:
            result, error = query(a.prometheus, expand(expr))
            numbers = [r for r in result or [] if not math.isnan(float(r["value"][1]))]
            if error or not numbers:
                why[(p["title"], ref)] = error or f"no data ({len(result or [])} series, all NaN)"
                still.append((p, ref, expr))
            else:
                print(f"PASS  panel {p['title']!r} [{ref}]: {len(numbers)} series")
        pending = still
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(1)
    for p, ref, expr in pending:
        print(f"FAIL  panel {p['title']!r} [{ref}]: {why[(p['title'], ref)]}\n      {expand(expr)}",
              file=sys.stderr)
    sys.exit(1 if pending else 0)


if __name__ == "__main__":
    main()
