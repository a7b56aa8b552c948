#!/usr/bin/env python3
"""A stand-in for the shardstock binary, to test the deploy artifacts without
building the Rust service: same command line as `shardstock serve`, answers
/healthz, /readyz and /metrics, and simulates one flash sale per configured
event, exporting every metric of src/metrics.rs with the labels written there.

    SHARDSTOCK_BIN=deploy/local/fake-shardstock.py deploy/local/up.sh
    deploy/check.sh --live          # does exactly that, then queries Prometheus

It sells nothing and talks to neither Redis nor the database: /readyz only
checks that their ports accept a TCP connection. Metric *names* are read from
src/metrics.rs (by constant), so a renamed metric follows automatically.

Like a healthy real run, it never exports store errors, flush errors or
rate-limited counters (they appear on their first increment in the service
too), which is what the `or vector(0)` guards in alerts.yml and the dashboard
are for. FAKE_HISTOGRAMS=summary renders histograms the way
metrics-exporter-prometheus does when no buckets are configured.

Settings: FAKE_SALE_SECONDS (20), FAKE_HISTOGRAMS (histogram|summary).
"""
import argparse
import os
import random
import re
import socket
import sys
import threading
import time
import tomllib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

REPO = Path(__file__).resolve().parents[2]
SALE_SECONDS = float(os.environ.get("FAKE_SALE_SECONDS", "20"))
SUMMARY = os.environ.get("FAKE_HISTOGRAMS", "histogram") == "summary"
BUCKETS = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5]
DEPTH_BUCKETS = [0, 1, 2, 4, 8, 16, 32, 64]
SIZE_BUCKETS = [1, 2, 4, 8, 16, 32, 64, 128]


def metric_names():
    """CONST -> "shardstock_..." from src/metrics.rs."""
    text = (REPO / "src" / "metrics.rs").read_text()
    names = dict(re.findall(r'pub const (\w+): &str = "(shardstock_\w+)";', text))
    if not names:
        sys.exit("fake-shardstock: no metric constants found in src/metrics.rs")
    return names


M = metric_names()


def label_str(labels):
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


class Histogram:
    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.samples = []  # for summary quantiles
        self.sum = 0.0
        self.count = 0

    def observe(self, v):
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += 1
        self.sum += v
        self.count += 1
        self.samples.append(v)
        if len(self.samples) > 4096:
            self.samples = self.samples[-2048:]

    def render(self, name, labels, out):
        if SUMMARY:
            s = sorted(self.samples)
            for q in (0, 0.5, 0.9, 0.95, 0.99, 0.999, 1):
                v = s[min(len(s) - 1, int(q * len(s)))] if s else 0
                out.append(f"{name}{label_str({**labels, 'quantile': str(q)})} {v}")
        else:
            for b, c in zip(self.bounds, self.counts):
                out.append(f"{name}_bucket{label_str({**labels, 'le': str(b)})} {c}")
            out.append(f"{name}_bucket{label_str({**labels, 'le': '+Inf'})} {self.count}")
        out.append(f"{name}_sum{label_str(labels)} {self.sum}")
        out.append(f"{name}_count{label_str(labels)} {self.count}")


class Sale:
    """One event's simulated sale: buckets drain unevenly, then sold-out."""

    OUTCOMES = ["ok", "sold_out", "limit_exceeded", "invalid", "replayed", "error"]

    def __init__(self, spec, leader):
        self.id = spec["id"]
        self.stock = int(spec["stock"])
        self.n = int(spec["buckets"])
        per = self.stock // self.n
        self.remaining = [per + (1 if i < self.stock % self.n else 0) for i in range(self.n)]
        # Uneven demand per bucket, so skew and the rebalancer have work.
        self.weights = [random.uniform(0.5, 2.0) for _ in range(self.n)]
        self.outcomes = dict.fromkeys(self.OUTCOMES, 0)
        self.units = 0
        self.cancels = 0
        self.consolidations = 0
        self.moved = 0
        self.transfers = 0
        self.leader = 1 if leader else 0
        self.leader_changes = 1 if leader else 0
        self.depth = Histogram(DEPTH_BUCKETS)
        self.release = spec.get("release")
        self.pool = spec.get("pool")

    def total(self):
        return sum(self.remaining)

    def tick(self, dt, world):
        rate = self.stock / SALE_SECONDS  # units per second
        want = max(1, int(rate * dt * random.uniform(0.5, 1.5)))
        for _ in range(want):
            if self.total() == 0:
                self.outcomes["sold_out"] += 1
                world.purchase(path="fast", status="409")
                break
            home = random.choices(range(self.n), self.weights)[0]
            depth = 0
            b = home
            while self.remaining[b] == 0:
                depth += 1
                b = (b + 1) % self.n
            q = 1 if self.remaining[b] == 1 else random.choice([1, 1, 1, 2])
            self.remaining[b] -= q
            self.outcomes["ok"] += 1
            self.units += q
            self.depth.observe(depth)
            world.purchase(path="fast" if depth == 0 else "probe", status="201")
            world.pending += 1
        if random.random() < 0.2:
            self.outcomes["limit_exceeded"] += 1
            self.outcomes["replayed"] += 1
        # Rebalancer: move a few units from the fullest to the emptiest bucket.
        if self.leader and self.total() > 0:
            hi = max(range(self.n), key=lambda i: self.remaining[i])
            lo = min(range(self.n), key=lambda i: self.remaining[i])
            mv = (self.remaining[hi] - self.remaining[lo]) // 4
            if mv > 0:
                self.remaining[hi] -= mv
                self.remaining[lo] += mv
                self.moved += mv
                self.transfers += 1
        if self.total() > 0 and self.total() < 0.1 * self.stock and random.random() < 0.1:
            self.consolidations += 1

    def skew(self):
        mean = self.total() / self.n
        return max(self.remaining) / mean if mean > 0 else 1.0


