"""What backs the dump root's memory: whether its tmpfs hands out huge pages.

Every dump is written once by the server and read once by the extractor, tens of megabytes a row on a
wide model. On a tmpfs with 4 KiB pages the kernel allocates, faults in and frees each page on its own;
with ``huge=within_size`` a file's whole 2 MiB stretches take one page each. Measured on one core with
the 28 MB dump of a 4096-wide row of 858 tokens (bench/bench_dump_pages.py, five runs on one virtual machine): the
dump's write 2.2 to 2.7 times as fast, its read and check 2.4 to 2.9 times. The writer sizes each file before it writes
(``tensor_file.write_safetensors_to``): ``within_size`` gives huge pages only to what lies inside a file's
size (Documentation/filesystems/tmpfs.rst), and files under 2 MiB (meta.json) keep small ones.

``deploy.yml`` mounts the container's /dev/shm that way (``hsx_shm_huge``); elsewhere both sides say once
how to (:func:`huge_pages_advice`).
"""

from __future__ import annotations

from pathlib import Path

from hsextract.durable.mounts import MOUNTINFO, mount_of

#: the kernel's switch above every tmpfs mount's own option: "deny" turns huge pages off, "force" on
SHMEM_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
#: the mount option that gives a dump file huge pages and leaves small files small
WANTED = "within_size"
#: the values of ``huge=`` under which a written file gets huge pages ("advise" gives them only to a mapping that
#: asks, never to ``write``)
HUGE_VALUES = frozenset({"always", "within_size"})


def tmpfs_mount(path: Path, mountinfo: Path = MOUNTINFO) -> tuple[str, str] | None:
    """``(mount point, huge= value)`` of the tmpfs that holds ``path`` ("never" when the mount sets none);
    None when ``path`` is on another filesystem or cannot be told."""
    mount = mount_of(path, mountinfo)
    if mount is None or mount.fstype != "tmpfs":
        return None
    return mount.point, mount.options.get("huge", "never")


def kernel_override(shmem_enabled: Path = SHMEM_ENABLED) -> str | None:
    """What the kernel's switch sets for every tmpfs mount: "deny", "force", or None when each mount's option holds
    (or when the kernel has no huge pages for tmpfs: the file is absent and :func:`huge_pages_advice` is silent)."""
    try:
        text = shmem_enabled.read_text()
    except OSError:
        return None
    chosen = text[text.find("[") + 1 : text.find("]")] if "[" in text else text.strip()
    return chosen if chosen in ("deny", "force") else None


def huge_pages_advice(path: Path, mountinfo: Path = MOUNTINFO, shmem_enabled: Path = SHMEM_ENABLED) -> str | None:
    """One line for the log when the dump root at ``path`` is on a tmpfs without huge pages and could have
    them; None when it has them, is not on tmpfs, or the kernel cannot give them."""
    mount = tmpfs_mount(path, mountinfo)
    if mount is None or not shmem_enabled.exists():
        return None
    point, huge = mount
    override = kernel_override(shmem_enabled)
    if override == "force" or (override is None and huge in HUGE_VALUES):
        return None
    if override == "deny":
        return (
            f"dump dir {path} is on a tmpfs whose huge pages the kernel denies ({SHMEM_ENABLED} is deny): each dump is "
            "written and read in 4 KiB pages, two to three times the CPU of huge ones; set it to within_size "
            "(docs/deploy.md#devshm-size)"
        )
    return (
        f"dump dir {path} is on a tmpfs mounted without huge pages ({point}, huge={huge}): each dump is written and "
        f"read in 4 KiB pages, two to three times the CPU of huge ones. As root: mount -o remount,huge={WANTED} {point} "
        "(deploy.yml mounts the container's /dev/shm so; docs/deploy.md#devshm-size)"
    )
