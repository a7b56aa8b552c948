#!/usr/bin/env bash
# Brings up the compose topology on ONE machine, without Docker:
#   - a Redis Cluster of 3 masters, each with a replica (REPLICAS=1; 0 for
#     masters alone), redis-server processes with AOF (appendfsync everysec),
#     on free ports;
#   - the machine's PostgreSQL (127.0.0.1:5432, user postgres, trust auth),
#     with database $DB_NAME created if absent;
#   - the machine's NATS server with JetStream ($NATS_URL), which the
#     services relay their order changes to (NATS_URL= : no relay);
#   - REPLICAS_SVC shardstock processes on ports from BASE_PORT, with the
#     durability setting on when the masters have replicas (--min-replicas
#     MIN_REPLICAS), waited for until /readyz answers 200;
#   - Prometheus scraping them every second with deploy/prometheus/alerts.yml.
# Writes $RUN_DIR/env (REDIS_URL, DATABASE_URL, SERVICE_URLS, PROMETHEUS_URL,
# PIDs…) for tests and humans: `source "$RUN_DIR/env"`.
#
# Idempotent: when the same setup is already up and healthy it only prints the
# env file; a stale or different one is stopped first (down.sh). On failure it
# stops what it started, keeps the logs in $RUN_DIR and names the command.
#
# Settings (environment variables):
#   RUN_DIR=/tmp/shardstock-local    state, logs, PID files, Prometheus data
#   REPLICAS=1                       Redis replicas per master (0 or 1)
#   MIN_REPLICAS=$REPLICAS           the service's store.min_replicas (≤ REPLICAS)
#   REPLICAS_SVC=2                   shardstock processes
#   SHARDSTOCK_BIN=target/release/shardstock   (relative to the repo root)
#   CONFIG=config/shardstock.toml    (relative to the repo root)
#   BASE_PORT=18080                  first shardstock port
#   REDIS_BASE_PORT=17001            first Redis port (bus ports = +10000)
#   PROM_PORT=19090                  first Prometheus port tried
#   PROMETHEUS_BIN=/usr/bin/prometheus
#   SCRAPE_INTERVAL=1s
#   PGHOST=127.0.0.1 PGPORT=5432 PGUSER=postgres DB_NAME=shardstock
#   RESET_DB=0                       1: drop and re-create $DB_NAME first
#   ADMIN_TOKEN=demo-admin-token     passed as --admin-token
#   NATS_URL=nats://127.0.0.1:4222   passed as --nats-url, with --outbox true (empty: no relay)
#   READY_TIMEOUT=90                 seconds to wait for each component
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=lib.sh
. "$HERE/lib.sh"

