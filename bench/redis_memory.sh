#!/usr/bin/env bash
# Redis memory a sale costs, for the README's sizing table: per order while
# its stream entry waits for the flusher, per order once flushed (what stays
# for the sale: the request's record, the order's index entry, the buyer's
# count), and per bucket of an empty event.
#
# On a private redis-server (nothing else on it): `INFO memory` used_memory
# before and after `shardstock-bench --strategy engine` sells ATTEMPTS
# one-unit orders to distinct buyers with request ids and a per-user limit
# (one bucket); then every stream is trimmed as the flusher would and
# used_memory read again; then an event of 1,024 buckets is created with no
# sale. Then the server is emptied and the same sale run without a limit and
# trimmed: the difference, an order, is what the per-user limit keeps for a
# buyer (the count in the bucket's users hash).
#
#   bench/redis_memory.sh [BENCH] [ATTEMPTS]
#   bench/redis_memory.sh target/release/shardstock-bench 200000
#
# Prints bytes an order (unflushed, flushed), a buyer's count and a bucket.
set -euo pipefail
BENCH=${1:-target/release/shardstock-bench}
ATTEMPTS=${2:-200000}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
used() { redis-cli -p "$PORT" info memory | awk -F: '/^used_memory:/ {print $2+0}'; }
URL="redis://127.0.0.1:$PORT"
before=$(used)
"$BENCH" --strategy engine --redis "$URL" --buckets 1 --stock $((ATTEMPTS * 2)) \
  --attempts "$ATTEMPTS" --users 100000000 --quantities 1:1 --retry-rate 0 \
  --per-user-limit 2 --json >"$DIR/sale.json"
sold=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["purchases_ok"])' "$DIR/sale.json")
unflushed=$(used)
for key in $(redis-cli -p "$PORT" --scan --pattern '*:orders'); do
  redis-cli -p "$PORT" xtrim "$key" maxlen 0 >/dev/null
done
flushed=$(used)
"$BENCH" --strategy engine --redis "$URL" --buckets 1024 --stock 1024000 --attempts 1 --json >/dev/null
buckets=$(used)
redis-cli -p "$PORT" flushall >/dev/null
bare=$(used)
"$BENCH" --strategy engine --redis "$URL" --buckets 1 --stock $((ATTEMPTS * 2)) \
  --attempts "$ATTEMPTS" --users 100000000 --quantities 1:1 --retry-rate 0 --json >"$DIR/nolimit.json"
sold_nolimit=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["purchases_ok"])' "$DIR/nolimit.json")
for key in $(redis-cli -p "$PORT" --scan --pattern '*:orders'); do
  redis-cli -p "$PORT" xtrim "$key" maxlen 0 >/dev/null
done
nolimit=$(used)
python3 - "$before" "$unflushed" "$flushed" "$buckets" "$sold" "$bare" "$nolimit" "$sold_nolimit" <<'PY'
import sys
before, unflushed, flushed, buckets, sold, bare, nolimit, sold_nolimit = map(int, sys.argv[1:])
print(f"{sold} orders")
print(f"bytes an order, unflushed: {(unflushed - before) / sold:.0f}")
print(f"bytes an order, flushed:   {(flushed - before) / sold:.0f}")
print(f"bytes a bucket (1,024 of an event, 1 sold): {(buckets - flushed) / 1024:.0f}")
per_order_nolimit = (nolimit - bare) / sold_nolimit
print(f"bytes an order without a limit, flushed: {per_order_nolimit:.0f}")
print(f"bytes a buyer's count (the limit's): {(flushed - before) / sold - per_order_nolimit:.0f}")
PY
