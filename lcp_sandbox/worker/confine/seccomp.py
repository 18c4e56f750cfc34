"""Seccomp: a confined worker reaches only the system calls real tools use.

restrict_syscalls() installs one classic-BPF filter on this process (all its threads)
and reports what holds.  It takes no INIT: a process that later forks workers (a
template, a spare) can call it before any library code runs there, and a worker that
inherited it calls it again to narrow further (filters stack; ``seccomp`` and
``prctl(PR_SET_NO_NEW_PRIVS)`` stay allowed for that).

The filter, from core/syscalls.py's data:

    arch != this machine's (i386 int 0x80 with its socketcall(2), arm32 compat)  EPERM
    x86_64: nr & 0x40000000 (x32)                                                 EPERM
    a balanced search over the numbers (runs of equal answers, ~9 compares deep):
      allowed                                     ALLOW
      clone3                                      ENOSYS (glibc falls back to clone)
      clone        flags with any CLONE_NEW*      EPERM, else ALLOW
      socket       network on: AF_INET, AF_INET6, AF_NETLINK, AF_UNIX (ON_WITHOUT_UNIX,
                   where no Landlock scope keeps abstract unix sockets apart: no AF_UNIX);
                   network off:
                   AF_NETLINK with NETLINK_ROUTE only (no loopback: workers of one
                   confined template share its namespace); a network policy (a fresh
                   worker: its namespace its own): AF_INET, AF_INET6 and NETLINK_ROUTE,
                   no AF_UNIX (its dialer to the host's proxy was opened before); a policy
                   without a namespace of its own (POLICY_BY_PORT): as the network off, its
                   TCP sockets handed by the proxy, and listen EPERM; any other family
                   (AF_VSOCK reaches the hypervisor from any namespace, AF_ALG the
                   kernel's crypto, AF_PACKET...) or protocol                        EACCES
      socketpair   network off, a policy or ON_WITHOUT_UNIX: datagram type EACCES (an
                   AF_UNIX datagram socket can sendto() any path even when paired);
                   stream/seqpacket ALLOW
      prctl, personality, ioctl   the options/requests of core/syscalls.py, else EPERM
      prlimit64    pid 0 (this process: glibc's getrlimit/setrlimit), else EPERM
      setpriority (PRIO_PROCESS, 0), sched_set{affinity,scheduler,param,attr} (0),
      ioprio_set (IOPRIO_WHO_PROCESS, 0)    the caller itself (os.nice, a thread's own
                   affinity), else EPERM: workers forked from one template share a uid,
                   and a PID namespace of their own is what fresh workers have instead
      anything else                               EPERM
With the network off this is also what keeps pathname unix sockets out of reach
(Landlock ABI <= 7 and a network namespace do not cover them); io_uring (its
IORING_OP_SOCKET) is refused like every call not on the list.

Cost.  Since Linux 5.11 the kernel caches, per system call number, "this filter allows
it whatever the arguments" (it emulates the program with only nr and arch known), so an
allowed call without an argument rule never runs the BPF.  The filtered calls come first
(a chain of JEQ, most frequent first, then their argument block); a refused call goes
through a balanced search over runs of numbers (~9 compares).  Measured on x86_64
(kernel 6.18, JIT on), ns per raw syscall() from C, the filter installed in the process,
median of 5 interleaved runs of 7 x 200,000 calls:

                              no filter   this generator   libseccomp 2.5.4   its tree
    getppid (allowed, cached)     75            84               84              82
    ioctl(FIONREAD) (filtered)    72            98              136             100
    prctl(PR_GET_NAME) (filtered) 128          152              187             158
    install in a fresh fork        -          ~0.6 ms           ~2.7 ms         ~2.8 ms
("its tree": SCMP_FLTATR_CTL_OPTIMIZE=2; libseccomp's install is seccomp_init, ~270
rule_add through ctypes and seccomp_load; ours is one seccomp(2) of a program packed
once per process: the zygote packs the usual two before it forks, prebuild().)  Hence
this generator: as fast as libseccomp's best at run time, 4x cheaper to install, and no
C dependency to install or to miss.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import os
import socket
import struct
import sys
from typing import Optional, Union

from ...core import syscalls as S
from ...core.policy import SWITCHED_OFF
from ...core.syscall_numbers import number
from ..libc import PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP
from ..libc import libc as _libc
from ..libc import prctl as _prctl

_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_X32_BIT = 0x40000000
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_SECCOMP_SET_MODE_FILTER, _SECCOMP_FILTER_FLAG_TSYNC, _SECCOMP_MODE_FILTER = 1, 1, 2
_LD, _JA, _JEQ, _JGE, _JSET, _AND, _RET = 0x20, 0x05, 0x15, 0x35, 0x45, 0x54, 0x06
# Struct seccomp_data (little endian)
_OFF_NR, _OFF_ARCH = 0, 4
_SCHED_SETTERS = ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr")
_IOPRIO_WHO_PROCESS = 1
# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET
_NS_FLAGS = 0x7E020000
#: With the network on.  With it off, only AF_NETLINK's NETLINK_ROUTE: network-off workers
#: of one confined template share its network namespace, where loopback (TCP, UDP) and
#: NETLINK_USERSOCK (any process may send to any port) would connect tenants; so no
#: network-off confined worker, fresh or not, has loopback or any other socket.
_SOCKET_FAMILIES_ON = (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK, socket.AF_UNIX)
_SOCKET_FAMILIES_ON_WITHOUT_UNIX = (socket.AF_INET, socket.AF_INET6, socket.AF_NETLINK)
ALLOW, EPERM = _RET_ALLOW, _RET_ERRNO | errno.EPERM
_EACCES, _ENOSYS = _RET_ERRNO | errno.EACCES, _RET_ERRNO | errno.ENOSYS

#: One BPF instruction: (code, jt, jf, k)
Row = tuple[int, int, int, int]
#: The "network" of a worker with a policy (core/egress_rules.py): restrict_syscalls(POLICY)
POLICY = "policy"
#: The "network" of a worker with a policy and no network namespace of its own (egress_dial.py's
#: dial_by_port()): no socket but NETLINK_ROUTE, as with the network off (its TCP sockets
#: come from the host's proxy), and no listen() (no server on the host's loopback)
POLICY_BY_PORT = "policy by port"
#: The "network" of a worker with the network on where nothing else keeps the abstract unix
#: sockets of the host and of other tenants out of its reach (no Landlock scope, the host's
#: network namespace): the network as the host's, but no AF_UNIX socket at all.
ON_WITHOUT_UNIX = "on without unix sockets"
Network = Union[bool, str]
UNIX_BLOCKED_POLICY = ("blocked (seccomp: no unix socket can be created; TCP and UDP reach only "
                       "its own namespace's loopback, where the relay to the host's proxy is)")
UNIX_BLOCKED = ("blocked (seccomp: no socket can be created but AF_NETLINK's NETLINK_ROUTE; "
                "no loopback either)")
UNIX_BLOCKED_BY_PORT = ("blocked (seccomp: no socket can be created but AF_NETLINK's "
                        "NETLINK_ROUTE, no listen(); its TCP sockets are the host's proxy's)")
UNIX_BLOCKED_ON = ("blocked (seccomp: no unix socket can be created, abstract or pathname: no "
                   "Landlock scope keeps the host's and other tenants' abstract sockets apart "
                   "here; TCP and UDP as the host's, stream socketpairs)")


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _arg(i: int) -> int:
    """Offset of the low 32 bits of argument ``i`` in struct seccomp_data."""
    return 16 + 8 * i


def _args_are(*values: int) -> list[Row]:
    """ALLOW if argument i is ``values[i]`` for each i, else EPERM."""
    rows: list[Row] = []
    # A mismatch jumps past the rest to EPERM.
    for i, value in enumerate(values):
        rows += [(_LD, 0, 0, _arg(i)), (_JEQ, 0, 2 * (len(values) - 1 - i) + 1, value)]
    return rows + [(_RET, 0, 0, ALLOW), (_RET, 0, 0, EPERM)]


def _one_of(arg: int, values: tuple, match: int, other: int) -> list[Row]:
    """Load argument ``arg``; ``match`` if it is one of ``values``, else ``other``."""
    n = len(values)
    rows: list[Row] = [(_LD, 0, 0, _arg(arg))]
    rows += [(_JEQ, n - i, 0, v & 0xFFFFFFFF) for i, v in enumerate(values)]
    return rows + [(_RET, 0, 0, other), (_RET, 0, 0, match)]


def _blocks(network: Network, lifted: frozenset) -> dict[str, list[Row]]:
    """The argument checks of the FILTERED calls (none for a lifted one)."""
    if network is True:
        sock = _one_of(0, _SOCKET_FAMILIES_ON, ALLOW, _EACCES)
    elif network == ON_WITHOUT_UNIX:
        sock = _one_of(0, _SOCKET_FAMILIES_ON_WITHOUT_UNIX, ALLOW, _EACCES)
    # TCP/UDP in its own namespace (to the relay), NETLINK_ROUTE.
    elif network == POLICY:
        sock = [(_LD, 0, 0, _arg(0)), (_JEQ, 4, 0, socket.AF_INET), (_JEQ, 3, 0, socket.AF_INET6),
                (_JEQ, 0, 3, socket.AF_NETLINK), (_LD, 0, 0, _arg(2)), (_JEQ, 0, 1, 0),
                (_RET, 0, 0, ALLOW), (_RET, 0, 0, _EACCES)]
    # False, POLICY_BY_PORT: NETLINK_ROUTE (0) only, see _SOCKET_FAMILIES_ON.
    else:
        sock = [(_LD, 0, 0, _arg(0)), (_JEQ, 0, 3, socket.AF_NETLINK), (_LD, 0, 0, _arg(2)),
                (_JEQ, 0, 1, 0), (_RET, 0, 0, ALLOW), (_RET, 0, 0, _EACCES)]
    out = {
        "socket": sock,
        "clone": [(_LD, 0, 0, _arg(0)), (_JSET, 0, 1, _NS_FLAGS), (_RET, 0, 0, EPERM),
                  (_RET, 0, 0, ALLOW)],
        "prctl": _one_of(0, tuple(S.PRCTL_OPTIONS.values()), ALLOW, EPERM),
        "personality": _one_of(0, S.PERSONALITIES, ALLOW, EPERM),
        "ioctl": _one_of(1, tuple(S.IOCTL_REQUESTS.values()), ALLOW, EPERM),
        "prlimit64": _args_are(0),
        # PRIO_PROCESS, who: the caller.
        "setpriority": _args_are(0, 0),
        "ioprio_set": _args_are(_IOPRIO_WHO_PROCESS, 0),
        **{name: _args_are(0) for name in _SCHED_SETTERS},
    }
    if network is not True:
        # SOCK_TYPE_MASK
        out["socketpair"] = [(_LD, 0, 0, _arg(1)), (_AND, 0, 0, 0xF),
                             (_JEQ, 1, 0, socket.SOCK_STREAM), (_JEQ, 0, 1, socket.SOCK_SEQPACKET),
                             (_RET, 0, 0, ALLOW), (_RET, 0, 0, _EACCES)]
    return {k: v for k, v in out.items() if k not in lifted}


def _answers(machine: str, network: Network, allowlist: bool, allow: tuple,
             dangerous: bool) -> tuple[dict, object, dict]:
    """{number: RET value or block name}, the answer for other numbers, the blocks."""
    allow = tuple(n for n in allow
                  if n not in S.FIXED and (dangerous or n not in S.DANGEROUS_NAMES))
    lifted = frozenset(n for n in allow if n in S.FILTERED)
    blocks = _blocks(network, lifted)
    default = EPERM if allowlist else ALLOW
    answers: dict = {}
    if allowlist:
        for name in S.allowed_on(machine, allow):
            answers[number(name, machine)] = name if name in blocks else ALLOW
        if "clone3" not in allow:
            answers[number("clone3", machine)] = _ENOSYS
    # The network-off denylist: sockets and io_uring.
    else:
        for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
            answers[number(name, machine)] = EPERM
        for name in ("socket", "socketpair"):
            if name in blocks:
                answers[number(name, machine)] = name
    if network == POLICY_BY_PORT:
        answers[number("listen", machine)] = EPERM
    used = set(answers.values())
    return answers, default, {k: v for k, v in blocks.items() if k in used}


def _search(runs: list[tuple[int, int]]) -> list[Row]:
    """A balanced tree of JGE over the starts of ``runs``, RETs as leaves.  A subtree
    too far to jump over goes through a JA."""
    if len(runs) == 1:
        return [(_RET, 0, 0, runs[0][1])]
    mid = len(runs) // 2
    left, right = _search(runs[:mid]), _search(runs[mid:])
    if len(left) <= 255:
        return [(_JGE, len(left), 0, runs[mid][0])] + left + right
    return [(_JGE, 0, 1, runs[mid][0]), (_JA, 0, 0, len(left))] + left + right


#: The filtered calls, most frequent first (ioctl: isatty() on each open() in text mode).
_CHAIN = ("ioctl", "clone", "prctl", "socket", "prlimit64", "socketpair", "personality",
          "sched_setaffinity", "setpriority", "sched_setscheduler", "sched_setparam",
          "sched_setattr", "ioprio_set")


@functools.lru_cache(maxsize=32)
def filter_program(machine: str, network: Network, allowlist: bool = True, allow: tuple = (),
                   dangerous: bool = False) -> tuple[Row, ...]:
    """The filter for ``machine``: (code, jt, jf, k) rows.  ``allowlist`` False gives
    only the socket and io_uring rules (a confined worker whose allowlist was switched
    off for a test, with the network off).

    Only the calls the kernel's cache cannot answer run it: the filtered ones (a chain
    of JEQ first, then their argument block) and the refused ones (the search)."""
    answers, default, blocks = _answers(machine, network, allowlist, allow, dangerous)
    filtered = [n for n in _CHAIN if n in blocks]
    # Never reach the search.
    skip = {number(n, machine) for n in filtered}
    runs: list[tuple[int, int]] = [(0, answers.get(0, default))]
    for nr in range(1, max(answers) + 2):
        a = runs[-1][1] if nr in skip else answers.get(nr, default)
        if a != runs[-1][1]:
            runs.append((nr, a))
    prog: list = [(_LD, 0, 0, _OFF_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[machine]),
                  (_RET, 0, 0, EPERM), (_LD, 0, 0, _OFF_NR)]
    if machine == "x86_64":
        prog += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, EPERM)]
    sizes = [len(blocks[n]) for n in filtered]
    # JEQ nr -> its block, placed after the chain.
    for i, name in enumerate(filtered):
        # Past the rest of the chain and the JA.
        to_block = len(filtered) - i + sum(sizes[:i])
        prog.append((_JEQ, to_block, 0, number(name, machine)))
    if filtered:
        prog.append((_JA, 0, 0, sum(sizes)))
    for name in filtered:
        prog += blocks[name]
    prog += _search(runs)
    assert all(0 <= r[1] <= 255 and 0 <= r[2] <= 255 for r in prog) and len(prog) < 4096
    return tuple(prog)


@functools.lru_cache(maxsize=32)
def _packed(machine: str, network: Network, allowlist: bool, allow: tuple,
            dangerous: bool) -> bytes:
    """filter_program() as struct sock_filter bytes (what seccomp(2) reads)."""
    rows = filter_program(machine, network, allowlist, allow, dangerous)
    return b"".join(struct.pack("<HBBI", *row) for row in rows)


def prebuild() -> None:
    """Build the usual programs now (the zygote, before it forks: shared by every worker)."""
    machine = os.uname().machine
    if machine in _AUDIT_ARCH:
        for network in (True, False, ON_WITHOUT_UNIX):
            _packed(machine, network, True, (), False)
        S.allowed_on(machine, ())


def _install(packed: bytes, machine: str) -> str:
    """Install the program ``packed`` on every thread of this process: "" or why not."""
    data = ctypes.create_string_buffer(packed, len(packed))
    return install_rows((_SockFilter * (len(packed) // 8)).from_buffer(data), machine)


def key_gate(machine: str, gated: list[int], never: list[int],
             key_args: tuple[int, int]) -> "ctypes.Array[_SockFilter]":
    """The key filter of handoff.py, its four key words left 0 (handoff.lock() copies
    them in from its ctypes buffer: no Python int ever holds one).

        arch != this machine's  EPERM;  nr in ``never``  EPERM
        nr in ``gated``: ALLOW when argument key_args[0] (low, high 32 bits) and
                         key_args[1] (low, high) are the key's four words, else EPERM
        anything else  ALLOW"""
    head: list[Row] = [(_LD, 0, 0, _OFF_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[machine]),
                       (_RET, 0, 0, EPERM), (_LD, 0, 0, _OFF_NR)]
    first = len(head)
    # Past the JEQs and RET ALLOW.
    check = first + len(never) + len(gated) + 1
    # 4 x (LD, JEQ), RET ALLOW.
    refuse = check + 9
    rows = list(head)
    for nr in never:
        rows.append((_JEQ, refuse - len(rows) - 1, 0, nr))
    for nr in gated:
        rows.append((_JEQ, check - len(rows) - 1, 0, nr))
    rows.append((_RET, 0, 0, ALLOW))
    for arg in key_args:
        for half in (0, 4):
            rows += [(_LD, 0, 0, _arg(arg) + half), (_JEQ, 0, refuse - len(rows) - 2, 0)]
    rows += [(_RET, 0, 0, ALLOW), (_RET, 0, 0, EPERM)]
    assert len(rows) == refuse + 1
    return (_SockFilter * len(rows))(*(_SockFilter(*r) for r in rows))


# (from the end of key_gate's rows) the JEQs of the key.
KEY_ROWS = (-9, -7, -5, -3)


def install_rows(prog_rows: "ctypes.Array[_SockFilter]", machine: str,
                 key: "Optional[ctypes.Array[ctypes.c_uint32]]" = None) -> str:
    """Install ``prog_rows`` on every thread of this process: "" or why not.  ``key``
    (key_gate()'s rows): its four words are copied into the key's JEQs first."""
    n = len(prog_rows)
    if key is not None:
        for word, row in enumerate(KEY_ROWS):
            ctypes.memmove(ctypes.addressof(prog_rows[n + row]) + 4,
                           ctypes.addressof(key) + 4 * word, 4)
    prog = _SockFprog(n, ctypes.cast(prog_rows, ctypes.POINTER(_SockFilter)))
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "unavailable (no_new_privs refused)"
    rc = _libc.syscall(ctypes.c_long(number_of("seccomp", machine)),
                       ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                       ctypes.c_long(_SECCOMP_FILTER_FLAG_TSYNC), ctypes.byref(prog))
    # Kernel < 3.17: this thread only.
    if rc < 0 and ctypes.get_errno() == errno.ENOSYS:
        rc = _prctl(PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(prog))
    if rc < 0:
        return f"unavailable (seccomp: {os.strerror(ctypes.get_errno())})"
    if rc > 0:
        return f"failed (thread {rc} could not take the filter)"
    return ""


def number_of(name: str, machine: str) -> int:
    """The number of system call ``name`` on ``machine`` (one this engine knows)."""
    nr = number(name, machine)
    assert nr is not None, name
    return nr



def _refused(name: str, machine: str, *args: int) -> bool:
    rc = _libc.syscall(ctypes.c_long(number_of(name, machine)), *map(ctypes.c_long, args))
    return rc < 0 and ctypes.get_errno() == errno.EPERM


def restrict_syscalls(network: Network, allow: tuple = (), dangerous: bool = False,
                      allowlist: bool = True) -> tuple[str, str]:
    """Install the filter; (what holds for system calls, what holds for unix sockets),
    as stats() shows them.  ``network``: True, ON_WITHOUT_UNIX (the host's network, no
    unix socket), False or POLICY (its own namespace, the host's proxy through the relay:
    TCP and UDP there, no unix socket).  ``allow``/``dangerous``: a library's "syscalls"
    setting (core/syscalls.py checked it).  ``allowlist`` False: only the socket rules
    of the network off or a policy (nothing at all with the network on)."""
    machine = os.uname().machine
    unix = "not blocked (network on)"
    on = network is True
    if machine not in _AUDIT_ARCH or sys.byteorder != "little":
        why = f"unavailable (no filter for the {machine} architecture)"
        return why, unix if on else why
    if not allowlist and network in (True, ON_WITHOUT_UNIX):
        return SWITCHED_OFF, unix
    allow = tuple(sorted(allow))
    failed = _install(_packed(machine, network, allowlist, allow, dangerous), machine)
    if failed:
        return failed, unix if on else failed
    state = SWITCHED_OFF
    # Trust, but check: unshare(0) is a no-op otherwise.
    if allowlist:
        if not _refused("unshare", machine, 0):
            state = "failed (the filter is installed but unshare(0) still works)"
        else:
            # (cached: the zygote's prebuild())
            n = len(S.allowed_on(machine, allow))
            extra = sorted(set(allow) - S.ALLOWED)
            lifted = sorted(set(allow) & set(S.FILTERED))
            state = (f"allowlist ({n} calls, {machine}"
                     + (f"; the library's: {', '.join(extra + lifted)}" if allow else "") + ")")
    if not on:
        unix = _unix_blocked(network)
    return state, unix


def _unix_blocked(network: Network) -> str:
    """What holds for unix sockets once the filter of ``network`` (not True) is in: its
    report, checked by trying the sockets it must refuse."""
    unix = {False: UNIX_BLOCKED, ON_WITHOUT_UNIX: UNIX_BLOCKED_ON,
            POLICY_BY_PORT: UNIX_BLOCKED_BY_PORT}.get(network, UNIX_BLOCKED_POLICY)
    refused = ((socket.AF_UNIX, "AF_UNIX"),) + (((socket.AF_INET, "AF_INET"),)
                                                if network in (False, POLICY_BY_PORT) else ())
    for family, name in refused:
        try:
            socket.socket(family, socket.SOCK_STREAM).close()
            unix = f"failed (the filter is installed but socket({name}) still works)"
        except PermissionError:
            pass
    return unix


# ------------------------------------------------------------ the host's guard (guard.py)
_SECCOMP_FILTER_FLAG_NEW_LISTENER, _SECCOMP_FILTER_FLAG_TSYNC_ESRCH = 8, 16


def rows_for(machine: str, blocks: dict[str, list[Row]]) -> list[Row]:
    """A filter answering each call of ``blocks`` (name: its rows) by its rows, refusing
    another architecture and x32, allowing everything else (guard.py: the other filters
    decide the rest)."""
    prog: list[Row] = [(_LD, 0, 0, _OFF_ARCH), (_JEQ, 1, 0, _AUDIT_ARCH[machine]),
                       (_RET, 0, 0, EPERM), (_LD, 0, 0, _OFF_NR)]
    if machine == "x86_64":
        prog += [(_JGE, 0, 1, _X32_BIT), (_RET, 0, 0, EPERM)]
    names = [n for n in blocks if number(n, machine) is not None]
    sizes = [len(blocks[n]) for n in names]
    for i, name in enumerate(names):
        prog.append((_JEQ, len(names) - i + sum(sizes[:i]), 0, number_of(name, machine)))
    prog.append((_JA, 0, 0, sum(sizes)))
    for name in names:
        prog += blocks[name]
    prog.append((_RET, 0, 0, ALLOW))
    assert all(0 <= r[1] <= 255 and 0 <= r[2] <= 255 for r in prog) and len(prog) < 4096
    return prog


def install_listener(rows: list[Row], machine: str) -> Union[int, str]:
    """Install ``rows`` on every thread of this process with a listener for its
    SECCOMP_RET_USER_NOTIF answers: the listener's descriptor, or why not.  Before Linux
    5.7 (no TSYNC with a listener) only a process of one thread may install it."""
    if machine not in _AUDIT_ARCH or sys.byteorder != "little":
        return f"unavailable (no filter for the {machine} architecture)"
    prog_rows = (_SockFilter * len(rows))(*(_SockFilter(*r) for r in rows))
    prog = _SockFprog(len(rows), ctypes.cast(prog_rows, ctypes.POINTER(_SockFilter)))
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) < 0:
        return "unavailable (no_new_privs refused)"
    nr = ctypes.c_long(number_of("seccomp", machine))
    flags = (_SECCOMP_FILTER_FLAG_NEW_LISTENER | _SECCOMP_FILTER_FLAG_TSYNC
             | _SECCOMP_FILTER_FLAG_TSYNC_ESRCH)
    rc = _libc.syscall(nr, ctypes.c_long(_SECCOMP_SET_MODE_FILTER), ctypes.c_long(flags),
                       ctypes.byref(prog))
    if rc < 0 and ctypes.get_errno() == errno.EINVAL and len(os.listdir("/proc/self/task")) == 1:
        rc = _libc.syscall(nr, ctypes.c_long(_SECCOMP_SET_MODE_FILTER),
                           ctypes.c_long(_SECCOMP_FILTER_FLAG_NEW_LISTENER), ctypes.byref(prog))
    if rc < 0:
        err = ctypes.get_errno()
        why = ("seccomp user notification needs Linux 5.0 (5.7 in a process of several "
               "threads)" if err == errno.EINVAL else os.strerror(err))
        return f"unavailable ({why})"
    return int(rc)
