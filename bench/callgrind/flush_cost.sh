#!/usr/bin/env bash
# Instructions Redis spends per flushed record on the flusher's reads and
# acknowledgements, counted by callgrind:
#
#   bench/callgrind/flush_cost.sh lua/stream_ack.lua              # now
#   git show 8fc5f01:lua/stream_ack.lua > /tmp/ack.lua
#   git show 8fc5f01:lua/stream_read.lua > /tmp/read.lua
#   bench/callgrind/flush_cost.sh /tmp/ack.lua /tmp/read.lua       # before issue 12
#
# Needs what script_cost.sh needs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
abs() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
args=("$(abs "$1")"); [ $# -gt 1 ] && args+=("$(abs "$2")")
port=${PORT:-46510}
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" --instr-atstart=no \
  "${REDIS:-redis-server}" --port "$port" --save '' --appendonly no --dir "$dir" >"$dir/log" 2>&1 &
vg=$!
for _ in $(seq 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
python3 "$here/flush_cost.py" setup "$port" "${args[@]}"
callgrind_control -i on "$vg" >/dev/null 2>&1
python3 "$here/flush_cost.py" run "$port" "${args[@]}"
callgrind_control -i off "$vg" >/dev/null 2>&1
redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
wait "$vg" 2>/dev/null || true
total=$(grep -h '^totals' "$dir"/cg.out* | awk '{print $2}')
echo "$*: $((total / 20000)) instructions per record"
rm -rf "$dir"
