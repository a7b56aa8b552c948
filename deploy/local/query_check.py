#!/usr/bin/env python3
"""Asks a running Prometheus every query the deploy artifacts depend on, and
fails when one returns no data:

  - the left side of each alert in deploy/prometheus/alerts.yml (the part
    before its single top-level comparison), which must answer whenever the
    metric exists;
  - every target of every panel in deploy/grafana/shardstock.json, with the
    dashboard variables $event and $release set to ".*" (all).

Run it after a sale against the Prometheus of deploy/local/up.sh:
    . /tmp/shardstock-local/env && deploy/local/query_check.py "$PROMETHEUS_URL"
A result whose samples are all NaN (e.g. a latency quantile while no request
is in the window) counts as data, and is reported as such.
"""
import json
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parents[1]
COMPARISONS = ("==", "!=", ">=", "<=", ">", "<")


def left_side(expr):
    """The expression before the last comparison at nesting depth 0."""
    depth, quote, cut = 0, None, None
    i = 0
    while i < len(expr):
        c = expr[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'`":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            for op in COMPARISONS:
                # `=~` inside selectors is at depth > 0; `=` alone is not PromQL here.
                if expr.startswith(op, i):
                    cut = i
                    i += len(op) - 1
                    break
        i += 1
    if cut is None:
        raise ValueError(f"no top-level comparison in: {expr}")
    return expr[:cut].strip()


def queries():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    for g in rules["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                yield f"alert {r['alert']}", left_side(r["expr"])
    dash = json.loads((DEPLOY / "grafana" / "shardstock.json").read_text())

    def walk(panels):
        for p in panels:
            yield p
            yield from walk(p.get("panels", []))

    for p in walk(dash["panels"]):
        for t in p.get("targets", []):
            expr = (
                t["expr"].replace("$event", ".*").replace("$release", ".*")
                .replace("$__rate_interval", "1m")
            )
            yield f"panel '{p['title']}' {t['refId']}", expr


def ask(prom, expr):
    url = prom.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = json.load(resp)
    if body.get("status") != "success":
        raise RuntimeError(body)
    return body["data"]["result"]


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} PROMETHEUS_URL")
    prom = sys.argv[1]
    failed = 0
    for what, expr in queries():
        try:
            res = ask(prom, expr)
        except Exception as e:  # a query Prometheus refuses is a failure too
            print(f"FAIL  {what}: {e}\n      {expr}")
            failed += 1
            continue
        if not res:
            print(f"FAIL  {what}: no data\n      {expr}")
            failed += 1
        else:
            nan = all(r["value"][1] in ("NaN", "+Inf", "-Inf") for r in res)
            print(f"ok    {what}: {len(res)} series{' (NaN/Inf only)' if nan else ''}")
    total = sum(1 for _ in queries())
    print(f"{total - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