class World:
    def __init__(self, specs, leader):
        self.sales = [Sale(s, leader) for s in specs]
        self.lock = threading.Lock()
        self.pending = 0
        self.flushed = 0
        self.purchase_hist = {p: Histogram(BUCKETS) for p in ("fast", "probe")}
        self.http = {}  # (route, method, status) -> count
        self.http_hist = {}
        self.flush_hist = Histogram(BUCKETS)
        self.batch_hist = Histogram(SIZE_BUCKETS)
        self.home_calls = 0

    def purchase(self, path, status):
        self.purchase_hist[path].observe(random.uniform(0.0003, 0.004 if path == "fast" else 0.02))
        self.request("/v1/events/{id}/purchases", "POST", status)
        if random.random() < 0.3:
            self.batch_hist.observe(random.randint(1, 16))
            self.home_calls += 1

    def request(self, route, method, status):
        key = (route, method, status)
        self.http[key] = self.http.get(key, 0) + 1
        h = self.http_hist.setdefault((route, method), Histogram(BUCKETS))
        h.observe(random.uniform(0.0005, 0.01))

    def run(self):
        last = time.monotonic()
        while True:
            time.sleep(0.1)
            now = time.monotonic()
            with self.lock:
                for s in self.sales:
                    s.tick(now - last, self)
                # Flusher: drain pending orders in batches.
                if self.pending:
                    n = min(self.pending, random.randint(50, 500))
                    self.pending -= n
                    self.flushed += n
                    self.flush_hist.observe(random.uniform(0.002, 0.02))
            last = now

    def first_pool(self, release):
        return next(s.pool for s in self.sales if s.release == release)

    def render(self):
        out = []
        with self.lock:
            for s in self.sales:
                ev = {"event": s.id}
                for o, c in s.outcomes.items():
                    out.append(f"{M['PURCHASES']}{label_str({**ev, 'outcome': o})} {c}")
                out.append(f"{M['PURCHASED_UNITS']}{label_str(ev)} {s.units}")
                s.depth.render(M["PROBE_DEPTH"], ev, out)
                out.append(f"{M['CANCELS']}{label_str(ev)} {s.cancels}")
                out.append(f"{M['CONSOLIDATIONS']}{label_str(ev)} {s.consolidations}")
                for i, r in enumerate(s.remaining):
                    out.append(f"{M['BUCKET_REMAINING']}{label_str({**ev, 'bucket': i})} {r}")
                out.append(f"{M['BUCKET_SKEW']}{label_str(ev)} {s.skew()}")
                out.append(f"{M['EVENT_STOCK']}{label_str(ev)} {s.stock}")
                out.append(f"{M['EVENT_REMAINING']}{label_str(ev)} {s.total()}")
                out.append(f"{M['EVENT_BUCKETS']}{label_str(ev)} {s.n}")
                out.append(f"{M['REBALANCE_MOVED_UNITS']}{label_str(ev)} {s.moved}")
                out.append(f"{M['REBALANCE_TRANSFERS']}{label_str(ev)} {s.transfers}")
                out.append(f"{M['LEADER_CHANGES']}{label_str(ev)} {s.leader_changes}")
                out.append(f"{M['LEADER']}{label_str(ev)} {s.leader}")
                out.append(f"{M['FENCING_REJECTIONS']}{label_str(ev)} 0")
                for reason in ("manual", "config", "resumed", "hot", "spread", "drain"):
                    out.append(f"{M['RESHARDS']}{label_str({**ev, 'reason': reason})} 0")
                out.append(f"{M['DB_GUARD_VIOLATIONS']}{label_str(ev)} 0")
                out.append(f"{M['AUDIT_BALANCED']}{label_str(ev)} 1")
                if s.release:
                    rel = {"release": s.release}
                    out.append(f"{M['RELEASE_POOL']}{label_str({**rel, 'pool': s.pool, **ev})} 1")
                    # One counter per release: its pools' orders, as whole orders.
                    for o in ("ok", "sold_out", "limit_exceeded", "gave_up", "replayed", "error"):
                        c = s.outcomes.get(o, 0) if s.pool == self.first_pool(s.release) else None
                        if c is not None:
                            out.append(f"{M['RELEASE_ORDERS']}{label_str({**rel, 'outcome': o})} {c}")
            for p, h in self.purchase_hist.items():
                h.render(M["PURCHASE_DURATION"], {"path": p}, out)
            out.append(f"{M['FLUSH_LAG']} {self.pending}")
            out.append(f"{M['ORDERS_FLUSHED']} {self.flushed}")
            # The outbox relay: its changes trail the flushed orders by one round.
            relay = {"target": "nats:shardstock"}
            out.append(f"{M['OUTBOX_LAG_CHANGES']}{label_str(relay)} {min(self.pending, 100)}")
            out.append(f"{M['OUTBOX_LAG_SECONDS']}{label_str(relay)} {0.1 if self.pending else 0}")
            out.append(f"{M['OUTBOX_DELIVERIES']}{label_str({**relay, 'outcome': 'published'})} {self.flushed}")
            out.append(f"{M['OUTBOX_LEADER']} 1")
            self.flush_hist.render(M["FLUSH_BATCH_DURATION"], {}, out)
            for (route, method, status), c in self.http.items():
                out.append(f"{M['HTTP_REQUESTS']}{label_str({'route': route, 'method': method, 'status': status})} {c}")
            for (route, method), h in self.http_hist.items():
                h.render(M["HTTP_DURATION"], {"route": route, "method": method}, out)
            self.batch_hist.render(M["BATCH_SIZE"], {}, out)
            out.append(f"{M['SCRIPT_CALLS']} {self.home_calls}")
        return "\n".join(out) + "\n"


