"""Probes the kernel surface of a worker: refused families, and the calls real tools make."""
import ctypes
import os
import socket

from lcp_sandbox.core.syscall_numbers import number

MACHINE = os.uname().machine
COUNTER = 0
_CONFIRM = None
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

CLONE_NEWUSER, CLONE_FS, TIOCSTI, PR_SET_PTRACER = 0x10000000, 0x200, 0x5412, 0x59616D61


def set_confirm_handler(handler):
    global _CONFIRM
    _CONFIRM = handler


def _call(name: str, *args: int) -> list:
    """[result, errno] of a raw system call (errno 0 when it succeeded)."""
    nr = number(name, MACHINE)
    if nr is None:
        return [None, None]
    rc = _libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return [rc, ctypes.get_errno() if rc < 0 else 0]


def tool_refused() -> dict:
    """Each family the allowlist refuses, called with harmless arguments: {name: [rc, errno]}."""
    me = os.getpid()
    null = os.open("/dev/null", os.O_RDONLY)
    mask, param = _own_affinity(), ctypes.c_int(0)
    out = {
        "unshare": _call("unshare", CLONE_NEWUSER),
        "setns": _call("setns", -1, 0),
        "clone_newuser": _call("clone", CLONE_NEWUSER | CLONE_FS, 0, 0, 0, 0),  # EINVAL unfiltered
        "clone3": _call("clone3", 0, 0),
        "keyctl": _call("keyctl", 0xFFFF, 0, 0, 0, 0),
        "add_key": _call("add_key", 0, 0, 0, 0, 0),
        "request_key": _call("request_key", 0, 0, 0, 0),
        "bpf": _call("bpf", 0xFFFF, 0, 0),
        "perf_event_open": _call("perf_event_open", 0, 0, -1, -1, 0),
        "userfaultfd": _call("userfaultfd", 0xFFFF),
        "io_uring_setup": _call("io_uring_setup", 0, 0),
        "mount": _call("mount", 0, 0, 0, 0, 0),
        "umount2": _call("umount2", 0, 0),
        "pivot_root": _call("pivot_root", 0, 0),
        "chroot": _call("chroot", 0),
        "open_tree": _call("open_tree", -1, 0, 0),
        "fsopen": _call("fsopen", 0, 0),
        "fsmount": _call("fsmount", -1, 0, 0),
        "fsconfig": _call("fsconfig", -1, 0, 0, 0, 0),
        "fspick": _call("fspick", -1, 0, 0),
        "move_mount": _call("move_mount", -1, 0, -1, 0, 0),
        "mount_setattr": _call("mount_setattr", -1, 0, 0, 0, 0),
        "name_to_handle_at": _call("name_to_handle_at", -1, 0, 0, 0, 0),
        "open_by_handle_at": _call("open_by_handle_at", -1, 0, 0),
        "kexec_load": _call("kexec_load", 0, 0, 0, 0),
        "finit_module": _call("finit_module", -1, 0, 0),
        "delete_module": _call("delete_module", 0, 0),
        "quotactl": _call("quotactl", 0, 0, 0, 0),
        "ptrace": _call("ptrace", 0xFFFF, me, 0, 0),
        "process_vm_readv": _call("process_vm_readv", me, 0, 0, 0, 0, 0),
        "process_vm_writev": _call("process_vm_writev", me, 0, 0, 0, 0, 0),
        "kcmp": _call("kcmp", me, me, 0, 0, 0),
        "pidfd_getfd": _call("pidfd_getfd", -1, 0, 0),
        "move_pages": _call("move_pages", 0, 0, 0, 0, 0, 0),
        "migrate_pages": _call("migrate_pages", 0, 0, 0, 0),
        "personality_set": _call("personality", 0x0040000),           # ADDR_NO_RANDOMIZE
        "prctl_set_ptracer": _call("prctl", PR_SET_PTRACER, 0, 0, 0, 0),
        "ioctl_tiocsti": _call("ioctl", null, TIOCSTI, 0),
        "prlimit64_other": _call("prlimit64", me, 7, 0, 0),            # by pid, not 0
        # priority, scheduler and affinity by pid: a same-uid process is reachable by them
        # (each sets what is already set, so the call is harmless where it is let through)
        "setpriority_pid": _call("setpriority", 0, me, os.getpriority(os.PRIO_PROCESS, 0)),
        "sched_setaffinity_pid": _call("sched_setaffinity", me, ctypes.sizeof(mask),
                                       ctypes.addressof(mask)),
        "sched_setscheduler_pid": _call("sched_setscheduler", me, 0, ctypes.addressof(param)),
        "sched_setparam_pid": _call("sched_setparam", me, ctypes.addressof(param)),
        "ioprio_set_pid": _call("ioprio_set", 1, me, 0),
        "shmctl": _call("shmctl", -1, 0, 0),
        "iopl": _call("iopl", 0),
        "ioperm": _call("ioperm", 0, 0, 0),
    }
    os.close(null)
    return {"success": True, "output": {k: v for k, v in out.items() if v[0] is not None}}