RUN_DIR=${RUN_DIR:-/tmp/shardstock-local}
REPLICAS=${REPLICAS:-1}
MIN_REPLICAS=${MIN_REPLICAS:-$REPLICAS}
REPLICAS_SVC=${REPLICAS_SVC:-2}
SHARDSTOCK_BIN=${SHARDSTOCK_BIN:-target/release/shardstock}
CONFIG=${CONFIG:-config/shardstock.toml}
BASE_PORT=${BASE_PORT:-18080}
REDIS_BASE_PORT=${REDIS_BASE_PORT:-17001}
PROM_PORT=${PROM_PORT:-19090}
PROMETHEUS_BIN=${PROMETHEUS_BIN:-/usr/bin/prometheus}
SCRAPE_INTERVAL=${SCRAPE_INTERVAL:-1s}
PGHOST=${PGHOST:-127.0.0.1}
PGPORT=${PGPORT:-5432}
PGUSER=${PGUSER:-postgres}
DB_NAME=${DB_NAME:-shardstock}
RESET_DB=${RESET_DB:-0}
ADMIN_TOKEN=${ADMIN_TOKEN:-demo-admin-token}
NATS_URL=${NATS_URL-nats://127.0.0.1:4222}
READY_TIMEOUT=${READY_TIMEOUT:-90}
export PGHOST PGPORT PGUSER

# Paths given relative to the repo root (the defaults) are resolved here, so
# up.sh works from any directory.
# (A relative path that exists only from the current directory is taken from there.)
resolve() {
  case $1 in
    /*) echo "$1" ;;
    *) if [ -e "$1" ] && [ ! -e "$REPO/$1" ]; then echo "$PWD/$1"; else echo "$REPO/$1"; fi ;;
  esac
}
SHARDSTOCK_BIN=$(resolve "$SHARDSTOCK_BIN")
CONFIG=$(resolve "$CONFIG")
ALERTS="$REPO/deploy/prometheus/alerts.yml"

# ---- failure reporting ---------------------------------------------------------
# Any failure (a failing command, `set -u`, a timeout): say which command and
# where, stop what was started (keeping the logs), and exit non-zero. The ERR
# trap records the command; the EXIT trap reports and cleans up, so failures
# that skip ERR (an unset variable) are covered too.
STARTED=0
FAILED_CMD=""
FAILED_LINE=""
trap 'FAILED_CMD=$BASH_COMMAND; FAILED_LINE=$LINENO' ERR
on_exit() {
  local rc=$?
  [ "$rc" -eq 0 ] && return 0
  echo >&2
  if [ -n "$FAILED_CMD" ]; then
    echo "ERROR: up.sh failed (exit $rc) at line $FAILED_LINE, running:" >&2
    echo "    $FAILED_CMD" >&2
  else
    echo "ERROR: up.sh failed (exit $rc); see the message above." >&2
  fi
  if [ "$STARTED" = 1 ]; then
    echo "Stopping what was started; logs stay in $RUN_DIR/logs (remove them with deploy/local/down.sh)." >&2
    KEEP_RUN_DIR=1 RUN_DIR=$RUN_DIR "$HERE/down.sh" >&2 || true
  fi
  exit "$rc"
}
trap on_exit EXIT

# fail MESSAGE: print and exit non-zero (the EXIT trap then cleans up).
fail() {
  echo "ERROR: $*" >&2
  exit 1
}

# ---- settings and prerequisites --------------------------------------------------
[[ $REPLICAS =~ ^[01]$ ]] || die "REPLICAS must be 0 or 1 (Redis replicas per master), not '$REPLICAS'"
[[ $MIN_REPLICAS =~ ^[01]$ && $MIN_REPLICAS -le $REPLICAS ]] || die "MIN_REPLICAS must be 0 or 1 and at most REPLICAS ($REPLICAS), not '$MIN_REPLICAS'"
[[ $REPLICAS_SVC =~ ^[1-9][0-9]*$ ]] || die "REPLICAS_SVC must be a positive number, not '$REPLICAS_SVC'"

need redis-server "apt-get install -y redis-server   (or: bash deploy/local/install.sh)"
need redis-cli "apt-get install -y redis-tools   (or: bash deploy/local/install.sh)"
need psql "apt-get install -y postgresql-client   (or: bash deploy/local/install.sh)"
need curl "apt-get install -y curl   (or: bash deploy/local/install.sh)"
[ -x "$PROMETHEUS_BIN" ] || die "Prometheus not found at $PROMETHEUS_BIN. Install it: bash deploy/local/install.sh   (apt-get install -y prometheus)"
[ -x "$SHARDSTOCK_BIN" ] || die "shardstock binary not found or not executable: $SHARDSTOCK_BIN. Build it: cargo build --release   (or set SHARDSTOCK_BIN)"
[ -r "$CONFIG" ] || die "config file not found: $CONFIG (set CONFIG)"
[ -r "$ALERTS" ] || die "alert rules not found: $ALERTS"

REDIS_COUNT=$((3 * (1 + REPLICAS)))
# A fingerprint of everything that shapes the setup: an existing run with the
# same one is reused, a different one is replaced.
FINGERPRINT="replicas=$REPLICAS min_replicas=$MIN_REPLICAS svc=$REPLICAS_SVC bin=$SHARDSTOCK_BIN config=$CONFIG db=$PGHOST:$PGPORT/$DB_NAME base=$BASE_PORT redis=$REDIS_BASE_PORT prom=$PROM_PORT nats=$NATS_URL"

# ---- already up? ------------------------------------------------------------------
# healthy: every recorded process alive, every service ready, Prometheus ready.
healthy() {
  [ -f "$RUN_DIR/env" ] && [ -f "$RUN_DIR/fingerprint" ] || return 1
  [ "$(cat "$RUN_DIR/fingerprint")" = "$FINGERPRINT" ] || return 1
  local f pid url
  for f in "$RUN_DIR"/pids/*.pid; do
    [ -e "$f" ] || return 1
    pid=$(cat "$f")
    pid_matches "$pid" "$(cat "${f%.pid}.match")" || return 1
  done
  # shellcheck disable=SC1091
  (
    . "$RUN_DIR/env"
    for url in $SERVICE_URLS; do
      curl -fsS -o /dev/null --max-time 2 "$url/readyz" || exit 1
    done
    curl -fsS -o /dev/null --max-time 2 "$PROMETHEUS_URL/-/ready"
  )
}

if [ -d "$RUN_DIR" ]; then
  if healthy; then
    log "already up (same settings): $RUN_DIR/env"
    cat "$RUN_DIR/env"
    exit 0
  fi
  if [ -f "$RUN_DIR/.shardstock-local" ]; then
    log "a previous run in $RUN_DIR is stale or differs: stopping it first"
    RUN_DIR=$RUN_DIR "$HERE/down.sh"
  elif [ -n "$(ls -A "$RUN_DIR")" ]; then
    die "$RUN_DIR exists, is not empty and was not made by up.sh: refusing to use it (set RUN_DIR)"
  fi
fi

mkdir -p "$RUN_DIR/pids" "$RUN_DIR/redis" "$RUN_DIR/logs" "$RUN_DIR/prometheus/data"
touch "$RUN_DIR/.shardstock-local"   # down.sh only deletes directories with this mark
STARTED=1

# start_bg NAME MATCH CMD...: runs CMD in the background in its own session
# (so it outlives this script and the caller's terminal), logs to
# logs/NAME.log, records its PID and the word down.sh checks before signalling.
start_bg() {
  local name=$1 match=$2
  shift 2
  log "starting $name: $*"
  setsid "$@" >"$RUN_DIR/logs/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$RUN_DIR/pids/$name.pid"
  echo "$match" >"$RUN_DIR/pids/$name.match"
  # Until the child has exec'd, its command line is this script's: wait for
  # the exec (or its death), or wait_for would take a child still forking on
  # a loaded machine for one that exited (an empty log, a CI flake).
  local _
  for _ in $(seq 200); do
    pid_matches "$pid" "$match" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
}

# wait_for WHAT PIDNAME CMD...: retries CMD until it succeeds, failing early
# when the process PIDNAME has died (with the end of its log).
wait_for() {
  local what=$1 name=$2 deadline=$((SECONDS + READY_TIMEOUT))
  shift 2
  until "$@" >/dev/null 2>&1; do
    if [ -n "$name" ] && ! pid_matches "$(cat "$RUN_DIR/pids/$name.pid")" "$(cat "$RUN_DIR/pids/$name.match")"; then
      echo "---- last lines of $RUN_DIR/logs/$name.log ----" >&2
      tail -n 30 "$RUN_DIR/logs/$name.log" >&2 || true
      # A backtrace can push the error itself out of the tail.
      echo "---- its first error lines ----" >&2
      grep -m 5 -E "^Error|panicked|ERROR" "$RUN_DIR/logs/$name.log" >&2 || true
      fail "$name exited while waiting for $what"
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      if [ -n "$name" ]; then
        echo "---- last lines of $RUN_DIR/logs/$name.log ----" >&2
        tail -n 30 "$RUN_DIR/logs/$name.log" >&2 || true
      fi
      fail "timed out after ${READY_TIMEOUT}s waiting for $what (check: $*)"
    fi
    sleep 0.5
  done
}

# ---- PostgreSQL -----------------------------------------------------------------
log "checking PostgreSQL at $PGHOST:$PGPORT (user $PGUSER)"
if ! psql -d postgres -tAc 'SELECT 1' >/dev/null 2>&1; then
  fail "PostgreSQL does not answer at $PGHOST:$PGPORT as $PGUSER. Start it: pg_ctlcluster --skip-systemctl-redirect \$(ls /etc/postgresql) main start   (install: apt-get install -y postgresql)"
fi
if [ "$RESET_DB" = 1 ]; then
  log "RESET_DB=1: dropping database $DB_NAME"
  psql -d postgres -v ON_ERROR_STOP=1 -qc "DROP DATABASE IF EXISTS \"$DB_NAME\" WITH (FORCE)"
fi
if [ "$(psql -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'")" != 1 ]; then
  log "creating database $DB_NAME"
  psql -d postgres -v ON_ERROR_STOP=1 -qc "CREATE DATABASE \"$DB_NAME\""
fi
DATABASE_URL="postgres://$PGUSER@$PGHOST:$PGPORT/$DB_NAME"

# ---- NATS (JetStream) -------------------------------------------------------------
if [ -n "$NATS_URL" ]; then
  nats_hostport=${NATS_URL#nats://}
  log "checking NATS at $nats_hostport"
  if ! (exec 3<>"/dev/tcp/${nats_hostport%:*}/${nats_hostport##*:}") 2>/dev/null; then
    fail "NATS does not answer at $nats_hostport. Start it: nats-server -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log &   (install: apt-get install -y nats-server; or NATS_URL= for no relay)"
  fi
fi

# ---- Redis Cluster ----------------------------------------------------------------
REDIS_PORTS=()
for _ in $(seq 1 "$REDIS_COUNT"); do
  free_port port "$REDIS_BASE_PORT" 10000
  REDIS_PORTS+=("$port")
done
for port in "${REDIS_PORTS[@]}"; do
  dir="$RUN_DIR/redis/$port"
  mkdir -p "$dir"
  # AOF with fsync every second, as in compose; no RDB snapshots. Bound to
  # loopback only.
  cat >"$dir/redis.conf" <<CONF
port $port
bind 127.0.0.1
dir $dir
daemonize yes
pidfile $RUN_DIR/pids/redis-$port.pid
logfile $RUN_DIR/logs/redis-$port.log
cluster-enabled yes
cluster-config-file nodes.conf
cluster-node-timeout 5000
appendonly yes
appendfsync everysec
save ""
CONF
  echo "redis-server" >"$RUN_DIR/pids/redis-$port.match"
  log "starting redis-server on 127.0.0.1:$port"
  redis-server "$dir/redis.conf"
done
for port in "${REDIS_PORTS[@]}"; do
  wait_for "redis 127.0.0.1:$port to answer PING" "" \
    sh -c "redis-cli -p $port ping | grep -q PONG"
done

NODES=()
for port in "${REDIS_PORTS[@]}"; do NODES+=("127.0.0.1:$port"); done
log "creating the cluster: ${#NODES[@]} nodes, $REPLICAS replica(s) per master"
redis-cli --cluster create "${NODES[@]}" --cluster-replicas "$REPLICAS" --cluster-yes \
  >"$RUN_DIR/logs/redis-cluster-create.log" 2>&1 \
  || { cat "$RUN_DIR/logs/redis-cluster-create.log" >&2; fail "redis-cli --cluster create ${NODES[*]} --cluster-replicas $REPLICAS --cluster-yes"; }
# Every node must see the full slot map before a client connects, or the
# first commands can answer CLUSTERDOWN.
for port in "${REDIS_PORTS[@]}"; do
  wait_for "cluster_state:ok and $REDIS_COUNT known nodes on 127.0.0.1:$port" "" \
    sh -c "redis-cli -p $port cluster info | tr -d '\\r' | grep -qx 'cluster_state:ok' \
      && redis-cli -p $port cluster info | tr -d '\\r' | grep -qx 'cluster_known_nodes:$REDIS_COUNT'"
done
wait_for "redis-cli --cluster check to pass" "" redis-cli --cluster check "${NODES[0]}"

# Seed nodes: the three masters (the first three ports: --cluster create makes
# the first third of the list masters).
REDIS_URL="redis-cluster://${NODES[0]}?node=${NODES[1]}&node=${NODES[2]}"

# ---- shardstock processes ---------------------------------------------------------
SERVICE_URLS=()
SERVICE_TARGETS=()
SERVICE_PIDS=()
for i in $(seq 1 "$REPLICAS_SVC"); do
  free_port port $((BASE_PORT + i - 1))
  # Run from the repo root: relative paths in the config (e.g. a SQLite
  # default) then mean what they mean for `cargo run`.
  (cd "$REPO" && start_bg "shardstock-$i" "$(basename "$SHARDSTOCK_BIN")" \
    "$SHARDSTOCK_BIN" serve --config "$CONFIG" --listen "127.0.0.1:$port" \
    --redis "$REDIS_URL" --database-url "$DATABASE_URL" --admin-token "$ADMIN_TOKEN" \
    --min-replicas "$MIN_REPLICAS" --outbox true --nats-url "$NATS_URL")
  SERVICE_URLS+=("http://127.0.0.1:$port")
  SERVICE_TARGETS+=("127.0.0.1:$port")
  SERVICE_PIDS+=("$(cat "$RUN_DIR/pids/shardstock-$i.pid")")
done
for i in $(seq 1 "$REPLICAS_SVC"); do
  url=${SERVICE_URLS[$((i - 1))]}
  wait_for "$url/readyz to answer 200" "shardstock-$i" curl -fsS --max-time 2 "$url/readyz"
  log "shardstock-$i ready at $url"
done

# ---- Prometheus -------------------------------------------------------------------
free_port PROM_PORT "$PROM_PORT"
write_prometheus_config "$RUN_DIR/prometheus/prometheus.yml" "$ALERTS" "$SCRAPE_INTERVAL" "${SERVICE_TARGETS[@]}"
start_bg prometheus "prometheus" "$PROMETHEUS_BIN" \
  --config.file="$RUN_DIR/prometheus/prometheus.yml" \
  --storage.tsdb.path="$RUN_DIR/prometheus/data" \
  --storage.tsdb.retention.time=1d \
  --web.listen-address="127.0.0.1:$PROM_PORT" \
  --web.enable-lifecycle
PROMETHEUS_URL="http://127.0.0.1:$PROM_PORT"
wait_for "Prometheus at $PROMETHEUS_URL to be ready" prometheus curl -fsS --max-time 2 "$PROMETHEUS_URL/-/ready"
# Return only once every replica has been scraped, so a test can query at once.
scraped() {
  curl -fsS --max-time 2 "$PROMETHEUS_URL/api/v1/query" --data-urlencode 'query=sum(up{job="shardstock"})' \
    | grep -q "\"value\":\[[0-9.]*,\"$REPLICAS_SVC\"\]"
}
wait_for "Prometheus to scrape all $REPLICAS_SVC replicas" prometheus scraped

# ---- env file ---------------------------------------------------------------------
REDIS_PIDS=()
for port in "${REDIS_PORTS[@]}"; do REDIS_PIDS+=("$(cat "$RUN_DIR/pids/redis-$port.pid")"); done
# KEY="value" lines: `source`-able by a shell and readable by dotenv parsers.
env_line() {
  case $2 in *[\"\$\`\\]*) fail "value of $1 has a character the env file cannot hold: $2" ;; esac
  printf '%s="%s"\n' "$1" "$2"
}
{
  echo "# Written by deploy/local/up.sh at $(date -Is). Stop with deploy/local/down.sh."
  env_line RUN_DIR "$RUN_DIR"
  env_line REDIS_URL "$REDIS_URL"
  env_line REDIS_NODES "${NODES[*]}"
  env_line DATABASE_URL "$DATABASE_URL"
  env_line SERVICE_URLS "${SERVICE_URLS[*]}"
  env_line PROMETHEUS_URL "$PROMETHEUS_URL"
  env_line ADMIN_TOKEN "$ADMIN_TOKEN"
  env_line SHARDSTOCK_BIN "$SHARDSTOCK_BIN"
  env_line CONFIG "$CONFIG"
  env_line REDIS_PIDS "${REDIS_PIDS[*]}"
  env_line SERVICE_PIDS "${SERVICE_PIDS[*]}"
  env_line PROMETHEUS_PID "$(cat "$RUN_DIR/pids/prometheus.pid")"
} >"$RUN_DIR/env.tmp"
mv "$RUN_DIR/env.tmp" "$RUN_DIR/env"
echo "$FINGERPRINT" >"$RUN_DIR/fingerprint"

log "up. Environment in $RUN_DIR/env:"
cat "$RUN_DIR/env"
