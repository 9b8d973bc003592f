#!/usr/bin/env bash
# Idempotent: installs the Debian packages aenv needs, only when something is missing.
# gVisor's runsc comes from bookworm-backports: bookworm's own 20221219 hangs on
# `checkpoint --leave-running` (see RUNTIME-NOTES.md).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have bwrap || need+=(bubblewrap)
have busybox || need+=(busybox-static)
have getfattr || need+=(attr)
have gcc || need+=(gcc)
have strip || need+=(binutils)
[ -e /usr/lib/x86_64-linux-gnu/libc.a ] || [ -e /usr/lib/aarch64-linux-gnu/libc.a ] || need+=(libc6-dev)
have node || need+=(nodejs)
have npm || need+=(npm)
have mmdebstrap || need+=(mmdebstrap)
have nft || need+=(nftables)
have ip || need+=(iproute2)
have unshare || need+=(util-linux)
have fsfreeze || need+=(util-linux)       # workspaces: point-in-time clones
have losetup || need+=(mount)            # workspaces: loop devices
have mkfs.xfs || need+=(xfsprogs)        # workspaces: the node pool image (reflinks)
have mkfs.ext4 || need+=(e2fsprogs)      # workspaces: one ext4 disk per sandbox
have curl || need+=(curl)
have skopeo || need+=(skopeo)            # pulls OCI images (the node)
have umoci || need+=(umoci)              # builds test images (tests)
have docker-registry || need+=(docker-registry)  # a local registry (tests)
have wrk || need+=(wrk)                  # the proxy benchmark (bench/proxy_bench.py)
have redis-server || need+=(redis-server)  # cluster mode's state (tests start their own)
have chromium || need+=(chromium)        # the dashboard's browser test (tests/server/test_dashboard.py)
have chromedriver || need+=(chromium-driver)  # WebDriver for that headless Chromium (selenium)
{ have danted && have microsocks; } || need+=(dante-server microsocks)  # SOCKS5 servers (tests)
updated=0
update() { if [ "$updated" = 0 ]; then apt-get update -qq; updated=1; fi; }
if [ ${#need[@]} -gt 0 ]; then
  echo "installing system packages: ${need[*]}"
  update
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  # Debian's package also starts a registry service on :5000; the tests run their own (loopback).
  if [[ " ${need[*]} " == *" docker-registry "* ]] && have systemctl; then
    systemctl disable --now docker-registry >/dev/null 2>&1 || true
  fi
  # The same for Redis's own service on :6379.
  if [[ " ${need[*]} " == *" redis-server "* ]] && have systemctl; then
    systemctl disable --now redis-server >/dev/null 2>&1 || true
  fi
fi
runsc_ok() { have runsc && [ "$(runsc --version 2>/dev/null | head -1 | sed -n 's/.*0\.0~\([0-9]*\).*/\1/p')" -ge 20240729 ] 2>/dev/null; }
if ! runsc_ok; then
  . /etc/os-release
  if [ "${VERSION_CODENAME:-}" = bookworm ] && ! grep -rqs bookworm-backports /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "adding bookworm-backports for runsc"
    cat > /etc/apt/sources.list.d/aenv-backports.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    updated=0
  fi
  echo "installing runsc (gVisor) from bookworm-backports"
  update
  apt-get install -y -qq -t bookworm-backports runsc >/dev/null
fi
