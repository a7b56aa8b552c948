#!/bin/sh
# One-shot Redis Cluster bootstrap, run by the `redis-cluster-init` service of
# deploy/docker-compose.yml (POSIX sh: the redis:7 image has no bash needs).
#
#   NODES="redis-1:6379 redis-2:6379 ..."   every node, masters first
#   REPLICAS=1                              replicas per master
#
# Idempotent: when the first node already belongs to a cluster (volumes kept
# from an earlier `up`) it only waits for cluster_state:ok.
set -eu

NODES=${NODES:?set NODES to the space-separated host:port list}
REPLICAS=${REPLICAS:-1}
WAIT_SECS=${WAIT_SECS:-60}

# Redis 7.0's CLUSTER MEET takes IP addresses, not names: resolve each compose
# service name (retrying while Docker's DNS catches up).
addrs=""
for node in $NODES; do
  host=${node%:*}
  port=${node##*:}
  ip=""
  i=0
  while [ "$i" -lt "$WAIT_SECS" ]; do
    ip=$(getent ahostsv4 "$host" | awk 'NR == 1 { print $1 }') || true
    [ -n "$ip" ] && break
    i=$((i + 1))
    sleep 1
  done
  if [ -z "$ip" ]; then
    echo "redis-cluster-init: cannot resolve $host" >&2
    exit 1
  fi
  # Wait for the node to answer before asking it to join.
  i=0
  until redis-cli -h "$ip" -p "$port" ping 2>/dev/null | grep -q PONG; do
    i=$((i + 1))
    if [ "$i" -ge "$WAIT_SECS" ]; then
      echo "redis-cluster-init: $host ($ip:$port) does not answer PING" >&2
      exit 1
    fi
    sleep 1
  done
  addrs="$addrs $ip:$port"
done
addrs=${addrs# }
first=${addrs%% *}
first_host=${first%:*}
first_port=${first##*:}

known=$(redis-cli -h "$first_host" -p "$first_port" cluster info | tr -d '\r' \
  | awk -F: '$1 == "cluster_known_nodes" { print $2 }')
if [ "${known:-1}" -gt 1 ]; then
  echo "redis-cluster-init: cluster already formed ($known nodes known); not re-creating"
else
  echo "redis-cluster-init: creating the cluster from $addrs"
  # shellcheck disable=SC2086 # one word per node on purpose
  redis-cli --cluster create $addrs --cluster-replicas "$REPLICAS" --cluster-yes
fi

i=0
until redis-cli -h "$first_host" -p "$first_port" cluster info | tr -d '\r' \
  | grep -q '^cluster_state:ok$'; do
  i=$((i + 1))
  if [ "$i" -ge "$WAIT_SECS" ]; then
    echo "redis-cluster-init: cluster_state is not ok after ${WAIT_SECS}s" >&2
    redis-cli -h "$first_host" -p "$first_port" cluster info >&2 || true
    exit 1
  fi
  sleep 1
done
echo "redis-cluster-init: cluster_state:ok"
