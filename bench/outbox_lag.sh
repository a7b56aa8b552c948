#!/usr/bin/env bash
# Publish lag of order events under a full-rate sale, over HTTP: starts the
# service (order events on, the relay publishing to the machine's NATS under a
# subject prefix of its own) on a private redis-server and a fresh PostgreSQL
# database, a NATS consumer (`outbox_lag`) that times every order.created from
# its purchase to its arrival, and the load generator's sale of STOCK units to
# ATTEMPTS attempts at CONCURRENCY. Prints the sale's summary line and the
# consumer's p50 / p99 / max, then the lag split at the commit (purchase to
# commit, commit to consumer). Everything it starts is stopped and dropped after.
#
# Needs: PostgreSQL on 127.0.0.1:5432, NATS with JetStream on 127.0.0.1:4222,
# redis-server on the PATH, and release builds:
#   cargo build --release && cargo build --release -p shardstock-bench --bins
#
#   bench/outbox_lag.sh [STOCK] [ATTEMPTS] [CONCURRENCY] [BUCKETS]
#   bench/outbox_lag.sh 100000 100000 64 16
set -euo pipefail
STOCK=${1:-100000}
ATTEMPTS=${2:-100000}
CONCURRENCY=${3:-64}
BUCKETS=${4:-16}
BIN=target/release/shardstock
LOAD=target/release/shardstock-bench
LAG=target/release/outbox_lag
for b in "$BIN" "$LOAD" "$LAG"; do
  [ -x "$b" ] || { echo "missing $b: cargo build --release && cargo build --release -p shardstock-bench --bins" >&2; exit 1; }
done
(exec 3<>/dev/tcp/127.0.0.1/4222) 2>/dev/null || { echo "NATS is not on 127.0.0.1:4222: nats-server -js &" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port)
HTTP_PORT=$(free_port)
DB="outbox_lag_$$"
PREFIX="outboxlag$$"
DIR=$(mktemp -d)
TOKEN=lag-bench
cleanup() {
  [ -n "${CPID:-}" ] && kill "$CPID" 2>/dev/null && wait "$CPID" 2>/dev/null || true
  [ -n "${SPID:-}" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null || true
  [ -n "${RPID:-}" ] && kill "$RPID" 2>/dev/null && wait "$RPID" 2>/dev/null || true
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 &
RPID=$!
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $DB" >/dev/null
cat >"$DIR/lag.toml" <<TOML
[server]
listen = "127.0.0.1:$HTTP_PORT"
admin_token = "$TOKEN"

[outbox]
enabled = true
nats_url = "nats://127.0.0.1:4222"
stream = "$PREFIX"
subject_prefix = "$PREFIX"
TOML
"$BIN" serve --config "$DIR/lag.toml" --redis "redis://127.0.0.1:$REDIS_PORT" \
  --database-url "postgres://postgres@127.0.0.1:5432/$DB" >"$DIR/service.log" 2>&1 &
SPID=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$HTTP_PORT/readyz" >/dev/null && break
  sleep 0.1
done
"$LAG" --prefix "$PREFIX" --idle 10 --pg "postgres://postgres@127.0.0.1:5432/$DB" >"$DIR/lag.out" 2>&1 &
CPID=$!
until grep -q subscribed "$DIR/lag.out"; do sleep 0.1; done
"$LOAD" --target "http://127.0.0.1:$HTTP_PORT" --admin-token "$TOKEN" --stock "$STOCK" \
  --attempts "$ATTEMPTS" --concurrency "$CONCURRENCY" --buckets "$BUCKETS" 2>&1 | grep -iE 'orders|purchases|sold|rate' | head -5 || true
wait "$CPID" || true
CPID=
tail -2 "$DIR/lag.out"
# The relay published every order the sale made, none twice.
psql -qtA -h 127.0.0.1 -U postgres -d "$DB" -c "SELECT 'database: ' || count(*) || ' order.created in the outbox' FROM outbox_changes WHERE type = 'order.created'"
