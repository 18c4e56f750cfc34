"""The host's guard of processes (backends/local/confine/pid_guard.py, worker/confine/guard.py), on
its own: a forked process installs the guard's filter and hands its listener to this test
process, which guards it as the host does; what the guarded process may still name.

The host kinds where the engine relies on it (one uid for all tenants, no PID namespace
nor Landlock scope) are attacked in tests/confinement/test_host_kinds.py.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Callable

import pytest

from lcp_sandbox.backends.local.confine import pid_guard
from lcp_sandbox.worker.confine import _processes
from lcp_sandbox.worker.confine import guard as worker_guard

if not sys.platform.startswith("linux") or os.uname().machine not in ("x86_64", "aarch64"):
    pytest.skip("seccomp user notification: Linux on x86_64 or aarch64", allow_module_level=True)

CLAIM = {"processes": pid_guard.REPORT_START + ": ...)"}


def _outcome(fn: Callable[[], object]) -> object:
    try:
        out = fn()
        return "ok" if out is None else out
    except OSError as exc:
        return type(exc).__name__


def guarded(actions: Callable[[], dict], hand: Callable[[socket.socket], None] = None):
    """Fork a process that installs the guard, hands its listener over (``hand``: how,
    default guard.hand_over) and runs ``actions``; (the Watch or why not, what it got)."""
    host_sock, its_sock = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            host_sock.close()
            os.close(r)
            why = worker_guard.install(os.uname().machine)
            assert not why, why
            (hand or worker_guard.hand_over)(its_sock)
            os.write(w, json.dumps(actions()).encode())
        finally:
            os._exit(0)
    its_sock.close()
    os.close(w)
    watch = pid_guard.receive(host_sock, time.monotonic() + 30, pid)
    with os.fdopen(r, "rb") as f:
        got = json.loads(f.read() or b"{}")
    os.waitpid(pid, 0)
    host_sock.close()
    return watch, got


@pytest.fixture
def stranger():
    """A process of this uid outside the guarded tree (as another tenant's worker is)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def _own_child(group: bool) -> str:
    pid = os.fork()
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    if group:
        os.setpgid(pid, pid)
        os.killpg(pid, signal.SIGKILL)
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return f"killed by {os.WTERMSIG(status)}"


def test_a_guarded_process_names_only_its_own_tree(stranger):
    """Signals, pidfds and SIGIO owners reach the guarded process's own children and itself;
    a process outside its tree, the host, kill(-1) and the host's group are refused."""
    host, host_pgid = os.getpid(), os.getpgid(0)

    def actions() -> dict:
        import fcntl
        rd, wr = os.pipe()
        return {
            "stranger": _outcome(lambda: os.kill(stranger, signal.SIGCONT)),
            "host": _outcome(lambda: os.kill(host, 0)),
            "everyone": _outcome(lambda: os.kill(-1, 0)),
            "host_group": _outcome(lambda: os.killpg(host_pgid, 0)),
            "pidfd_stranger": _outcome(lambda: os.close(os.pidfd_open(stranger))),
            "sigio_stranger": _outcome(lambda: fcntl.fcntl(rd, fcntl.F_SETOWN, stranger)),
            "priority_stranger": _outcome(lambda: os.getpriority(os.PRIO_PROCESS, stranger)),
            "own_child": _outcome(lambda: _own_child(group=False)),
            "own_child_group": _outcome(lambda: _own_child(group=True)),
            "itself": _outcome(lambda: os.kill(os.getpid(), 0)),
            "own_pidfd": _outcome(lambda: os.close(os.pidfd_open(os.getpid()))),
            "sigio_itself": _outcome(lambda: fcntl.fcntl(wr, fcntl.F_SETOWN, os.getpid())),
        }

    watch, got = guarded(actions)
    assert isinstance(watch, pid_guard.Watch) and watch.verified, watch
    for what in ("stranger", "host", "everyone", "host_group", "pidfd_stranger",
                 "sigio_stranger", "priority_stranger"):
        assert got[what] == "PermissionError", (what, got[what])
    assert got["own_child"] == got["own_child_group"] == "killed by 9", got
    assert got["itself"] == got["own_pidfd"] == "ok" and got["sigio_itself"] == 0, got
    pid_guard.release(watch)


def test_what_is_not_a_listener_is_not_vouched_for():
    """A worker that sends another descriptor as its listener: the host says so, and its
    report's claim becomes "unavailable" (503)."""
    def pipe_instead(sock: socket.socket) -> None:
        rd, _ = os.pipe()
        socket.send_fds(sock, [b"G"], [rd])

    watch, _ = guarded(lambda: {}, hand=pipe_instead)
    assert isinstance(watch, str) and "not a seccomp listener" in watch, watch
    processes = pid_guard.vouched(CLAIM, watch)["processes"]
    assert processes.startswith("unavailable (the host's guard"), processes


def test_a_listener_of_another_process_is_not_vouched_for():
    """The listener of a filter on a child of the worker, not on the worker: its first
    notification does not come from the worker's pid, so the host does not vouch for it."""
    def from_a_child(sock: socket.socket) -> None:
        child = os.fork()
        if child == 0:
            # (this child holds the filter the parent installed: a second one of its own)
            worker_guard.install(os.uname().machine)
            worker_guard.hand_over(sock)
            os._exit(0)
        os.waitpid(child, 0)

    watch, _ = guarded(lambda: {}, hand=from_a_child)
    assert isinstance(watch, pid_guard.Watch) and not watch.verified, watch
    assert pid_guard.vouched(CLAIM, watch)["processes"].startswith("unavailable")
    pid_guard.release(watch)


def test_a_worker_that_says_it_installed_none_is_refused():
    watch, _ = guarded(lambda: {}, hand=lambda sock: sock.sendall(b"N"))
    assert watch == "unavailable (the worker installed no guard)"
    assert pid_guard.vouched(CLAIM, watch)["processes"].startswith("unavailable")
    # (a host that offered no guard: a claim it cannot check is not believed either)
    assert pid_guard.vouched(CLAIM, None)["processes"].startswith("unavailable")


def test_a_reused_pid_is_not_in_the_tree(stranger):
    """The tree's root is known by its pid and start time: the same pid with another start
    time (a reused pid) is not the root; a process outside is not in the tree."""
    me, start = os.getpid(), pid_guard._stat(os.getpid())[2]
    assert pid_guard.in_tree(me, me, start)
    assert not pid_guard.in_tree(me, me, start + 1)
    assert not pid_guard.in_tree(os.getppid(), me, start)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pid_guard.in_tree(child.pid, me, start)
        # a sibling is not in the tree of the child
        assert not pid_guard.in_tree(stranger, child.pid, pid_guard._stat(child.pid)[2])
    finally:
        child.kill()
        child.wait()


def test_a_group_passes_only_when_all_of_it_is_in_the_tree():
    me, start = os.getpid(), pid_guard._stat(os.getpid())[2]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             start_new_session=True)
    try:
        assert pid_guard.group_in_tree(child.pid, me, start)
        # this test's own group holds its parent too (pytest's, outside the tree)
        assert not pid_guard.group_in_tree(os.getpgid(0), child.pid,
                                           pid_guard._stat(child.pid)[2])
    finally:
        child.kill()
        child.wait()


