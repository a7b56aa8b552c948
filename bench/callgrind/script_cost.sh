#!/usr/bin/env bash
# Instructions Redis spends per purchase in purchase.lua, counted by callgrind
# (repeatable whatever else the machine does, unlike time):
#
#   bench/callgrind/script_cost.sh SCRIPT FORMAT CALLS N [LIMIT]
#   bench/callgrind/script_cost.sh lua/purchase.lua orders 800 2
#   git show 89f010d:lua/purchase.lua > /tmp/columns.lua
#   bench/callgrind/script_cost.sh /tmp/columns.lua columns 800 2
#   git show 8fc5f01:lua/purchase.lua > /tmp/old.lua
#   bench/callgrind/script_cost.sh /tmp/old.lua rows 800 2
#   PER_CALL=8 bench/callgrind/script_cost.sh lua/purchase_groups.lua groups 100 2
#
# Needs valgrind, python3 with the `redis` package (pip install redis) and
# redis-server (REDIS=/path/to/redis-server to use another build, e.g. one
# with symbols for callgrind_annotate; KEEP=dir keeps the profile; PREFILL=n
# fills each hash with n fields first, 1000 by default; CACHE=1 simulates the
# caches too and prints the last-level misses a purchase: a probe of a large
# hash costs a miss, which instruction counts do not weigh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
script=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
port=${PORT:-46500}
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" --instr-atstart=no ${CACHE:+--cache-sim=yes} \
  "${REDIS:-redis-server}" --port "$port" --save '' --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
vg=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
python3 "$here/script_cost.py" setup "$port" "$script" "${@:2}"
python3 "$here/script_cost.py" warm "$port" "$script" "$2" 2 "$4" "${5:-0}"
callgrind_control -i on "$vg" >/dev/null 2>&1
python3 "$here/script_cost.py" run "$port" "$script" "${@:2}"
callgrind_control -i off "$vg" >/dev/null 2>&1
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$vg" 2>/dev/null || true
total=$(grep -h '^totals' "$dir"/cg.out* | awk '{print $2}')
g=${PER_CALL:-1}
echo "$(basename "$1") $2 groups=$g n=$4 limit=${5:-0}: $((total / ($3 * $4 * g))) instructions per purchase"
if [ -n "${CACHE:-}" ]; then
  # totals: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
  misses=$(grep -h '^totals' "$dir"/cg.out* | awk '{print $4 + $7 + $10}')
  echo "  last-level cache misses per purchase: $(python3 -c "print(round($misses / ($3 * $4 * $g), 2))")"
fi
[ -n "${KEEP:-}" ] && cp "$dir"/cg.out* "$KEEP"/
rm -rf "$dir"
