#!/usr/bin/env bash
# Install what the monitoring tests need from Debian: `prometheus` (prometheus, promtool),
# `openssh-server` (an sshd the `make status` test starts itself) and `rsync` (`make merge`'s gather). The packages must not start
# their own services here: an executable /usr/sbin/policy-rc.d that exits 101 is in place during the
# install and removed afterwards (an existing one is kept). Idempotent: does nothing when all is there.
set -euo pipefail

need=()
command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
[[ -x /usr/sbin/sshd ]] || need+=(openssh-server)
command -v fuser >/dev/null 2>&1 || need+=(psmisc)
command -v rsync >/dev/null 2>&1 || need+=(rsync)  # make merge's gather (tests/monitoring/test_fleet.py)
if ((${#need[@]} == 0)); then
  echo "monitoring deps present: $(promtool --version 2>&1 | head -n1)"
  exit 0
fi
if [[ $EUID -ne 0 ]]; then
  echo "error: installing ${need[*]} needs root; run as root or: sudo $0" >&2
  exit 1
fi

policy=/usr/sbin/policy-rc.d
ours=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\n# installed by %s: do not start services during the install\nexit 101\n' "$0" >"$policy"
  chmod 0755 "$policy"
  ours=1
fi
cleanup() { if ((ours)); then rm -f "$policy"; fi; }
trap cleanup EXIT

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "installed ${need[*]}: $(promtool --version 2>&1 | head -n1)"
