#!/usr/bin/env bash
# Idempotent: installs the Debian packages aenv needs, only when something is missing.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have bwrap || need+=(bubblewrap)
have busybox || need+=(busybox-static)
have getfattr || need+=(attr)
have gcc || need+=(gcc libc6-dev)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
have node || need+=(nodejs)
have npm || need+=(npm)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
