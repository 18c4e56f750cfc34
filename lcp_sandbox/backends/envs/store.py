"""The store of environments: one folder per environment, named by its key.

    <store>/                      default: $XDG_CACHE_HOME (or ~/.cache)/lcp-sandbox/envs;
                                  Supervisor(envs_dir=...) or LCP_SANDBOX_ENVS_DIR
        <key>/                    a virtual environment, never changed once complete
            lock.txt              exact versions and hashes (uv pip compile --generate-hashes)
            lcp-env.json          requirements, interpreter, versions, who declared them
            .complete             written last: the sha256 of lock.txt
            .last-use             touched when a worker starts with it
            .users                the files whose declaration it serves (``envs prune``)
        .building/<key>-<pid>-<n> an environment being made (renamed into place when done)
        .locks/<key>.lock         one builder of a key at a time, across host processes

``ready(key)`` believes a folder only when its marker matches its lock and its
site-packages exist: a half-made or damaged environment is never used, it is made
again.  Only the host writes the store; a confined worker reads its own environment.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any, Iterator, NamedTuple, Optional

MARKER, LOCK, META, LAST_USE = ".complete", "lock.txt", "lcp-env.json", ".last-use"
# The declaring files that used it, one a line.
USERS = ".users"
ENV_VAR = "LCP_SANDBOX_ENVS_DIR"


class Built(NamedTuple):
    """A complete environment, as a worker is told of it."""
    key: str
    prefix: str
    # Its site-packages folders (purelib, platlib)
    site: tuple[str, ...]
    # Name -> exact version, from the lock.
    versions: dict[str, str]

    def for_worker(self, requirements: tuple[str, ...]) -> dict[str, Any]:
        return {"key": self.key, "prefix": self.prefix, "site": list(self.site),
                "versions": dict(self.versions), "requirements": list(requirements)}


def default_root() -> str:
    """The store's folder when the host names none."""
    if os.environ.get(ENV_VAR):
        return os.path.abspath(os.environ[ENV_VAR])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "lcp-sandbox", "envs")


def site_dirs(prefix: str) -> tuple[str, ...]:
    """The site-packages folders of the virtual environment at ``prefix``."""
    scheme = "venv" if "venv" in sysconfig.get_scheme_names() else (
        "nt" if os.name == "nt" else "posix_prefix")
    paths = {k: sysconfig.get_path(k, scheme, vars={"base": prefix, "platbase": prefix})
             for k in ("purelib", "platlib")}
    return tuple(dict.fromkeys(paths.values()))


def interpreter() -> dict[str, str]:
    """What an environment is built for: this interpreter, its ABI and platform."""
    return {"implementation": sys.implementation.name, "version": sys.version.split()[0],
            "cache_tag": str(sys.implementation.cache_tag),
            "soabi": str(sysconfig.get_config_var("SOABI") or ""),
            "platform": sysconfig.get_platform(),
            "executable": os.path.realpath(sys.executable)}


def lock_digest(text: bytes) -> str:
    return hashlib.sha256(text).hexdigest()


