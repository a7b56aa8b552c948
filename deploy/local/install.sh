#!/usr/bin/env bash
# Installs, from Debian's packages, what deploy/local/up.sh and deploy/check.sh
# need and the machine lacks: redis-server/redis-cli, the PostgreSQL client,
# curl, Prometheus (which also brings promtool) and Python's YAML module.
# Run as root. Starts no service: Debian would start a system Prometheus on
# :9090 where it can; up.sh runs its own, so any such one is stopped here.
#
#   WITH_LINTERS=1   also install shellcheck and haproxy (check.sh uses them
#                    when present: shell lint, `haproxy -c` on the LB config)
set -euo pipefail

WITH_LINTERS=${WITH_LINTERS:-0}
trap 'echo "ERROR: install.sh failed at line $LINENO: $BASH_COMMAND" >&2' ERR

if [ "$(id -u)" -ne 0 ]; then
  echo "ERROR: run as root (apt-get install needs it): sudo bash $0" >&2
  exit 1
fi

# command -> Debian package providing it
declare -A PKG=(
  [redis-server]=redis-server
  [redis-cli]=redis-tools
  [psql]=postgresql-client
  [curl]=curl
  [promtool]=prometheus
)
missing=()
for cmd in "${!PKG[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${PKG[$cmd]}")
done
[ -x /usr/bin/prometheus ] || missing+=(prometheus)
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
if [ "$WITH_LINTERS" = 1 ]; then
  command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
  command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
fi

if [ ${#missing[@]} -eq 0 ]; then
  echo "install.sh: everything is already installed"
else
  # De-duplicate (prometheus may be listed twice).
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  echo "install.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # --no-install-recommends: prometheus recommends node-exporter and friends,
  # which up.sh does not use.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# A package may have started a system Prometheus (where an init system lets
# it): it would hold :9090 and scrape nothing of ours. Stop it and keep it off.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl disable --now prometheus 2>/dev/null || true
else
  # No systemd (containers): the package's init script, if policy-rc.d let
  # it run, wrote this PID file.
  pidfile=/run/prometheus/prometheus.pid
  if [ -f "$pidfile" ]; then
    pid=$(cat "$pidfile")
    if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q prometheus; then
      echo "install.sh: stopping the system Prometheus (pid $pid) the package started"
      if [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop || kill "$pid"; else kill "$pid"; fi
    fi
  fi
  if command -v update-rc.d >/dev/null 2>&1; then
    update-rc.d prometheus disable >/dev/null 2>&1 || true
  fi
fi

echo "install.sh: prometheus $(/usr/bin/prometheus --version 2>&1 | head -n 1 | awk '{print $3}'), promtool at $(command -v promtool)"
