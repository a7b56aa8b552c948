#!/usr/bin/env bash
# Instructions the service spends per purchase, counted by callgrind, under a
# fixed load from wrk (one-unit purchases by random users with fresh request
# ids, 16 connections), on the embedded store with SQLite:
#
#   bench/callgrind/server_cost.sh target/release/shardstock [SECONDS]
#   bench/callgrind/server_cost.sh target/release/shardstock-bench [SECONDS]   # the bare axum peer
#
# Under valgrind the service runs some 50x slower; so that its flusher still
# writes batches as big as at full speed (a commit and a read per bucket cost
# the same whatever the batch), it waits 1 s between rounds here
# (flush_block_ms), and the count waits for the last of them. Compare builds
# with it, not with the CPU times of BENCHMARKS.md. Needs valgrind, wrk, curl.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
secs=${2:-20}
port=${PORT:-47100}
dir=$(mktemp -d)
cd "$dir"
bare=0
case "$(basename "$bin")" in
  shardstock-bench) bare=1; args=(--serve-peer bare --listen "127.0.0.1:$port" --redis redis://127.0.0.1:6379) ;;
  *) args=(serve --listen "127.0.0.1:$port" --admin-token t --database-url "sqlite://$dir/ledger.db") ;;
esac
printf '[database]\nflush_block_ms = 1000\n' >"$dir/cost.toml"
SHARDSTOCK_CONFIG="$dir/cost.toml" RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" --instr-atstart=no \
  "$bin" "${args[@]}" >"$dir/log" 2>&1 &
vg=$!
base="http://127.0.0.1:$port"
buy() { EVENT=cg wrk -t2 -c16 -d"$1"s -s "$here/buy.lua" "$base" | awk '/requests in/ {print $1}'; }
if [ $bare = 1 ]; then
  for _ in $(seq 300); do curl -s -o /dev/null -X POST "$base/v1/events/cg/purchases" \
    -H 'content-type: application/json' -d '{"user_id":"u","quantity":1}' && break; sleep 0.5; done
  callgrind_control -i on "$vg" >/dev/null 2>&1
  n=$(buy "$secs")
else
  for _ in $(seq 300); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.5; done
  curl -sf -X POST "$base/v1/events" -H 'authorization: Bearer t' -H 'content-type: application/json' \
    -d '{"id":"cg","stock":1000000000,"buckets":16,"max_per_order":1}' >/dev/null
  field() { curl -s "$1" -H 'authorization: Bearer t' | python3 -c "import json,sys; print(json.load(sys.stdin)['$2'])"; }
  flushed() { [ "$(field "$base/v1/events/cg/audit" sold_unflushed)" = 0 ]; }
  buy 5 >/dev/null
  until flushed; do sleep 0.5; done
  sold=$(field "$base/v1/events/cg" sold)
  callgrind_control -i on "$vg" >/dev/null 2>&1
  buy "$secs" >/dev/null
  until flushed; do sleep 0.5; done
  n=$(( $(field "$base/v1/events/cg" sold) - sold ))
fi
callgrind_control -i off "$vg" >/dev/null 2>&1
kill "$vg"; wait "$vg" 2>/dev/null || true
total=$(grep -h '^totals' "$dir"/cg.out* | awk '{print $2}')
echo "$(basename "$bin"): $n purchases, $((total / n)) instructions per purchase"
[ -n "${KEEP:-}" ] && cp "$dir"/cg.out* "$KEEP"/
cd /; rm -rf "$dir"
