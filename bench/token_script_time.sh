#!/usr/bin/env bash
# Redis's time inside purchase.lua for an open and a token purchase, with
# nothing but the script in the measure: a private redis-server, the script
# loaded from a file, and CALLS uniform calls of N fresh buyers each piped
# in (`redis-cli --pipe`), each of which buys (a stock no call sells out).
# Prints each kind's `evalsha` usec per call from INFO commandstats, and the
# token's extra per purchase. Rounds alternate the kinds (same machine state).
#
#   bench/token_script_time.sh [SCRIPT] [LAYOUT] [CALLS] [N] [ROUNDS]
#   bench/token_script_time.sh lua/purchase.lua taken 20000 4 3
#   git show 2476afe:lua/purchase.lua > /tmp/p.lua && bench/token_script_time.sh /tmp/p.lua used-reserved
#
# LAYOUT is how the token columns are sent: `taken` (one counter a token:
# its name, the allowance, the quantity; purchase.lua since 2026-12-08) or
# `used-reserved` (two counters' names, then the allowance; before).
set -euo pipefail
SCRIPT=${1:-lua/purchase.lua}
LAYOUT=${2:-taken}
CALLS=${3:-20000}
N=${4:-4}
ROUNDS=${5:-3}
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" >"$DIR/log" 2>&1 &
RPID=$!
trap 'kill $RPID 2>/dev/null; wait $RPID 2>/dev/null; rm -rf "$DIR"' EXIT
for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
SHA=$(redis-cli -p "$PORT" script load "$(cat "$SCRIPT")")
for kind in open token; do
  python3 - "$kind" "$LAYOUT" "$CALLS" "$N" "$SHA" >"$DIR/$kind.resp" <<'PY'
import sys
kind, layout, calls, n, sha = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
def resp(args):
    out = ["*%d\r\n" % len(args)]
    for a in args:
        a = str(a)
        out.append("$%d\r\n%s\r\n" % (len(a.encode()), a))
    return "".join(out)
keys = ["b:" + k for k in ("stock users reqs orders idx sealed demand empty epoch "
                           "pend holds hunits hq tok").split()]
keys = keys if kind == "token" else keys[:10]
w = sys.stdout
w.write(resp(["SET", "b:stock", 10**9]))
u, now = 0, 1796699077408
for _ in range(calls):
    args = ["EVALSHA", sha, len(keys)] + keys + [now, 0, n, 1, 0, n, "L|%s|%s|%s", "S|%s|%s"]
    users = ["user-%07d" % (u + i) for i in range(1, n + 1)]
    u += n
    for user in users:
        args += [user + "/r", "B|1|ev.%s|0|0" % user]
    for user in users:
        args += ["ev." + user, "C|%s|1|0|%s/r|%d" % (user, user, now)]
    if kind == "token":
        ids = [user + ".2.4102444800" for user in users]
        if layout == "taken":
            args += ["t:" + i for i in ids] + [2] * n + [1] * n
        else:
            for i in ids:
                args += ["u:" + i, "r:" + i]
            args += [2] * n
    w.write(resp(args))
PY
done
declare -A per
for r in $(seq "$ROUNDS"); do
  for kind in open token; do
    redis-cli -p "$PORT" flushall >/dev/null
    redis-cli -p "$PORT" config resetstat >/dev/null
    redis-cli -p "$PORT" --pipe <"$DIR/$kind.resp" | grep -q "errors: 0" \
      || { echo "$kind: the script answered an error (wrong LAYOUT for $SCRIPT?)" >&2; exit 1; }
    per[$kind]=$(redis-cli -p "$PORT" info commandstats | tr -d '\r' \
      | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  done
  python3 -c "import sys; o,t,n=float(sys.argv[1]),float(sys.argv[2]),int(sys.argv[3]); \
print(f'round $r: open {o:.2f} us a call, token {t:.2f}; the token adds {(t-o)/n:.2f} us a purchase')" \
    "${per[open]}" "${per[token]}" "$N"
done