def _own_affinity() -> ctypes.Array:
    """This process's CPU mask as sched_getaffinity(2) gives it."""
    mask = ctypes.create_string_buffer(128)
    _call("sched_getaffinity", 0, ctypes.sizeof(mask), ctypes.addressof(mask))
    return mask


def tool_allowed() -> dict:
    """Calls with an argument rule, in their allowed forms: {name: [rc, errno]}."""
    buf = ctypes.create_string_buffer(16)
    mask, param = _own_affinity(), ctypes.c_int(0)
    return {"success": True, "output": {
        "personality_query": _call("personality", 0xFFFFFFFF),
        "prctl_get_name": _call("prctl", 16, ctypes.addressof(buf), 0, 0, 0),
        "prctl_set_name": _call("prctl", 15, ctypes.addressof(buf), 0, 0, 0),
        "prctl_get_nnp": _call("prctl", 39, 0, 0, 0, 0),
        "prlimit64_self": _call("prlimit64", 0, 7, 0, ctypes.addressof(
            ctypes.create_string_buffer(16))),
        "mbind_nothing": _call("mbind", 0, 0, 0, 0, 0, 0),
        "getppid": _call("getppid"),
        "nice": _call("setpriority", 0, 0, os.getpriority(os.PRIO_PROCESS, 0)),
        "sched_setaffinity_self": _call("sched_setaffinity", 0, 128, ctypes.addressof(mask)),
        "sched_setscheduler_self": _call("sched_setscheduler", 0, 0, ctypes.addressof(param)),
        "ioprio_set_self": _call("ioprio_set", 1, 0, 0),
    }}


def tool_call(name: str) -> dict:
    """One raw system call with zero arguments: [rc, errno].

    Args:
        name (str): system call name
    """
    return {"success": True, "output": _call(name, 0, 0, 0, 0, 0, 0)}


def tool_mq() -> dict:
    """mq_unlink of a name that does not exist: ENOENT when allowed, EPERM when refused."""
    return {"success": True, "output": _call("mq_unlink", ctypes.addressof(
        ctypes.create_string_buffer(b"/lcp-sandbox-none")))}


def tool_increment() -> dict:
    """Module state: a counter."""
    global COUNTER
    COUNTER += 1
    return {"success": True, "output": COUNTER}


def tool_sleep(seconds: float) -> dict:
    """Sleeps.

    Args:
        seconds (float): how long
    """
    import time
    time.sleep(seconds)
    return {"success": True, "output": "woke"}


def tool_eat(mb: int) -> dict:
    """Holds ``mb`` MB of touched memory.

    Args:
        mb (int): megabytes
    """
    chunks = [bytearray(1 << 20) for _ in range(int(mb))]
    return {"success": True, "output": len(chunks)}


def tool_confirm() -> dict:
    """Asks the host's confirm handler."""
    return {"success": True, "output": list(_CONFIRM("rm -rf build", "shell"))}