def test_a_guard_that_is_not_in_force_leaves_processes_unavailable():
    """Where the kernel refuses the guard's filter (before Linux 5.0), the worker's
    processes report says so: not "on", so the call is refused (503)."""
    why = "unavailable (seccomp user notification needs Linux 5.0 (5.7 in a process of " \
          "several threads))"
    got = _processes("", "on (ABI 5, no scope)", "", "blocked (seccomp: ...)", why)
    assert got.startswith("unavailable (in no PID namespace") and why in got, got


def test_workers_of_a_guarded_template_are_apart():
    """A template holds the guard (its listener); the workers forked from it inherit its
    filter.  Each worker the host knows (Member.join(), by the pid the zygote reports) is
    a tree of its own: it signals its own child, not its sibling nor the template."""
    host_sock, its_sock = socket.socketpair()
    pids_r, pids_w = os.pipe()
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    template = os.fork()
    if template == 0:
        try:
            host_sock.close()
            # (should this test fail, its end closes go_w: nothing here waits forever)
            for fd in (pids_r, go_w, out_r):
                os.close(fd)
            assert not worker_guard.install(os.uname().machine)
            worker_guard.hand_over(its_sock)
            sibling = os.fork()
            if sibling == 0:
                time.sleep(60)
                os._exit(0)
            worker = os.fork()
            if worker == 0:
                os.read(go_r, 1)
                got = {"sibling": _outcome(lambda: os.kill(sibling, 0)),
                       "template": _outcome(lambda: os.kill(os.getppid(), 0)),
                       "own_child": _outcome(lambda: _own_child(group=False))}
                os.write(out_w, json.dumps(got).encode())
                os._exit(0)
            os.write(pids_w, json.dumps([worker, sibling]).encode())
            os.waitpid(worker, 0)
            os.kill(sibling, signal.SIGKILL)
            os.waitpid(sibling, 0)
        finally:
            os._exit(0)
    its_sock.close()
    for fd in (pids_w, go_r, out_w):
        os.close(fd)
    watch = pid_guard.receive(host_sock, time.monotonic() + 30, template)
    assert isinstance(watch, pid_guard.Watch), watch
    # (the template waits for its worker: its listener is open; what the host starts later
    # does not inherit it)
    assert not os.get_inheritable(watch.fd)
    worker, sibling = json.loads(os.read(pids_r, 100))
    members = [pid_guard.Member(watch), pid_guard.Member(watch)]
    members[0].join(worker)
    members[1].join(sibling)
    os.write(go_w, b"g")
    with os.fdopen(out_r, "rb") as f:
        got = json.loads(f.read())
    os.waitpid(template, 0)
    for fd in (pids_r, go_w):
        os.close(fd)
    host_sock.close()
    assert got == {"sibling": "PermissionError", "template": "PermissionError",
                   "own_child": "killed by 9"}, got
    pid_guard.release(watch)
