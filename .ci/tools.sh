#!/usr/bin/env bash
# The tools some tests drive besides the services: Prometheus and promtool
# (tests/it/deploy_local.rs, deploy/check.sh) and Chromium
# (tests/it/live_page.rs), installed from Debian's packages when missing.
# Idempotent and quick when everything is there. Needs root (apt-get) only
# when something is missing.
#
# Called by .ci/run, and by those tests themselves (under a lock, once a test
# process), so the README's `cargo test` passes on a fresh machine with only
# Redis and PostgreSQL running.
#
#   bash .ci/tools.sh      exit 0 when every tool is there afterwards
set -euo pipefail
cd "$(dirname "$0")/.."

# A package install cut off earlier (a machine image saved mid-install)
# leaves dpkg "interrupted", and every apt-get install refuses until it is
# finished: finish it first when anything is to be installed.
finish_dpkg() {
  if [ -n "$(ls -A /var/lib/dpkg/updates 2>/dev/null)" ]; then
    echo "tools.sh: finishing an interrupted dpkg run"
    DEBIAN_FRONTEND=noninteractive dpkg --configure -a
  fi
}
if ! command -v promtool >/dev/null || [ ! -x /usr/bin/prometheus ] || [ ! -x /usr/bin/chromium ]; then
  finish_dpkg
fi
if ! command -v promtool >/dev/null || [ ! -x /usr/bin/prometheus ]; then
  echo "tools.sh: installing Prometheus and promtool"
  bash deploy/local/install.sh
fi
if [ ! -x /usr/bin/chromium ]; then
  echo "tools.sh: installing Chromium"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium ||
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; }
fi
command -v promtool >/dev/null && [ -x /usr/bin/prometheus ] && [ -x /usr/bin/chromium ]
