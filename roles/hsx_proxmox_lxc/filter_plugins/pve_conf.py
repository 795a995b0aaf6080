"""Merge managed lines into a Proxmox container config (/etc/pve/lxc/<vmid>.conf).

Only the current config (the lines before the first ``[snapshot]`` section) is touched; snapshot
sections are kept byte for byte. Lines the role manages (the /dev/shm tmpfs entry, /dev/nvidia*
bind mounts, device allows for the given majors) are removed and the wanted set is appended;
``features:`` gets ``nesting=1`` merged into its other flags.
"""

from __future__ import annotations

import re

_SHM = re.compile(r"^lxc\.mount\.entry:\s*tmpfs\s+dev/shm\s")
_NVIDIA_MOUNT = re.compile(r"^lxc\.mount\.entry:\s*/dev/nvidia")
_ALLOW = re.compile(r"^lxc\.cgroup2?\.devices\.allow:\s*c\s+(\d+):")


def hsx_pve_lines(shm_size_mb, gpu_count, majors):
    lines = [f"lxc.mount.entry: tmpfs dev/shm tmpfs rw,nosuid,nodev,size={int(shm_size_mb)}M,create=dir 0 0"]
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


class FilterModule:
    def filters(self):
        return {"hsx_pve_lines": hsx_pve_lines, "hsx_pve_merge": hsx_pve_merge}