def tool_client(lollms_client_instance=None) -> dict:
    """Calls a method of the lent client in the host."""
    return {"success": True, "output": lollms_client_instance.generate_text("hi")}


def tool_tcp(port: int) -> dict:
    """Connects to a loopback listener and reads one line.

    Args:
        port (int): port on 127.0.0.1
    """
    with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as s:
        return {"success": True, "output": s.recv(64).decode()}


def tool_corpus() -> dict:
    """What real tools do, each step's outcome ("ok" or the error)."""
    out = {}
    for name, step in _STEPS.items():
        try:
            out[name] = step()
        except Exception as exc:  # noqa: BLE001
            out[name] = f"{type(exc).__name__}: {exc}"
    return {"success": True, "output": out}


def _threads():
    import concurrent.futures
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert sum(ex.map(lambda x: x * x, range(100))) == 328350
    return "ok"


def _fork():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    _, status = os.waitpid(pid, 0)
    return "ok" if os.waitstatus_to_exitcode(status) == 7 else status


def _subprocess():
    import subprocess
    subprocess.run(["/bin/true"], check=True)
    git = subprocess.run(["git", "--version"], check=True, capture_output=True, text=True)
    sh = subprocess.run("echo hi | cat", shell=True, check=True, capture_output=True, text=True)
    return "ok" if git.stdout.startswith("git version") and sh.stdout == "hi\n" else "wrong"


def _pipes():
    r, w = os.pipe()
    os.write(w, b"x")
    return "ok" if os.read(r, 1) == b"x" else "wrong"


def _asyncio():
    import asyncio

    async def main():
        await asyncio.sleep(0.001)
        a, b = socket.socketpair()
        reader, _ = await asyncio.open_connection(sock=a)
        b.sendall(b"line\n")
        line = await reader.readline()
        await asyncio.gather(*(asyncio.sleep(0.001) for _ in range(5)))
        proc = await asyncio.create_subprocess_exec("/bin/true")
        b.close()
        return line == b"line\n" and await proc.wait() == 0
    return "ok" if asyncio.run(main()) else "wrong"


def _sqlite():
    import sqlite3
    with sqlite3.connect("probe.db") as db:
        db.execute("pragma journal_mode=wal")
        db.execute("create table if not exists t(x)")
        db.execute("insert into t values (1)")
        n = db.execute("select count(*) from t").fetchone()[0]
    return "ok" if n >= 1 else "wrong"


def _numpy():
    import numpy as np
    a = np.arange(10000, dtype=float).reshape(100, 100)
    return "ok" if float((a @ a)[0, 0]) == float(sum(i * i * 100 for i in range(100))) else "wrong"


def _mmap():
    import mmap
    m = mmap.mmap(-1, 1 << 20)
    m[0:4] = b"abcd"
    ok = m[0:4] == b"abcd"
    m.close()
    return "ok" if ok else "wrong"


def _signals():
    import signal
    import time
    seen = []
    old = signal.signal(signal.SIGALRM, lambda *a: seen.append(1))
    signal.setitimer(signal.ITIMER_REAL, 0.005)
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.001)
    signal.signal(signal.SIGALRM, old)
    return "ok" if seen else "no SIGALRM"


def _ctypes():
    libc = ctypes.CDLL(None)
    return "ok" if libc.getpid() == os.getpid() else "wrong"


def _files():
    import shutil
    import tempfile
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "a"), "w") as f:
        f.write("x")
    shutil.copy(os.path.join(d, "a"), os.path.join(d, "b"))
    os.symlink("a", os.path.join(d, "l"))
    os.mkfifo(os.path.join(d, "f"))
    shutil.rmtree(d)
    return "ok"


_STEPS = {"threads": _threads, "fork": _fork, "subprocess": _subprocess, "pipes": _pipes,
          "asyncio": _asyncio, "sqlite": _sqlite, "numpy": _numpy, "mmap": _mmap,
          "signals": _signals, "ctypes": _ctypes, "files": _files}
