#!/usr/bin/env bash
# Redis's time inside the purchase scripts, per purchase, in a batched engine
# row (issue 12's Redis goal): runs `shardstock-bench --strategy engine` on a
# private redis-server (nothing else on it), then reads `evalsha`'s usec from
# INFO commandstats and the server's utime+stime from /proc, both over the
# purchases the run made. A stock the attempts cannot sell out keeps every
# call on the buying path (the sold-out answers are another row's cost).
#
#   bench/script_time.sh [BENCH] [BUCKETS] [ATTEMPTS] [-- more bench args]
#   bench/script_time.sh target/release/shardstock-bench 4 300000
#
# Prints purchases/s, purchases, script µs a purchase, script calls, purchases
# a call, Redis CPU µs a purchase (scripts, parsing, sockets), then the
# commands the scripts ran, calls and µs a purchase each (part of the script's).
set -euo pipefail
BENCH=${1:-target/release/shardstock-bench}
BUCKETS=${2:-4}
ATTEMPTS=${3:-300000}
shift $(($# < 3 ? $# : 3))
[ "${1:-}" = "--" ] && shift
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
redis-cli -p "$PORT" config resetstat >/dev/null
cpu() { awk '{print $14 + $15}' "/proc/$RPID/stat"; }
t0=$(cpu)
out=$("$BENCH" --strategy engine --redis "redis://127.0.0.1:$PORT" --buckets "$BUCKETS" \
  --stock $((ATTEMPTS * 4)) --attempts "$ATTEMPTS" --json "$@")
t1=$(cpu)
stats=$(redis-cli -p "$PORT" info commandstats | grep '^cmdstat_')
python3 - "$out" "$stats" "$t0" "$t1" "$(getconf CLK_TCK)" <<'PY'
import json, re, sys
row = json.loads(sys.argv[1])
cmds = {m[0]: (int(m[1]), int(m[2]))
        for m in re.findall(r"cmdstat_(\w+):calls=(\d+),usec=(\d+)", sys.argv[2])}
calls, usec = cmds["evalsha"]
bought = row["purchases_ok"]
ticks = float(sys.argv[4]) - float(sys.argv[3])
print(f"{row['strategy']}: {row['purchases_per_s']:.0f} purchases/s, {bought} purchases, "
      f"scripts {usec / bought:.2f} µs a purchase, {calls} calls, {bought / calls:.1f} a call, "
      f"Redis CPU {ticks * 1e6 / int(sys.argv[5]) / bought:.2f} µs a purchase")
# The commands the scripts ran (their time is inside evalsha's), busiest first.
inner = sorted(((c, n, us) for c, (n, us) in cmds.items() if c != "evalsha"), key=lambda x: -x[2])
print("  inside: " + ", ".join(f"{c} {n / bought:.2f}×/{us / bought:.2f} µs" for c, n, us in inner[:6]))
PY
