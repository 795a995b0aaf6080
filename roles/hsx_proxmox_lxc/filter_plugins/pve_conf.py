"""Merge managed lines into a Proxmox container config (/etc/pve/lxc/<vmid>.conf).

Only the current config (the lines before the first ``[snapshot]`` section) is touched; snapshot
sections are kept byte for byte. Lines the role manages (the /dev/shm tmpfs entry, /dev/nvidia*
bind mounts, device allows for the given majors) are removed and the wanted set is appended;
``features:`` gets ``nesting=1`` merged into its other flags.

For a container that does not exist yet, ``hsx_pve_create_argv`` is the ``pct create`` command line; for one
that does, ``hsx_pve_unprivileged`` and ``hsx_pve_missing_mounts`` read what the role checks in its config.
"""

from __future__ import annotations

import re

_SHM = re.compile(r"^lxc\.mount\.entry:\s*tmpfs\s+dev/shm\s")
_NVIDIA_MOUNT = re.compile(r"^lxc\.mount\.entry:\s*/dev/nvidia")
_ALLOW = re.compile(r"^lxc\.cgroup2?\.devices\.allow:\s*c\s+(\d+):")


def hsx_pve_lines(shm_size_mb, gpu_count, majors, shm_huge="never"):
    huge = "" if shm_huge == "never" else f",huge={shm_huge}"
    lines = [f"lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={int(shm_size_mb)}M{huge},create=dir 0 0"]
    if int(gpu_count) > 0:
        lines += [f"lxc.cgroup2.devices.allow: c {int(m)}:* rwm" for m in sorted({int(m) for m in majors})]
        devices = [f"nvidia{i}" for i in range(int(gpu_count))]
        devices += ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
        lines += [f"lxc.mount.entry: /dev/{d} dev/{d} none bind,optional,create=file" for d in devices]
        lines.append("lxc.mount.entry: /dev/nvidia-caps dev/nvidia-caps none bind,optional,create=dir")
    return lines


def hsx_pve_merge(text, managed, majors, nesting):
    lines = text.splitlines()
    cut = next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))
    main, rest = lines[:cut], lines[cut:]
    majors = {int(m) for m in majors}
    kept = []
    for line in main:
        allow = _ALLOW.match(line)
        if _SHM.match(line) or _NVIDIA_MOUNT.match(line) or (allow and int(allow.group(1)) in majors):
            continue
        if nesting and line.startswith("features:"):
            flags = [f.strip() for f in line.split(":", 1)[1].split(",") if f.strip() and not f.strip().startswith("nesting=")]
            line = "features: " + ",".join(flags + ["nesting=1"])
        kept.append(line)
    if nesting and not any(line.startswith("features:") for line in kept):
        kept.append("features: nesting=1")
    while kept and not kept[-1].strip():
        kept.pop()
    out = kept + list(managed)
    if rest:
        out += [""] + rest
    return "\n".join(out) + "\n"


def _current(text):
    """The lines of the current config: those before the first [snapshot] section."""
    lines = text.splitlines()
    return lines[: next((i for i, line in enumerate(lines) if line.startswith("[")), len(lines))]


def hsx_pve_mount(mount):
    """One bind mount {host, path, ro} as pct's --mpN value (and the mpN line's value Proxmox writes)."""
    for key in ("host", "path"):
        if not str(mount.get(key, "")).startswith("/"):
            raise ValueError(f"hsx_proxmox_lxc_mounts: {mount!r} needs {key}: an absolute path")
    value = f"{str(mount['host']).rstrip('/') or '/'},mp={str(mount['path']).rstrip('/') or '/'}"
    return value + (",ro=1" if mount.get("ro", False) in (True, 1, "1", "true", "yes") else "")


def hsx_pve_create_argv(pct, vmid, template, settings):
    """The pct create command line of a new container from the role's creation settings."""
    features = set(settings.get("features") or []) | ({"nesting=1"} if settings.get("nesting") else set())
    argv = [
        str(pct), "create", str(int(vmid)), str(template),
        "--hostname", str(settings["hostname"]),
        "--cores", str(int(settings["cores"])),
        "--memory", str(int(settings["memory_mb"])),
        "--swap", str(int(settings["swap_mb"])),
        "--rootfs", f"{settings['rootfs_storage']}:{int(settings['rootfs_size_gb'])}",
        "--net0", str(settings["net0"]),
        "--unprivileged", "1" if settings.get("unprivileged") else "0",
    ]  # fmt: skip
    if features:
        argv += ["--features", ",".join(sorted(features))]
    for index, mount in enumerate(settings.get("mounts") or []):
        argv += [f"--mp{index}", hsx_pve_mount(mount)]
    if settings.get("ssh_public_keys"):
        argv += ["--ssh-public-keys", str(settings["ssh_public_keys"])]
    return argv


def hsx_pve_unprivileged(text):
    """Whether the current config says unprivileged: 1."""
    return any(re.fullmatch(r"unprivileged:\s*1\s*", line) for line in _current(text))


def hsx_pve_missing_mounts(text, mounts):
    """The --mpN values of the wanted mounts that no mpN line of the current config has (same host dir, mount
    point and read-only flag; other options such as backup=0 may be there too)."""
    present = []
    for line in _current(text):
        match = re.match(r"^mp\d+:\s*(.*)$", line)
        if match:
            volume, *options = match.group(1).split(",")
            opts = dict(option.split("=", 1) for option in options if "=" in option)
            present.append((volume.rstrip("/") or "/", opts.get("mp", "").rstrip("/") or "/", opts.get("ro") == "1"))
    missing = []
    for mount in mounts or []:
        value = hsx_pve_mount(mount)
        volume, *options = value.split(",")
        want = (volume, options[0].removeprefix("mp="), "ro=1" in options)
        if want not in present:
            missing.append(value)
    return missing


class FilterModule:
    def filters(self):
        return {
            "hsx_pve_lines": hsx_pve_lines,
            "hsx_pve_merge": hsx_pve_merge,
            "hsx_pve_mount": hsx_pve_mount,
            "hsx_pve_create_argv": hsx_pve_create_argv,
            "hsx_pve_unprivileged": hsx_pve_unprivileged,
            "hsx_pve_missing_mounts": hsx_pve_missing_mounts,
        }
