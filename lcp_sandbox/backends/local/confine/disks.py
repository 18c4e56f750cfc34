"""A tenant's disk cap (``"disk_mb"``): its confinement root, a file system of its own.

    ensure(root, mb)   the root is an ext4 file system of ``mb`` MiB, kept in an image beside
                       it (<parent>/.lcp-sandbox-disk-<name>.img, where no worker of that root
                       reaches) and loop-mounted at the root; so a write past the cap fails
                       inside the tool with ENOSPC, and each tenant's bytes are on a file system
                       of their own.  Made on first use: what the root held is copied in, and
                       removed from beneath it only once the copy is whole.
    release(root)      unmounts it (the supervisor's last worker of that root stopped: no
                       binding of it is live); its loop device is freed once nothing uses it
    remove(root)       unmounts it (also a disk an earlier host left mounted) and deletes its
                       image: the tenant's files go (Supervisor.remove_tenant)
    close()            unmounts what this supervisor mounted (the files stay in the images;
                       the next supervisor that needs a root mounts its image again)

Unmounting is lazy (``umount -l``): the mount leaves the host's tree at once, and the kernel
frees the file system and its loop device (mounted with autoclear) when the last process
using it ends; mounting the image again meanwhile reuses that loop device (util-linux does),
so one image never backs two file systems at once.  A root found unmounted by someone else
(``lcp-sandbox disks prune``) is mounted again for its next worker.

Precision: the cap counts every byte the file system holds (data, inodes, the journal), so a
tool writes less than ``mb`` into it (measured, 1 MiB writes until ENOSPC: 16 MiB -> 13,
64 -> 53, 256 -> 225, 1024 -> 957).  The image is sparse (a new 1 GiB one takes 32 MiB of the
host's disk) and grows with what is written.  Cost: a new disk in about 110 ms (mkfs, copy,
mount), mounting it again about 25 ms; on the first call of a tenant's worker only.
Needs a root host with loop devices (/dev/loop-control) and mkfs.ext4 (e2fsprogs);
elsewhere the worker is refused (503) unless best effort.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from typing import Any, Callable, Optional

log = logging.getLogger("lcp_sandbox")

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
            if root in self.mounted and not os.path.ismount(root):
                # unmounted behind this supervisor's back (disks prune): mounted again below
                del self.mounted[root]
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

    def release(self, root: str) -> bool:
        """Unmount ``root`` if this supervisor mounted it; whether it did."""
        root = os.path.realpath(root)
        with self._lock:
            if self.mounted.pop(root, None) is None:
                return False
            _unmount(root)
            return True

    def remove(self, root: str) -> None:
        """Unmount ``root`` (this supervisor's disk, or one of its image that another host
        left mounted) and delete its image (OSError when that fails)."""
        root = os.path.realpath(root)
        image = image_of(root)
        with self._lock:
            self.mounted.pop(root, None)
            if os.path.ismount(root) and mount_source(root) in loop_devices(image):
                _unmount(root)
            for path in (image, image + ".part"):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def close(self) -> None:
        with self._lock:
            for root in self.mounted:
                _unmount(root)
            self.mounted.clear()


IMAGE_PREFIX, IMAGE_SUFFIX = ".lcp-sandbox-disk-", ".img"


def image_of(root: str) -> str:
    return os.path.join(os.path.dirname(root),
                        f"{IMAGE_PREFIX}{os.path.basename(root)}{IMAGE_SUFFIX}")


def loop_devices(image: str) -> list[str]:
    """The loop devices backed by ``image`` now (/sys/block/loop*/loop/backing_file)."""
    image = os.path.realpath(image)
    found = []
    try:
        names = os.listdir("/sys/block")
    except OSError:
        return []
    for name in names:
        if not name.startswith("loop"):
            continue
        try:
            with open(f"/sys/block/{name}/loop/backing_file", encoding="utf-8") as f:
                backing = f.read().rstrip("\n")
        except OSError:
            continue
        if backing == image:
            found.append(f"/dev/{name}")
    return found


def mount_source(point: str) -> Optional[str]:
    """The source of the mount at ``point`` in this process's mount namespace (the last
    one there: the visible one), from /proc/self/mountinfo; None when nothing is mounted."""
    source = None
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            if _unescape(fields[4]) == point:
                source = _unescape(fields[sep + 2])
    return source


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (\\040 for a space...) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _unmount(root: str) -> None:
    # lazy: a worker still ending holds it; the loop device goes with the last user
    try:
        _run(["umount", "-l", root])
    except OSError as exc:
        log.warning("the tenant disk at %s was not unmounted: %s", root, exc)


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
    # copied: now only in the image
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _run(argv: list[str]) -> None:
    got = subprocess.run(argv, capture_output=True, text=True)
    if got.returncode != 0:
        raise OSError(f"{' '.join(argv[:2])}: {got.stderr.strip() or got.returncode}")


# ---------------------------------------------------------------- lcp-sandbox disks
def on_disk(tenants_root: str) -> list[dict[str, Any]]:
    """The tenant disks whose images are in ``tenants_root``, as the host sees them now:
    ``root``, ``image``, ``size_mb``, ``used_mb`` (what the sparse image takes), whether the
    root ``exists`` and is ``mounted`` from it, its ``loops`` (loop devices) and ``users``
    (the pids of the processes that use it: see users())."""
    tenants_root = os.path.realpath(tenants_root)
    out = []
    for entry in sorted(os.scandir(tenants_root), key=lambda e: e.name):
        name = entry.name
        if (not name.startswith(IMAGE_PREFIX) or not name.endswith(IMAGE_SUFFIX)
                or not entry.is_file(follow_symlinks=False)):
            continue
        root = os.path.join(tenants_root, name[len(IMAGE_PREFIX):-len(IMAGE_SUFFIX)])
        st = entry.stat(follow_symlinks=False)
        loops = loop_devices(entry.path)
        out.append({"root": root, "image": entry.path, "size_mb": st.st_size / 2**20,
                    "used_mb": st.st_blocks * 512 / 2**20, "exists": os.path.isdir(root),
                    "mounted": os.path.ismount(root) and mount_source(root) in loops,
                    "loops": loops, "users": users(loops)})
    return out


def prune(tenants_root: str, dry_run: bool = False) -> list[tuple[dict[str, Any], str]]:
    """Free the disks of ``tenants_root`` that no process uses: unmount the mounted ones
    (``umount``, not lazy: the kernel refuses one still busy), detach loop devices left
    without a mount, delete the images whose tenant root is gone.  [(disk, what was done)]."""
    done = []
    for disk in on_disk(tenants_root):
        if disk["users"]:
            done.append((disk, f"kept: in use by {len(disk['users'])} processes"))
            continue
        step = _freeing(disk)
        if step is None:
            continue
        what, act = step
        try:
            if not dry_run:
                act()
            done.append((disk, what))
        except OSError as exc:
            done.append((disk, f"kept: {exc}"))
    return done


def _freeing(disk: dict[str, Any]) -> Optional[tuple[str, Callable[[], None]]]:
    """What frees ``disk``, which no process uses, and how (None: nothing to free)."""
    if disk["mounted"]:
        return "unmounted", lambda: _run(["umount", disk["root"]])
    if disk["loops"]:
        def detach() -> None:
            for loop in disk["loops"]:
                _run(["losetup", "-d", loop])
        return "loop devices detached", detach
    if not disk["exists"]:
        return "image deleted (its root is gone)", lambda: os.unlink(disk["image"])
    return None


def users(loops: list[str]) -> list[int]:
    """The pids of the processes that use a file system on ``loops``: their working folder,
    root or an open file is on it, or their mount namespace (not this one) mounts it, as a
    fresh confined worker's does.  So a disk whose tenant has a live worker is in use."""
    devs = set()
    for loop in loops:
        try:
            devs.add(os.stat(loop).st_rdev)
        except OSError:
            continue
    if not devs:
        return []
    ours = os.stat("/proc/self/ns/mnt").st_ino
    namespaces: dict[int, bool] = {}
    return [int(e.name) for e in os.scandir("/proc")
            if e.name.isdigit() and _uses(e.name, devs, ours, namespaces)]


def _uses(pid: str, devs: set[int], ours: int, namespaces: dict[int, bool]) -> bool:
    base = f"/proc/{pid}"
    try:
        ns = os.stat(f"{base}/ns/mnt").st_ino
    except OSError:
        return False
    if ns != ours:
        if ns not in namespaces:
            namespaces[ns] = _mounts_one(pid, devs)
        if namespaces[ns]:
            return True
    try:
        links = [f"{base}/cwd", f"{base}/root", *(f"{base}/fd/{fd}"
                                                  for fd in os.listdir(f"{base}/fd"))]
    except OSError:
        return False
    for link in links:
        try:
            if os.stat(link).st_dev in devs:
                return True
        except OSError:
            continue
    return False


def _mounts_one(pid: str, devs: set[int]) -> bool:
    """Whether the mount namespace of ``pid`` mounts a file system of ``devs``."""
    wanted = {f"{os.major(d)}:{os.minor(d)}" for d in devs}
    try:
        with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
            return any(line.split()[2] in wanted for line in f)
    except OSError:
        return False
