"""Drives purchase.lua with a fixed workload, for script_cost.sh.

    python3 script_cost.py setup|run PORT SCRIPT FORMAT CALLS N [LIMIT]

FORMAT is the argument layout of the script under test: `orders` (today's
purchase.lua: one stream entry per call, its fields the index's order id and
entry pairs), `columns` (before the orders of a call shared an entry: a
column of stream records, `git show 89f010d:lua/purchase.lua`) or `rows`
(the layout before issue 12: ten values per entry, e.g.
`git show 8fc5f01:lua/purchase.lua`), or `groups` (purchase_groups.lua:
PER_CALL buckets a call, each a group of N entries in the `orders` layout;
SCRIPT is then lua/purchase_groups.lua, purchase.lua read beside it), or
`lean` (`groups` without the user and quantity columns when there is no
limit: today's layout, b0a8880 on; `groups` sends them always, as before).
`setup` fills each bucket as a sale
leaves it (hashes past their listpack size); `run` sends CALLS calls of N
one-unit purchases by random users with fresh request ids, pipelined. The
same seed gives the same calls, so two scripts get the same work.
"""
import os
import random
import sys

import redis

mode = sys.argv[1]
port, script, fmt = int(sys.argv[2]), sys.argv[3], sys.argv[4]
calls, n = int(sys.argv[5]), int(sys.argv[6])
limit = int(sys.argv[7]) if len(sys.argv) > 7 else 0
prefill = int(os.environ.get("PREFILL", "1000"))
lean = fmt == "lean"
if lean:
    fmt = "groups"
groups = int(os.environ.get("PER_CALL", "1")) if fmt == "groups" else 1
r = redis.Redis(port=port)
text = open(script).read()
if fmt == "groups":
    own = open(os.path.join(os.path.dirname(script), "purchase.lua")).read()
    text = text.replace("--#include purchase.lua", own, 1)
sha = r.script_load(text)
# purchase.lua from 2026-12-06 on carries the refusals' formats (ARGV[7],
# ARGV[8]) before the columns; an older one being compared does not.
formats = ["L|%s|%s|%s", "S|%s|%s"] if "ARGV[7] limit_format" in text else []


def bucket_keys(b):
    tag = "{ev#0#%d}" % b
    return [f"ss:{tag}:{k}" for k in
            ["stock", "users", "reqs", "orders", "idx", "sealed", "demand", "empty", "epoch", "pend"]]


keys = bucket_keys(0)
if mode == "setup":
    for b in range(groups):
        ks = bucket_keys(b)
        r.set(ks[0], 10**12)
        for k in (ks[1], ks[2], ks[4]):
            for start in range(0, prefill, 1000):
                r.hset(k, mapping={f"pre-{i}": "x" * 20 for i in range(start, start + 1000)})
    sys.exit(0)
rnd = random.Random(7 if mode == "run" else 11)
now = 1700000000000
p = r.pipeline(transaction=False)
for c in range(calls):
    if fmt == "groups":
        gkeys, gargs, head = [], [], [groups]
        for b in range(groups):
            ga = [now, b, n, 1, limit, n] + formats
            es = []
            for i in range(n):
                u = f"u-{rnd.randrange(10**6)}"
                rid = f"{u}/req-{mode}-{c}-{b}-{i}"
                oid = f"ev.{rnd.getrandbits(64):016x}.{rnd.getrandbits(64):016x}"
                es.append((u, rid, oid, f"C|{u}|1|{b}|{rid}|{now}"))
            for u, rid, oid, _ in es:
                ga += [rid, f"B|1|{oid}|{b}|0"]
            for u, rid, oid, ientry in es:
                ga += [oid, ientry]
            if limit or not lean:
                ga += [e[0] for e in es] + [1] * n
            ks = bucket_keys(b)
            head += [len(ks), len(ga)]
            gkeys += ks
            gargs += ga
        p.evalsha(sha, len(gkeys), *gkeys, *head, *gargs)
        if c % 100 == 99:
            assert all(isinstance(x, list) for x in p.execute())
        continue
    entries = []
    for i in range(n):
        u = f"u-{rnd.randrange(10**6)}"
        rid = f"{u}/req-{mode}-{c}-{i}"
        oid = f"ev.{rnd.getrandbits(64):016x}.{rnd.getrandbits(64):016x}"
        entries.append((u, rid, oid, f"o|{oid}|{u}|1|0|0|{rid}|{now}", f"C|{u}|1|0|{rid}|{now}"))
    if fmt == "rows":
        args = [now, 0, n]
        for u, rid, oid, srec, ientry in entries:
            args += [u, 1, limit, rid, 1, oid, srec, ientry, f"P|1|{oid}|{u}|{now}", f"B|1|{oid}|0|0"]
    else:
        args = [now, 0, n, 1, limit, n] + formats
        for u, rid, oid, _, _ in entries:
            args += [rid, f"B|1|{oid}|0|0"]
        for u, rid, oid, _, ientry in entries:
            args += [oid, ientry]
        if fmt == "columns":
            args += [e[3] for e in entries]
        args += [e[0] for e in entries] + [1] * n
    p.evalsha(sha, len(keys), *keys, *args)
    if c % 100 == 99:
        assert all(isinstance(x, list) for x in p.execute())
assert all(isinstance(x, list) for x in p.execute())
