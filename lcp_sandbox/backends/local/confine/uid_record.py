"""The record of the uids given to tenants: one for the whole machine, read and written
under a lock, so that two engines (two supervisors, two host processes) never give one
uid to two tenants.

    record_folder()        where the machine's record is: LCP_SANDBOX_UIDS_DIR (an
                           absolute path), else /var/lib/lcp-sandbox/uids
    UidRecord(tenants_root)
        .where             "machine-wide (<folder>)", or "this supervisor's only (why)":
                           where the machine's folder cannot be made (a host that is not
                           root, a read-only /var/lib), the engine's own record, as before:
                           <tenants_root>/.lcp-sandbox-uids.jsonl, or memory
        with .locked():    the lock taken (flock on <folder>/lock; a thread lock too), the
                           record read up to date: .entries, .append(line)
        with .sweeping(uid, wait):
                           one uid's own lock (flock on <folder>/sweep-<uid>), held while
                           the uid is swept, so that the record's lock is not: tenants get
                           uids meanwhile; False when ``wait`` is False and another holds it

The record is JSON lines, appended; the last line about a uid says what it is:

    {"uid": u, "root": R, "tenant": t}      given to tenant t of the engine whose tenants'
                                            folder is R (kept across restarts of it)
    {"uid": u, "engine": "<pid> <start>", "tenant": t}
                                            given by an engine without a tenants' folder,
                                            for its process's life (gone: as released)
    {"uid": u, "released": true}            given back: swept before it is given again
    {"uid": u, "clean": true}               swept and looked at: nothing of it is left
    {"uid": u, "retired": why}              something of it was left: never given again

An engine's own record from before (<tenants_root>/.lcp-sandbox-uids.jsonl: lines
without "root") is taken into the machine's once, the first time that engine opens it
(a uid the machine's record gives someone else is not: that tenant gets a new one), and
renamed to .lcp-sandbox-uids.jsonl.moved.  Once most lines say nothing any more, the
record is rewritten whole (a new file renamed over it).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import stat
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Optional

log = logging.getLogger("lcp_sandbox")

ENV_VAR = "LCP_SANDBOX_UIDS_DIR"
DEFAULT_FOLDER = "/var/lib/lcp-sandbox/uids"
RECORD = "uids.jsonl"
LOCK = "lock"
#: An engine's own record (before the machine's, and where there is none).
OWN_RECORD = ".lcp-sandbox-uids.jsonl"
_OPEN = os.O_CLOEXEC | os.O_NOFOLLOW

#: What a line says of its uid.
GIVEN, RELEASED, CLEAN, RETIRED = "given", "released", "clean", "retired"


@dataclass(frozen=True)
class Entry:
    """The last word of the record about one uid."""
    state: str
    # Given: "root <path>" or "engine <pid> <start>"; the tenant
    owner: str = ""
    tenant: str = ""
    why: str = ""


def record_folder() -> str:
    """The machine's record folder: LCP_SANDBOX_UIDS_DIR, else DEFAULT_FOLDER (ValueError
    for a value that is not an absolute path)."""
    value = os.environ.get(ENV_VAR)
    if value is None or value == "":
        return DEFAULT_FOLDER
    if not os.path.isabs(value) or "\0" in value:
        raise ValueError(f"{ENV_VAR}={value!r} must be an absolute path (the folder of the "
                         f"machine's record of tenants' uids; unset: {DEFAULT_FOLDER})")
    return os.path.normpath(value)


def engine_owner(serial: int) -> str:
    """The owner of uids given by an engine without a tenants' folder: this process's
    ``serial``-th (a supervisor)."""
    return f"engine {os.getpid()} {_start_time(os.getpid())} {serial}"


def _start_time(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return "?"


def owner_gone(owner: str) -> bool:
    """Whether the engine process that owns uids (``owner``: engine_owner()) is gone."""
    parts = owner.split()
    if len(parts) != 4 or parts[0] != "engine" or not parts[1].isdigit():
        return False
    return _start_time(int(parts[1])) != parts[2]


def _make_folder(path: str) -> None:
    """Make ``path`` (and its parents), mode 0700, unless it is there (OSError: it cannot
    be made)."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass


