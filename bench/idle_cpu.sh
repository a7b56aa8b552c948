#!/usr/bin/env bash
# Idle CPU of the service and of Redis: EVENTS open events of BUCKETS buckets
# each, no traffic at all. Starts a private redis-server and a fresh PostgreSQL
# database, creates the events over HTTP, lets the service settle, then reads
# utime+stime of both processes from /proc over SECONDS and prints them as a
# percentage of one core. Everything it starts is stopped and dropped after.
#
#   bench/idle_cpu.sh [BINARY] [EVENTS] [BUCKETS] [SECONDS]
#   bench/idle_cpu.sh target/release/shardstock 300 16 10
set -euo pipefail
BIN=${1:-target/release/shardstock}
EVENTS=${2:-300}
BUCKETS=${3:-16}
SECONDS_=${4:-10}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port)
HTTP_PORT=$(free_port)
DB="idle_cpu_$$"
DIR=$(mktemp -d)
TOKEN=idle-bench
cleanup() {
  [ -n "${SPID:-}" ] && kill "$SPID" 2>/dev/null && wait "$SPID" 2>/dev/null || true
  [ -n "${RPID:-}" ] && kill "$RPID" 2>/dev/null && wait "$RPID" 2>/dev/null || true
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 &
RPID=$!
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $DB" >/dev/null
printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_token = "%s"\n' "$HTTP_PORT" "$TOKEN" >"$DIR/idle.toml"
"$BIN" serve --config "$DIR/idle.toml" --redis "redis://127.0.0.1:$REDIS_PORT" \
  --database-url "postgres://postgres@127.0.0.1:5432/$DB" >"$DIR/service.log" 2>&1 &
SPID=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$HTTP_PORT/v1/events" >/dev/null && break
  sleep 0.1
done
for i in $(seq "$EVENTS"); do
  curl -sf -o /dev/null -X POST "http://127.0.0.1:$HTTP_PORT/v1/events" \
    -H "authorization: Bearer $TOKEN" -H 'content-type: application/json' \
    -d "{\"id\":\"idle-$i\",\"stock\":1600,\"buckets\":$BUCKETS}"
done
sleep 5 # settle: first sight of every event (gauges, metas)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
s0=$(ticks "$SPID"); r0=$(ticks "$RPID")
sleep "$SECONDS_"
s1=$(ticks "$SPID"); r1=$(ticks "$RPID")
HZ=$(getconf CLK_TCK)
awk -v s="$((s1 - s0))" -v r="$((r1 - r0))" -v hz="$HZ" -v t="$SECONDS_" -v e="$EVENTS" -v b="$BUCKETS" \
  'BEGIN { printf "idle %d events x %d buckets, %ds: service %.1f%% of a core, redis %.1f%% of a core\n", e, b, t, 100*s/hz/t, 100*r/hz/t }'
