"""A tenant's disk cap (``"disk_mb"``): its confinement root, a file system of its own.

    ensure(root, mb)   the root is an ext4 file system of ``mb`` MiB, kept in an image beside
                       it (<parent>/.lcp-sandbox-disk-<name>.img, where no worker of that root
                       reaches) and loop-mounted at the root; so a write past the cap fails
                       inside the tool with ENOSPC, and each tenant's bytes are on a file system
                       of their own.  Made on first use: what the root held is copied in, and
                       removed from beneath it only once the copy is whole.
    close()            unmounts what this supervisor mounted (the files stay in the images;
                       the next supervisor that needs a root mounts its image again)

Precision: the cap counts every byte the file system holds (data, inodes, the journal), so a
tool writes less than ``mb`` into it (measured, 1 MiB writes until ENOSPC: 16 MiB -> 13,
64 -> 53, 256 -> 225, 1024 -> 957).  The image is sparse (a new 1 GiB one takes 32 MiB of the
host's disk) and grows with what is written.  Cost: a new disk in about 110 ms (mkfs, copy,
mount), mounting it again about 25 ms; on the first call of a tenant's worker only.
Needs a root host with loop devices (/dev/loop-control) and mkfs.ext4 (e2fsprogs);
elsewhere the worker is refused (503) unless best effort.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading

MIN_MB = 8
_MKFS = "mkfs.ext4"


class TenantDisks:
    """The roots this supervisor mounted, with their sizes."""

    def __init__(self) -> None:
        self.mounted: dict[str, int] = {}
        self._lock = threading.Lock()

    def ensure(self, root: str, mb: int) -> None:
        """Make ``root`` a file system of ``mb`` MiB (OSError saying why it cannot be)."""
        root = os.path.realpath(root)
        with self._lock:
            if self.mounted.get(root) == mb:
                return
            if root in self.mounted:
                raise OSError(f"its root {root} already holds at most {self.mounted[root]} MB; "
                              f"disk_mb={mb} asks another size (one cap a root)")
            missing = _missing()
            if missing:
                raise OSError(missing)
            image = image_of(root)
            if os.path.ismount(root):
                raise OSError(f"its root {root} is a mount point already (another supervisor's "
                              f"disk, or the host's): unmount it, or use another root")
            if not os.path.exists(image):
                _make(image, mb, root)
            elif os.path.getsize(image) != mb * 2**20:
                raise OSError(f"its disk image {image} holds {os.path.getsize(image) // 2**20} "
                              f"MB and disk_mb asks {mb}: a disk is not resized (remove the "
                              f"image to start the tenant's files anew)")
            _run(["mount", "-o", "loop,nosuid,nodev", image, root])
            self.mounted[root] = mb

    def close(self) -> None:
        with self._lock:
            for root in self.mounted:
                try:                               # (lazy: a worker still ending holds it)
                    _run(["umount", "-l", root])
                except OSError:
                    pass
            self.mounted.clear()


def image_of(root: str) -> str:
    return os.path.join(os.path.dirname(root), f".lcp-sandbox-disk-{os.path.basename(root)}.img")


def _missing() -> str:
    """What this host lacks for a disk of a tenant's own ("" when nothing)."""
    if os.geteuid() != 0:
        return "a disk of its own for a tenant's root needs a root host (mount, loop devices)"
    if not os.path.exists("/dev/loop-control"):
        return "a disk of its own for a tenant's root needs loop devices (/dev/loop-control)"
    if shutil.which(_MKFS) is None:
        return f"a disk of its own for a tenant's root needs {_MKFS} (the e2fsprogs package)"
    return ""


def _make(image: str, mb: int, root: str) -> None:
    """A new image of ``mb`` MiB holding what ``root`` holds now; then ``root`` is emptied."""
    os.makedirs(root, exist_ok=True)
    part = image + ".part"
    with open(part, "wb") as f:
        f.truncate(mb * 2**20)
    staging = tempfile.mkdtemp(prefix=".lcp-sandbox-disk-", dir=os.path.dirname(root))
    try:
        _run([_MKFS, "-q", "-F", "-m", "0", part])
        _run(["mount", "-o", "loop", part, staging])
        try:
            os.rmdir(os.path.join(staging, "lost+found"))
            if os.listdir(root):
                _run(["cp", "-a", "--", f"{root}/.", staging])
        finally:
            _run(["umount", staging])
        os.replace(part, image)
    finally:
        if os.path.exists(part):
            os.unlink(part)
        os.rmdir(staging)
    for name in os.listdir(root):                  # (copied: now only in the image)
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _run(argv: list[str]) -> None:
    got = subprocess.run(argv, capture_output=True, text=True)
    if got.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])}: {got.stderr.strip() or got.returncode}")