class Store:
    """The folder of environments (see the module's docstring)."""

    def __init__(self, root: Optional[str] = None) -> None:
        self.root = os.path.abspath(root) if root else default_root()
        self._noted: set[tuple[str, str]] = set()
        self._verified: dict[str, tuple[tuple[Any, ...], Built]] = {}

    def path(self, key: str) -> str:
        return os.path.join(self.root, key)

    def ready(self, key: str) -> Optional[Built]:
        """The complete environment of ``key``, or None (absent, half-made or damaged).
        Verified once (the lock's digest against the marker); then while its marker and
        lock keep their inode, size and mtime, three stats say it is still there."""
        prefix = self.path(key)
        try:
            seen = tuple(_identity(os.stat(os.path.join(prefix, f))) for f in (MARKER, LOCK))
        except OSError:
            return None
        memo = self._verified.get(key)
        if memo is not None and memo[0] == seen and os.path.isdir(memo[1].site[0]):
            return memo[1]
        try:
            marker = Path(prefix, MARKER).read_text(encoding="ascii").strip()
            lock = Path(prefix, LOCK).read_bytes()
        except (OSError, UnicodeDecodeError):
            return None
        site = site_dirs(prefix)
        if marker != lock_digest(lock) or not all(os.path.isdir(d) for d in site):
            return None
        built = Built(key, prefix, site, pinned(lock.decode("utf-8", "replace")))
        self._verified[key] = (seen, built)
        return built

    def used(self, key: str, where: str) -> None:
        """Note that a worker of the library declared in ``where`` starts with ``key`` now
        (``envs list``'s last use; ``envs prune`` keeps what a declaration still uses)."""
        with contextlib.suppress(OSError):
            Path(self.path(key), LAST_USE).touch()
            if (key, where) not in self._noted:
                users = Path(self.path(key), USERS)
                if where not in self.users(key):
                    with open(users, "a", encoding="utf-8") as f:
                        f.write(where + "\n")
                self._noted.add((key, where))

    def users(self, key: str) -> list[str]:
        """The files whose declaration ``key`` was built or used for."""
        try:
            meta = json.loads(Path(self.path(key), META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        try:
            lines = Path(self.path(key), USERS).read_text(encoding="utf-8").splitlines()
        except OSError:
            lines = []
        return list(dict.fromkeys([*meta.get("libraries", []), *filter(None, lines)]))

    def make_dirs(self) -> None:
        # An environment holds public packages only: the store may be passed by a confined
        # worker's uid (Landlock lets each read its own environment, nothing else of it).
        os.makedirs(self.root, mode=0o755, exist_ok=True)
        for sub in (".building", ".locks"):
            os.makedirs(os.path.join(self.root, sub), mode=0o700, exist_ok=True)

    @contextlib.contextmanager
    def locked(self, key: str) -> Iterator[None]:
        """One builder of ``key`` at a time, across host processes (a file lock)."""
        self.make_dirs()
        fd = os.open(os.path.join(self.root, ".locks", key + ".lock"), os.O_RDWR | os.O_CREAT,
                     0o600)
        try:
            _lock_file(fd)
            yield
        finally:
            # Closing releases the lock.
            os.close(fd)

    def building(self, key: str) -> str:
        """A fresh path for an environment being made (not created)."""
        base = os.path.join(self.root, ".building", f"{key}-{os.getpid()}-")
        n = 0
        while os.path.lexists(f"{base}{n}"):
            n += 1
        return f"{base}{n}"

    def install(self, key: str, made: str) -> None:
        """Put the complete environment ``made`` in place of ``key`` (holding its lock):
        whatever was there (damaged) is moved aside first, then removed."""
        target = self.path(key)
        if os.path.lexists(target):
            aside = self.building(key + "-old")
            os.rename(target, aside)
            shutil.rmtree(aside, ignore_errors=True)
        os.rename(made, target)

    def entries(self) -> list[dict[str, Any]]:
        """Every environment of the store: key, state, requirements, versions, size, last use."""
        out = []
        with contextlib.suppress(OSError):
            for name in sorted(os.listdir(self.root)):
                if name.startswith("."):
                    continue
                out.append(self._entry(name))
        return out

    def _entry(self, key: str) -> dict[str, Any]:
        path = self.path(key)
        try:
            meta = json.loads(Path(path, META).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            meta = {}
        try:
            last = os.stat(os.path.join(path, LAST_USE)).st_mtime
        except OSError:
            last = None
        return {"key": key, "path": path, "complete": self.ready(key) is not None,
                "requirements": meta.get("requirements", []),
                "libraries": self.users(key), "versions": meta.get("versions", {}),
                "interpreter": meta.get("interpreter", {}),
                "size": _size(path), "built": meta.get("built"), "last_use": last}

    def remove(self, key: str) -> None:
        with self.locked(key):
            aside = self.building(key + "-old")
            with contextlib.suppress(FileNotFoundError):
                os.rename(self.path(key), aside)
            shutil.rmtree(aside, ignore_errors=True)

    def sweep(self, older_than_s: float = 3600.0) -> None:
        """Remove leftovers of builds that died (another process's, when old)."""
        folder = os.path.join(self.root, ".building")
        now = time.time()
        with contextlib.suppress(OSError):
            for name in os.listdir(folder):
                path = os.path.join(folder, name)
                with contextlib.suppress(OSError):
                    mine = name.rsplit("-", 2)[-2:-1] == [str(os.getpid())]
                    if not mine and now - os.lstat(path).st_mtime > older_than_s:
                        shutil.rmtree(path, ignore_errors=True)


def pinned(lock: str) -> dict[str, str]:
    """name -> version of a lock's ``name==version`` lines."""
    out = {}
    for line in lock.splitlines():
        head = line.split(";", 1)[0].split(" ", 1)[0].strip()
        if "==" in head and not head.startswith(("#", "-")):
            name, _, version = head.partition("==")
            out[name.strip()] = version.strip()
    return out


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _size(path: str) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, f)).st_size
    return total


def _lock_file(fd: int) -> None:
    # Untested on this project's machines.
    if sys.platform == "win32":
        import msvcrt
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_LOCK, 1)
                return
            except OSError:
                continue
    else:
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
