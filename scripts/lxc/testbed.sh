#!/usr/bin/env bash
# A real LXC system container standing in for the Proxmox guest (tests/deploy).
#
#   scripts/lxc/testbed.sh rootfs          build (once) the cached bookworm rootfs tarball
#   scripts/lxc/testbed.sh wheelhouse      download (once) the wheels the container's ml-env needs
#   scripts/lxc/testbed.sh up              create and start the container; prints KEY=VALUE lines, among
#                                          them HSX_LXC_PCT: a `pct` stand-in (scripts/lxc/pct) for its VMID
#   scripts/lxc/testbed.sh pct-host        a "Proxmox host" with no container yet: a `pct` stand-in whose
#                                          `pct create` makes real containers from the cached rootfs as its
#                                          template; prints HSX_PCT (the wrapper), HSX_PCT_CONF_DIR (its
#                                          /etc/pve/lxc), HSX_PCT_TEMPLATE (the template's volume id), HSX_PCT_LOG
#   scripts/lxc/testbed.sh down            stop and remove it, and the containers pct-host's stand-in created
#                                          (idempotent; always safe to call)
#
# Environment: HSX_LXC_NAME (container name), HSX_LXC_DIR (its state directory, removed by down),
# HSX_LXC_NET (first three octets of its /30, e.g. 10.197.77), HSX_LXC_SHM (the container's
# /dev/shm size, as Proxmox sets it), HSX_LXC_VMID (the VMID the pct stand-in answers to, default 101),
# HSX_CI_CACHE (cache for rootfs and wheels), HSX_LXC_BIND_RO (space-separated SRC[:DST] host paths bind-mounted
# read-only into the container, at DST or else at the same path, as a Proxmox host mounts shared storage),
# HSX_LXC_MEMORY (the container's memory limit, e.g. 6G, as Proxmox's `memory:` sets it; default none).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
NAME=${HSX_LXC_NAME:-hsx-deploy-test}
DIR=${HSX_LXC_DIR:-/var/tmp/$NAME}
NET=${HSX_LXC_NET:-10.197.77}
SHM=${HSX_LXC_SHM:-64m}
VMID=${HSX_LXC_VMID:-101}
BIND_RO=${HSX_LXC_BIND_RO:-}
MEMORY=${HSX_LXC_MEMORY:-}
CACHE=${HSX_CI_CACHE:-/var/cache/hsextract-ci}
MIRROR=${HSX_DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH_SPEC=${HSX_TORCH_SPEC:-torch==2.13.0}
ROOTFS_TAR=$CACHE/rootfs-bookworm-minbase-v1.tar.gz
WHEELHOUSE=$CACHE/wheelhouse
VETH=vh-${NAME:0:12}
HOST_IP=$NET.1
GUEST_IP=$NET.2
PACKAGES=systemd-sysv,openssh-server,python3,python3-venv,psmisc,iproute2,procps,ca-certificates

log() { echo "testbed: $*" >&2; }

build_rootfs() {
  [[ -s $ROOTFS_TAR ]] && return 0
  mkdir -p "$CACHE"
  local build
  build=$(mktemp -d "$CACHE/rootfs-build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$build'" RETURN
  log "debootstrap bookworm (minbase) into $build (about a minute, once)"
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$build/rootfs" "$MIRROR" >"$build/debootstrap.log" 2>&1 || {
    tail -n 30 "$build/debootstrap.log" >&2
    return 1
  }
  rm -rf "$build/rootfs/var/cache/apt/archives/"*.deb "$build/rootfs/var/lib/apt/lists/"*
  tar --numeric-owner -C "$build/rootfs" -I 'gzip -1' -cf "$ROOTFS_TAR.tmp" .
  mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
}

build_wheelhouse() {
  local stamp
  stamp=$WHEELHOUSE/.complete-$(cat "$REPO/constraints.txt" "$REPO/extractor/pyproject.toml" | sha256sum | cut -c1-16)
  [[ -e $stamp ]] && return 0
  mkdir -p "$WHEELHOUSE"
  log "downloading wheels for the container's ml-env into $WHEELHOUSE (once)"
  local -a pip=("${HSX_HOST_PIP:-$REPO/.venv/bin/pip}")
  [[ -x ${pip[0]} ]] || pip=(python3 -m pip)
  # hsextract's dependencies (pinned by constraints.txt), one a line, torch left out: TORCH_SPEC picks it
  local -a deps
  mapfile -t deps < <(python3 -c 'import sys, tomllib
print("\n".join(d for d in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"] if not d.startswith("torch")))' \
    "$REPO/extractor/pyproject.toml")
  ((${#deps[@]} > 0)) || { log "no dependencies read from $REPO/extractor/pyproject.toml"; return 1; }
  # those, the CPU torch, and the build backend that `pip install <source dir>` needs offline. The extractor
  # itself is installed from source by the role.
  "${pip[@]}" download -q --disable-pip-version-check -d "$WHEELHOUSE" --only-binary=:all: \
    -c "$REPO/constraints.txt" "$TORCH_SPEC" "setuptools>=68" wheel "${deps[@]}"
  rm -f "$WHEELHOUSE"/.complete-*
  touch "$stamp"
}

ssh_opts() {
  echo "-i $DIR/id_ed25519 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ConnectTimeout=5 -o BatchMode=yes"
}

up() {
  build_rootfs
  build_wheelhouse
  down_quiet
  mkdir -p "$DIR"
  trap 'log "start failed; cleaning up"; down_quiet' ERR
  log "unpacking rootfs into $DIR/rootfs"
  mkdir -p "$DIR/rootfs"
  tar --numeric-owner -C "$DIR/rootfs" -xzf "$ROOTFS_TAR"
  ssh-keygen -q -t ed25519 -N '' -C "$NAME-test" -f "$DIR/id_ed25519"
  install -d -m 0700 "$DIR/rootfs/root/.ssh"
  install -m 0600 "$DIR/id_ed25519.pub" "$DIR/rootfs/root/.ssh/authorized_keys"
  echo "$NAME" >"$DIR/rootfs/etc/hostname"
  printf '127.0.0.1 localhost\n127.0.1.1 %s\n' "$NAME" >"$DIR/rootfs/etc/hosts"
  # Proxmox containers see no hardware clock nor udev; keep boot quick and quiet.
  for unit in systemd-udevd.service systemd-udevd-control.socket systemd-udevd-kernel.socket getty@tty1.service; do
    ln -sf /dev/null "$DIR/rootfs/etc/systemd/system/$unit"
  done
  # The host side of the veth is made again at every start (a reboot too): address it from LXC's up hook,
  # as a Proxmox bridge port would be attached again.
  cat >"$DIR/net-up" <<HOOK
#!/bin/sh
ip addr replace $HOST_IP/30 dev "\${LXC_NET_PEER:-$VETH}"
ip link set "\${LXC_NET_PEER:-$VETH}" up
HOOK
  chmod 0755 "$DIR/net-up"
  # The pct stand-in for this container (tests/deploy's "Proxmox host" is this machine).
  mkdir -p "$DIR/bin"
  cat >"$DIR/bin/pct" <<PCT
#!/bin/sh
HSX_PCT_VMID=$VMID HSX_LXC_NAME=$NAME HSX_LXC_DIR=$DIR HSX_PCT_LOG=$DIR/pct.log exec $REPO/scripts/lxc/pct "\$@"
PCT
  chmod 0755 "$DIR/bin/pct"
  cat >"$DIR/config" <<CONF
lxc.uts.name = $NAME
lxc.rootfs.path = dir:$DIR/rootfs
lxc.include = /usr/share/lxc/config/common.conf
lxc.apparmor.profile = unconfined
lxc.arch = amd64
lxc.net.0.type = veth
lxc.net.0.veth.pair = $VETH
lxc.net.0.flags = up
lxc.net.0.name = eth0
lxc.net.0.ipv4.address = $GUEST_IP/30
lxc.net.0.ipv4.gateway = $HOST_IP
lxc.net.0.script.up = $DIR/net-up
# /dev/shm as Proxmox sets it (deliberately smaller than the role wants: the role remounts it)
lxc.mount.entry = tmpfs dev/shm tmpfs rw,nosuid,nodev,size=$SHM,create=dir 0 0
lxc.mount.entry = $WHEELHOUSE srv/wheelhouse none bind,ro,create=dir 0 0
CONF
  local entry src dst
  for entry in $BIND_RO; do
    src=${entry%%:*}
    dst=${entry#*:}
    [[ -d $src ]] || { log "HSX_LXC_BIND_RO: $src is not a directory"; false; }
    echo "lxc.mount.entry = $src ${dst#/} none bind,ro,create=dir 0 0" >>"$DIR/config"
  done
  if [[ -n $MEMORY ]]; then
    if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
      echo "lxc.cgroup2.memory.max = $MEMORY" >>"$DIR/config"
    else
      echo "lxc.cgroup.memory.limit_in_bytes = $MEMORY" >>"$DIR/config"
    fi
  fi
  mkdir -p "$DIR/lxc/$NAME"
  mv "$DIR/config" "$DIR/lxc/$NAME/config"
  log "starting container $NAME ($GUEST_IP)"
  lxc-start -P "$DIR/lxc" -n "$NAME" -d -l INFO -o "$DIR/lxc.log"
  local deadline=$((SECONDS + 90))
  # shellcheck disable=SC2046
  until ssh $(ssh_opts) "root@$GUEST_IP" 'systemctl is-system-running --wait >/dev/null 2>&1; systemctl is-system-running' >"$DIR/state" 2>/dev/null \
      || grep -qE 'running|degraded' "$DIR/state" 2>/dev/null; do
    if ((SECONDS > deadline)); then
      log "container did not answer SSH within 90 s; lxc log:"
      tail -n 30 "$DIR/lxc.log" >&2
      false
    fi
    sleep 1
  done
  trap - ERR
  log "container $NAME up: systemd $(cat "$DIR/state")"
  cat <<OUT
HSX_LXC_NAME=$NAME
HSX_LXC_DIR=$DIR
HSX_LXC_IP=$GUEST_IP
HSX_LXC_KEY=$DIR/id_ed25519
HSX_LXC_WHEELHOUSE=/srv/wheelhouse
HSX_LXC_VMID=$VMID
HSX_LXC_PCT=$DIR/bin/pct
HSX_LXC_PCT_LOG=$DIR/pct.log
OUT
}

# A Proxmox host for `pct create` (scripts/lxc/pct): its config dir, its template storage, its containers' state.
TEMPLATE_NAME=debian-12-hsx-minbase_amd64.tar.gz
pct_host() {
  build_rootfs
  down_quiet
  mkdir -p "$DIR/bin" "$DIR/pve-lxc" "$DIR/templates" "$DIR/cts"
  ln -s "$ROOTFS_TAR" "$DIR/templates/$TEMPLATE_NAME"
  cat >"$DIR/bin/pct" <<PCT
#!/bin/sh
HSX_PCT_CONF_DIR=$DIR/pve-lxc HSX_PCT_STATE=$DIR/cts HSX_PCT_TEMPLATE_DIR=$DIR/templates HSX_PCT_LOG=$DIR/pct.log exec $REPO/scripts/lxc/pct "\$@"
PCT
  chmod 0755 "$DIR/bin/pct"
  cat <<OUT
HSX_PCT=$DIR/bin/pct
HSX_PCT_CONF_DIR=$DIR/pve-lxc
HSX_PCT_TEMPLATE=local:vztmpl/$TEMPLATE_NAME
HSX_PCT_LOG=$DIR/pct.log
OUT
}

down_quiet() {
  local ct vmid
  for ct in "$DIR"/cts/*/lxc/ct*; do
    [[ -d $ct ]] || continue
    vmid=${ct##*/ct}
    lxc-stop -P "${ct%/*}" -n "ct$vmid" -k >/dev/null 2>&1 || true
    ip link del "veth${vmid}i0" >/dev/null 2>&1 || true
    find /sys/fs/cgroup -maxdepth 3 -depth -type d \( -name "lxc.payload.ct$vmid" -o -name "lxc.monitor.ct$vmid" \) \
      -exec rmdir {} + >/dev/null 2>&1 || true
  done
  if [[ -d $DIR/lxc/$NAME ]]; then
    lxc-stop -P "$DIR/lxc" -n "$NAME" -k >/dev/null 2>&1 || true
  fi
  ip link del "$VETH" >/dev/null 2>&1 || true
  # leftover empty cgroups of the container (v1 and v2 layouts)
  find /sys/fs/cgroup -maxdepth 3 -depth -type d \( -name "lxc.payload.$NAME" -o -name "lxc.monitor.$NAME" \) \
    -exec rmdir {} + >/dev/null 2>&1 || true
  if [[ -d $DIR ]]; then
    rm -rf --one-file-system "$DIR"
  fi
}

case ${1:-} in
  rootfs) build_rootfs ;;
  wheelhouse) build_wheelhouse ;;
  up) up ;;
  pct-host) pct_host ;;
  down) down_quiet ;;
  *) echo "usage: $0 rootfs|wheelhouse|up|pct-host|down" >&2; exit 2 ;;
esac
