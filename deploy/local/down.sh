#!/usr/bin/env bash
# Stops everything deploy/local/up.sh started (from its PID files) and removes
# the run directory. Safe to run twice, or when nothing is up.
#
#   RUN_DIR=/tmp/shardstock-local   the directory up.sh used
#   STOP_TIMEOUT=20                 seconds a process gets after SIGTERM before
#                                   SIGKILL (shardstock drains in ~15 s)
#   KEEP_RUN_DIR=0                  1: keep the directory (logs) after stopping
#   DROP_DB=0                       1: also drop the database up.sh used
#                                   (DB_NAME, PGHOST, PGPORT, PGUSER as in up.sh)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

RUN_DIR=${RUN_DIR:-/tmp/shardstock-local}
STOP_TIMEOUT=${STOP_TIMEOUT:-20}
KEEP_RUN_DIR=${KEEP_RUN_DIR:-0}
DROP_DB=${DROP_DB:-0}

trap 'echo "ERROR: down.sh failed at line $LINENO: $BASH_COMMAND" >&2' ERR

if [ ! -d "$RUN_DIR" ]; then
  log "nothing to stop: $RUN_DIR does not exist"
  exit 0
fi
# Never stop processes or delete a directory this script did not make.
[ -f "$RUN_DIR/.shardstock-local" ] \
  || die "$RUN_DIR has no .shardstock-local mark: not made by up.sh, leaving it alone"

# stop NAME: SIGTERM the process of pids/NAME.pid if it is still the one we
# started, wait up to STOP_TIMEOUT, then SIGKILL.
stop() {
  local name=$1 pidfile="$RUN_DIR/pids/$1.pid" pid match
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  match=$(cat "$RUN_DIR/pids/$name.match" 2>/dev/null || echo "$name")
  if ! pid_matches "$pid" "$match"; then
    log "$name (pid $pid) is not running"
    rm -f "$pidfile"
    return 0
  fi
  log "stopping $name (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while pid_matches "$pid" "$match"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      log "$name (pid $pid) still running after ${STOP_TIMEOUT}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
}

# The services first: on SIGTERM they finish in-flight requests and may still
# write to Redis and the database. Then Prometheus, then Redis.
shopt -s nullglob
for f in "$RUN_DIR"/pids/shardstock-*.pid; do
  n=$(basename "$f" .pid)
  stop "$n" &          # in parallel: each may take the whole drain time
done
wait
stop prometheus
for f in "$RUN_DIR"/pids/redis-*.pid; do
  stop "$(basename "$f" .pid)"
done

if [ "$DROP_DB" = 1 ]; then
  DB_NAME=${DB_NAME:-shardstock}
  export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
  log "DROP_DB=1: dropping database $DB_NAME"
  psql -d postgres -v ON_ERROR_STOP=1 -qc "DROP DATABASE IF EXISTS \"$DB_NAME\" WITH (FORCE)"
fi

if [ "$KEEP_RUN_DIR" = 1 ]; then
  rm -f "$RUN_DIR/env" "$RUN_DIR/fingerprint"
  log "stopped; logs kept in $RUN_DIR/logs"
else
  rm -rf -- "$RUN_DIR"
  log "stopped and removed $RUN_DIR"
fi
