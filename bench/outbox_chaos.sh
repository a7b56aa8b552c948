#!/usr/bin/env bash
# Order events out under faults, over HTTP: a sale with holds, confirms,
# cancels and expiries on two service instances (one Redis, one PostgreSQL
# database, both relaying to one NATS server with JetStream and one webhook
# subscription), while this script kills the relay's leader with `kill -9`
# twice (each restarted 1.5 s later), restarts the NATS server once, and the
# receiver answers 500 for 10 s. `outbox_chaos` drives the sale and checks
# that the stream's consumer and the webhook receiver each end with exactly
# the database's changes, every order's creation before its end, and every
# order's last change what its client was told. Prints the fault schedule as
# it runs and the checker's summary line; exits non-zero when a check fails.
#
# Starts its own redis-server and nats-server (free ports, a temporary
# directory) and a fresh PostgreSQL database on 127.0.0.1:5432; stops and
# drops them after. Needs redis-server, nats-server, psql, curl, and release
# builds:
#   cargo build --release -p shardstock -p shardstock-bench --bin shardstock --bin outbox_chaos
#
#   bench/outbox_chaos.sh [STOCK] [ATTEMPTS] [CONCURRENCY]
#   bench/outbox_chaos.sh 100000 120000 64
set -euo pipefail
STOCK=${1:-100000}
ATTEMPTS=${2:-120000}
CONCURRENCY=${3:-64}
BIN=target/release/shardstock
CHAOS=target/release/outbox_chaos
for b in "$BIN" "$CHAOS"; do
  [ -x "$b" ] || { echo "missing $b: cargo build --release -p shardstock -p shardstock-bench --bin shardstock --bin outbox_chaos" >&2; exit 1; }
done
for tool in redis-server nats-server psql curl; do
  command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
REDIS_PORT=$(free_port)
NATS_PORT=$(free_port)
RECEIVER_PORT=$(free_port)
PORTS=("$(free_port)" "$(free_port)")
DB="outbox_chaos_$$"
PREFIX="outboxchaos$$"
DIR=$(mktemp -d)
TOKEN=chaos-bench
PIDS=("" "")
cleanup() {
  for p in "${PIDS[@]}" "${NPID:-}" "${DPID:-}" "${RPID:-}"; do
    [ -n "$p" ] && kill -9 "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
  psql -q -h 127.0.0.1 -U postgres -c "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
say() { printf '%6.1f s  %s\n' "$(echo "$(date +%s.%N) - $T0" | bc)" "$*"; }

redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/redis.log" 2>&1 &
RPID=$!
start_nats() {
  nats-server -a 127.0.0.1 -p "$NATS_PORT" -js -sd "$DIR/nats" >>"$DIR/nats.log" 2>&1 &
  NPID=$!
  for _ in $(seq 100); do (exec 3<>"/dev/tcp/127.0.0.1/$NATS_PORT") 2>/dev/null && return; sleep 0.1; done
  echo "nats-server did not start (see $DIR/nats.log)" >&2; exit 1
}
start_nats
psql -q -h 127.0.0.1 -U postgres -c "CREATE DATABASE $DB" >/dev/null
for i in 0 1; do
  cat >"$DIR/s$i.toml" <<TOML
[server]
listen = "127.0.0.1:${PORTS[$i]}"
admin_token = "$TOKEN"

[outbox]
enabled = true
nats_url = "nats://127.0.0.1:$NATS_PORT"
stream = "$PREFIX"
subject_prefix = "$PREFIX"
webhook_retry_min_ms = 50
webhook_retry_max_ms = 1000
webhook_pause_after_failures = 1000000

[[outbox.webhooks]]
id = "chaos"
url = "http://127.0.0.1:$RECEIVER_PORT/hook"
secrets = ["whsec-chaos-0123456789abcdef"]
TOML
done
start() {
  "$BIN" serve --config "$DIR/s$1.toml" --redis "redis://127.0.0.1:$REDIS_PORT" \
    --database-url "postgres://postgres@127.0.0.1:5432/$DB" >>"$DIR/s$1.log" 2>&1 &
  PIDS[$1]=$!
  for _ in $(seq 200); do
    curl -sf "http://127.0.0.1:${PORTS[$1]}/readyz" >/dev/null && return
    sleep 0.1
  done
  echo "instance $1 did not become ready (see $DIR/s$1.log)" >&2; exit 1
}
start 0
start 1
# The relay's leader: the instance whose gauge says so (instance 0 when
# neither does yet).
leader() {
  for i in 0 1; do
    if curl -sf "http://127.0.0.1:${PORTS[$i]}/metrics" | grep -q '^shardstock_outbox_relay_leader 1'; then
      echo "$i by its gauge"; return
    fi
  done
  echo "0 no instance reported leading"
}
kill_leader() {
  local i how
  read -r i how < <(leader)
  kill -9 "${PIDS[$i]}"
  wait "${PIDS[$i]}" 2>/dev/null || true
  say "kill -9 the relay's leader (instance $i, $how)"
  sleep 1.5
  start "$i"
  say "instance $i restarted"
}

T0=$(date +%s.%N)
"$CHAOS" --targets "http://127.0.0.1:${PORTS[0]},http://127.0.0.1:${PORTS[1]}" \
  --admin-token "$TOKEN" --pg "postgres://postgres@127.0.0.1:5432/$DB" \
  --nats "nats://127.0.0.1:$NATS_PORT" --prefix "$PREFIX" --event chaos \
  --receiver-port "$RECEIVER_PORT" --stock "$STOCK" --attempts "$ATTEMPTS" \
  --concurrency "$CONCURRENCY" --hold-seconds 15 --fail-at 6 --fail-for 10 >"$DIR/chaos.out" 2>&1 &
DPID=$!
say "sale started: $STOCK units, $ATTEMPTS attempts at $CONCURRENCY; the receiver answers 500 from 6 s to 16 s"
sleep 4
kill_leader
sleep 3
kill "$NPID"; wait "$NPID" 2>/dev/null || true
say "NATS stopped"
sleep 1
start_nats
say "NATS started again"
sleep 5
kill_leader
rc=0
wait "$DPID" || rc=$?
DPID=
say "checker done"
cat "$DIR/chaos.out"
if [ "$rc" != 0 ]; then
  echo "--- instance logs (last lines) ---"
  tail -5 "$DIR/s0.log" "$DIR/s1.log"
fi
exit "$rc"