def _check_folder(path: str) -> None:
    """PermissionError unless ``path`` is a folder of this process's uid that no one else
    may write or read: a record anyone else could change is never used."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(
            errno.EPERM, f"the uid record folder {path} is not a folder of uid {os.geteuid()} "
            f"with mode 0700 (uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): not used; "
            f"remove it, or name another in {ENV_VAR}")


class UidRecord:
    """The record one TenantUids reads and writes (the module's docstring)."""

    def __init__(self, tenants_root: Optional[str]) -> None:
        self.root = os.path.realpath(tenants_root) if tenants_root else None
        self._thread_lock = threading.Lock()
        # uid -> this process's side of sweeping(uid) (flock is per open file: one per thread)
        self._sweep_locks: dict[int, threading.Lock] = {}
        self.entries: dict[int, Entry] = {}
        # (owner, tenant) -> uid, of the entries given
        self.given: dict[tuple[str, str], int] = {}
        self._lines = 0
        self._offset = 0
        self._inode: Optional[tuple[int, int]] = None
        self._torn = False
        folder = record_folder()
        try:
            _make_folder(folder)
            _check_folder(folder)
        except OSError as exc:
            # (root trusts no folder of another's; an engine that is not root gives no
            # uids, and cannot use root's record)
            if os.geteuid() == 0 and isinstance(exc, PermissionError):
                raise
            self._fallback(folder, exc)
            return
        self.folder: Optional[str] = folder
        self.path: Optional[str] = os.path.join(folder, RECORD)
        self.machine = True
        self.where = f"machine-wide ({folder})"

    def _fallback(self, folder: str, exc: OSError) -> None:
        """The machine's folder cannot be made (or, not root, used): this engine's own
        record."""
        self.machine = False
        self.folder = self.root
        self.path = os.path.join(self.root, OWN_RECORD) if self.root else None
        self.where = (f"this supervisor's only ({folder} cannot be made: "
                      f"{exc.strerror or exc}; another engine on this machine may give the "
                      f"same uids)")
        log.warning("the tenants' uids are recorded for this supervisor only: %s", self.where)

    # ------------------------------------------------------------ the lock
    @contextlib.contextmanager
    def locked(self) -> Iterator["UidRecord"]:
        """The record, up to date, while no one else (thread or process) changes it."""
        with self._thread_lock:
            lock_fd = self._lock_file()
            try:
                if lock_fd is not None:
                    fcntl.flock(lock_fd, fcntl.LOCK_EX)
                self._refresh()
                yield self
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)

    def _lock_file(self, name: str = LOCK) -> Optional[int]:
        if self.path is None:
            return None
        lock = (os.path.join(self.folder or "", name) if self.machine
                else f"{self.path}.{name}")
        return os.open(lock, os.O_RDWR | os.O_CREAT | _OPEN, 0o600)

    @contextlib.contextmanager
    def sweeping(self, uid: int, wait: bool) -> Iterator[bool]:
        """``uid``'s own lock, for its sweep (any thread or process of this record): True
        once held; False at once when ``wait`` is False and another holds it."""
        # (one C call, atomic under the GIL: also called holding locked()'s thread lock)
        thread_lock = self._sweep_locks.setdefault(uid, threading.Lock())
        if not thread_lock.acquire(blocking=wait):
            yield False
            return
        try:
            lock_fd = self._lock_file(f"sweep-{uid}")
            try:
                if lock_fd is not None:
                    try:
                        fcntl.flock(lock_fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                    except BlockingIOError:
                        yield False
                        return
                yield True
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)
        finally:
            thread_lock.release()

    # ------------------------------------------------------------ reading
    def _refresh(self) -> None:
        """Read what was appended since the last read (all of it when the file was
        rewritten meanwhile); the engine's own older record is taken in once."""
        if self.path is None:
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | _OPEN)
        except FileNotFoundError:
            self._take_in_own()
            return
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._inode or st.st_size < self._offset:
                self.entries.clear()
                self.given.clear()
                self._lines = self._offset = 0
                self._inode = (st.st_dev, st.st_ino)
            os.lseek(fd, self._offset, os.SEEK_SET)
            text = b""
            while chunk := os.read(fd, 1 << 20):
                text += chunk
        finally:
            os.close(fd)
        self._offset += len(text)
        if text:
            # under the lock no one is writing: an unfinished last line is a crash's
            self._torn = not text.endswith(b"\n")
        for line in text.splitlines():
            self._lines += 1
            self._apply_line(line, self.root if not self.machine else None)
        if self.machine:
            self._take_in_own()

    def _apply_line(self, line: bytes, implied_root: Optional[str]) -> Optional[int]:
        try:
            got = json.loads(line)
            uid = int(got["uid"])
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(got, dict):
            return None
        self._set(uid, _entry(got, implied_root))
        return uid

    def _set(self, uid: int, entry: Entry) -> None:
        old = self.entries.get(uid)
        if old is not None and old.state == GIVEN and \
                self.given.get((old.owner, old.tenant)) == uid:
            del self.given[(old.owner, old.tenant)]
        self.entries[uid] = entry
        if entry.state == GIVEN:
            self.given[(entry.owner, entry.tenant)] = uid

    def _take_in_own(self) -> None:
        """(The machine's record) this engine's own record from before, taken in."""
        if not self.machine or self.root is None:
            return
        old = os.path.join(self.root, OWN_RECORD)
        try:
            with open(old, "rb") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        mine: dict[int, Entry] = {}
        for line in lines:
            try:
                got = json.loads(line)
                mine[int(got["uid"])] = _entry(got, self.root)
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
        for uid, entry in sorted(mine.items()):
            known = self.entries.get(uid)
            if entry.state in (GIVEN, RELEASED) and (known is None or known.state == CLEAN):
                self.append(_line(uid, entry))
            elif entry.state == GIVEN and known != entry:
                log.warning("uid %d of tenant %r (%s) is another's in the machine's record: "
                            "that tenant gets a new uid", uid, entry.tenant, self.root)
        os.replace(old, old + ".moved")

    # ------------------------------------------------------------ writing
    def append(self, line: dict[str, Any]) -> None:
        """Write one line (root's, mode 0600) and apply it (the lock is held)."""
        uid = int(line["uid"])
        self._set(uid, _entry(line, None))
        if self.path is None:
            return
        data = ("\n" * self._torn + json.dumps(line) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _OPEN, 0o600)
        try:
            os.write(fd, data)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        self._torn = False
        self._lines += 1
        if self._inode is None:
            self._inode = (st.st_dev, st.st_ino)
        if self._inode == (st.st_dev, st.st_ino):
            self._offset += len(data)
        if self._lines > 2 * len(self.entries) + 4096:
            self._compact()

    def _compact(self) -> None:
        """Rewrite the record with one line per uid (a new file renamed over it); one
        that cannot be rewritten is kept as it is, and appended to."""
        if self.path is None:
            return
        part = f"{self.path}.{os.getpid()}.part"
        data = "".join(json.dumps(_line(u, e)) + "\n"
                       for u, e in sorted(self.entries.items())).encode()
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
                st = os.fstat(f.fileno())
            os.replace(part, self.path)
        except OSError as exc:
            log.warning("the uid record %s was not rewritten: %s", self.path, exc)
            with contextlib.suppress(OSError):
                os.unlink(part)
            return
        self._lines, self._offset, self._torn = len(self.entries), len(data), False
        self._inode = (st.st_dev, st.st_ino)


def _entry(got: dict[str, Any], implied_root: Optional[str]) -> Entry:
    """The Entry a line says (an engine's older line: no "root", given to ``implied_root``)."""
    if got.get("retired"):
        return Entry(RETIRED, why=str(got["retired"]))
    if got.get("clean") is True:
        return Entry(CLEAN)
    if got.get("released") is True:
        return Entry(RELEASED)
    tenant = str(got.get("tenant"))
    if isinstance(got.get("engine"), str):
        return Entry(GIVEN, f"engine {got['engine']}", tenant)
    root = got.get("root", implied_root)
    return Entry(GIVEN, f"root {root}", tenant) if isinstance(root, str) else Entry(RELEASED)


def _line(uid: int, entry: Entry) -> dict[str, Any]:
    """The line that says ``entry``."""
    if entry.state == GIVEN:
        kind, _, who = entry.owner.partition(" ")
        return {"uid": uid, kind: who, "tenant": entry.tenant}
    if entry.state == RETIRED:
        return {"uid": uid, "retired": entry.why or "retired"}
    return {"uid": uid, entry.state: True}
