#!/usr/bin/env bash
# Install aenv on this host for one or more roles and enable their systemd units:
#   sudo deploy/install.sh node                 # a node (needs root: gVisor, netns, cgroups)
#   sudo deploy/install.sh gateway scheduler    # the stateless services
# Settings go to /etc/aenv/aenv.env (AENV_CLUSTER, AENV_API_KEY, the repository); the file
# is made once with placeholders and never overwritten. See docs/deployment.md.
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[ $# -gt 0 ] || { echo "usage: $0 node|gateway|scheduler ..." >&2; exit 2; }
for role in "$@"; do
  case "$role" in node|gateway|scheduler) ;; *) echo "unknown role: $role" >&2; exit 2;; esac
done
if printf '%s\n' "$@" | grep -qx node; then
  bash "$here/scripts/install-system-deps.sh"
fi
install -d /opt/aenv
rm -rf /opt/aenv/src && cp -a "$here" /opt/aenv/src
python3 -m venv /opt/aenv/venv
/opt/aenv/venv/bin/pip install -q --upgrade pip
/opt/aenv/venv/bin/pip install -q /opt/aenv/src
install -d -m 0750 /etc/aenv
if [ ! -e /etc/aenv/aenv.env ]; then
  umask 077
  cat > /etc/aenv/aenv.env <<CONF
AENV_CLUSTER=redis://127.0.0.1:6379/0
AENV_API_KEY=e2b_$(head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n')
AENV_LISTEN=0.0.0.0:3000
# AENV_ADVERTISE=http://<this host's address>:3000
# AENV_REPOSITORY=s3://bucket/prefix
# AENV_S3_ENDPOINT=http://s3.internal:9000
AENV_GATEWAY_LISTEN=0.0.0.0:8080
AENV_SCHEDULER_LISTEN=0.0.0.0:9090
AENV_SCHEDULER=http://127.0.0.1:9090
CONF
  echo "wrote /etc/aenv/aenv.env: set AENV_CLUSTER and AENV_ADVERTISE before starting"
fi
for role in "$@"; do
  install -m 0644 "$here/deploy/systemd/aenv-$role.service" /etc/systemd/system/
done
systemctl daemon-reload
for role in "$@"; do
  systemctl enable "aenv-$role.service"
  echo "enabled aenv-$role (start: systemctl start aenv-$role)"
done