def tcp_ok(host, port):
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def endpoints(redis_url, db_url):
    """host:port pairs /readyz checks: the Redis seed nodes and the database."""
    eps = []
    if redis_url:
        u = urlparse(redis_url)
        eps.append((u.hostname, u.port or 6379))
        for n in parse_qs(u.query).get("node", []):
            h, _, p = n.rpartition(":")
            eps.append((h, int(p)))
    if db_url and db_url.startswith("postgres"):
        u = urlparse(db_url)
        eps.append((u.hostname, u.port or 5432))
    return eps


def main():
    ap = argparse.ArgumentParser(prog="fake-shardstock")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--config", required=True)
    s.add_argument("--listen", default=os.environ.get("SHARDSTOCK_LISTEN"))
    s.add_argument("--redis", default=os.environ.get("SHARDSTOCK_REDIS"))
    s.add_argument("--database-url", default=os.environ.get("SHARDSTOCK_DATABASE_URL"))
    s.add_argument("--admin-token", default=os.environ.get("SHARDSTOCK_ADMIN_TOKEN"))
    # Accepted as the service accepts them (up.sh passes them); the stand-in
    # has no replicas to wait for and no outbox to relay.
    s.add_argument("--min-replicas")
    s.add_argument("--outbox")
    s.add_argument("--nats-url")
    args = ap.parse_args()

    cfg = tomllib.loads(Path(args.config).read_text())
    listen = args.listen or cfg.get("server", {}).get("listen", "127.0.0.1:8080")
    host, _, port = listen.rpartition(":")
    redis_url = args.redis or cfg.get("store", {}).get("redis_url")
    db_url = args.database_url or cfg.get("database", {}).get("url")
    eps = endpoints(redis_url, db_url)
    # Replicas on even ports lead every event's rebalancer (deterministic per run).
    # A release's pools are events `<release>.<pool>` (each sells as one).
    pools = [
        {"id": f"{r['id']}.{p['id']}", "stock": p["stock"],
         "buckets": p["buckets"] if isinstance(p.get("buckets"), int) else 4,
         "release": r["id"], "pool": p["id"]}
        for r in cfg.get("releases", []) for p in r.get("pools", [])
    ]
    world = World(cfg.get("events", []) + pools, leader=int(port) % 2 == 0)
    threading.Thread(target=world.run, daemon=True).start()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/healthz":
                code, body, ctype = 200, "ok\n", "text/plain"
            elif path == "/readyz":
                bad = [f"{h}:{p}" for h, p in eps if not tcp_ok(h, p)]
                code = 503 if bad else 200
                body = ("not ready: " + ", ".join(bad) if bad else "ready") + "\n"
                ctype = "text/plain"
            elif path == "/metrics":
                code, body, ctype = 200, world.render(), "text/plain; version=0.0.4"
            else:
                code, body, ctype = 404, "not found\n", "text/plain"
            with world.lock:
                world.request(path if code != 404 else "unmatched", "GET", str(code))
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer((host, int(port)), Handler)
    print(f"fake-shardstock listening on {listen}, events: "
          f"{[s.id for s in world.sales]}, histograms as {'summaries' if SUMMARY else 'histograms'}",
          flush=True)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=srv.shutdown).start())
    srv.serve_forever()
    print("fake-shardstock: stopped", flush=True)


if __name__ == "__main__":
    main()
