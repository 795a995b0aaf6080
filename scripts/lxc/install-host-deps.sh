#!/usr/bin/env bash
# Host packages the real-LXC deployment test needs (idempotent: installs only what is missing).
# Runs as root on Debian bookworm (CI, developers' machines).
set -euo pipefail
packages=(lxc debootstrap openssh-client psmisc iproute2 curl ca-certificates xz-utils)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]]; then
  echo "error: missing host packages ${missing[*]}; run this script as root" >&2
  exit 1
fi
echo "installing host packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages must not start their own services here (lxc-net would add a bridge and dnsmasq).
policy=/usr/sbin/policy-rc.d
created_policy=0
if [[ ! -e $policy ]]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  created_policy=1
fi
cleanup() { if ((created_policy)); then rm -f "$policy"; fi; }
trap cleanup EXIT
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
