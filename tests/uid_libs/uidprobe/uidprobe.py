"""Tries, at import and in its tool, to raise CAP_SETUID/CAP_SETGID into use and to change
its uid: a shared per-tenant template keeps them permitted, behind a key it never sees."""
import ctypes
import os

_libc = ctypes.CDLL(None, use_errno=True)
_SETUID_SETGID = (1 << 6) | (1 << 7)


class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _raise_caps() -> str:
    data = (_Data * 2)()
    data[0].effective = data[0].permitted = _SETUID_SETGID
    rc = _libc.capset(ctypes.byref(_Header(0x20080522, 0)), data)
    return "done" if rc == 0 else os.strerror(ctypes.get_errno())


def _become(uid: int) -> str:
    try:
        os.setresuid(uid, uid, uid)
        return "done"
    except OSError as exc:
        return exc.strerror


def _attempts(uid: int) -> dict:
    return {"uid": os.getuid(), "capset": _raise_caps(), "setresuid": _become(uid)}


AT_IMPORT = _attempts(4321)


def tool_ids(other_uid: int = 4321) -> dict:
    """Its ids, capability sets, what its import could do, and what it can do now."""
    with open("/proc/self/status") as f:
        st = {k: " ".join(v.split()) for k, _, v in (line.partition(":") for line in f)}
    return {"success": True, "output": {
        "uid": st["Uid"], "gid": st["Gid"], "groups": st["Groups"],
        "caps": [st[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")],
        "at_import": AT_IMPORT, "now": _attempts(other_uid)}}
