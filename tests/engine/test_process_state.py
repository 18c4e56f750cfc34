"""A worker is a Python process like any other: its process state against a plain interpreter's.

A tool that writes to a pipe or socket whose reader is gone gets BrokenPipeError (SIGPIPE
ignored, as every interpreter has it), and its worker and module state live on, on every start
path: forked from the zygote or from a template, spawned, confined or not.  Then the whole
process state a tool can see (signal dispositions, the kernel's signal sets, the signal mask,
sys.flags, stdio, encodings, warning filters, exception hooks, resource limits, environment,
umask, how a child it starts sees SIGPIPE) is compared with that of ``python -c`` started here
with the same interpreter; every difference must be one of EXPECTED, each with its reason
(docs/security.md, "A worker's process state").

Workers are identified by the pids the host sees (stats()).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Union

import pytest
from conftest import FIXTURES
from support.confined_kinds import Confined

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.core.policy import allowed_environment

LIBS = FIXTURES / "state_libs"
PROBE = LIBS / "state" / "state.py"


@dataclass(frozen=True)
class Case:
    """How the worker under test starts: ``path`` "zygote" or "spawn", ``start`` what its
    stats()["start"] says (a prefix), ``confined``, ``tenant_uid`` (a uid of its tenant's own)."""
    path: str
    start: str
    confined: bool
    tenant_uid: bool = False

    @property
    def spawn(self) -> bool:
        return self.path == "spawn"


CASES = {
    "fork-fresh": Case("zygote", "fresh (first worker", False),
    "fork-template": Case("zygote", "template", False),
    "fork-confined-fresh": Case("zygote", "fresh (confined", True),
    "fork-confined-template": Case("zygote", "template", True, tenant_uid=True),
    "spawn": Case("spawn", "spawn", False),
    "spawn-confined": Case("spawn", "spawn", True),
}


class Started:
    """One worker of the state library, started as ``case`` says (its own supervisor)."""

    def __init__(self, case: Case, tmp: Path) -> None:
        self.case, self.confined = case, None
        if case.confined:
            self.confined = Confined("template" if case.start == "template" else "fresh",
                                     tmp / "tenants", start_method=case.path)
            self.sup = self.confined.sup
            self.binding = self.confined.binding(LIBS, "t")
        else:
            self.sup = Supervisor(start_method=case.path)
            if case.start == "template":
                self._warm(tmp)
            self.binding = SandboxedBinding(tools_folders=[str(LIBS)], supervisor=self.sup,
                                            tenant="t", workspace=str(tmp))
        self.binding.execute_tool("tool_snapshot", {})
        assert self.row()["start"].startswith(case.start), self.row()

    def _warm(self, tmp: Path) -> None:
        """Two tenants' first calls: the first makes the library's template, the second
        waits for it; the tenant under test is then forked from it."""
        for t in ("warm1", "warm2"):
            b = SandboxedBinding(tools_folders=[str(LIBS)], supervisor=self.sup, tenant=t,
                                 workspace=str(tmp))
            assert b.execute_tool("tool_snapshot", {})["status_code"] == 200
            b.close()

    def row(self) -> dict:
        return next(s for s in self.sup.stats("t") if s["library"] == "state")

    def call(self, tool: str) -> dict:
        r = self.binding.execute_tool(tool, {})
        assert r["status_code"] == 200, r
        return r["output"]

    def close(self) -> None:
        if self.confined is not None:
            self.confined.close()
        else:
            self.binding.close()
            self.sup.close()


@pytest.fixture(scope="module", params=list(CASES))
def worker(request, open_tmp_module):
    tmp = open_tmp_module / request.param
    tmp.mkdir(mode=0o777)
    tmp.chmod(0o777)
    started = Started(CASES[request.param], tmp)
    yield started
    started.close()


# ------------------------------------------------------------------ writes without a reader
@pytest.mark.parametrize("tool", ["tool_write_to_a_pipe_without_reader",
                                  "tool_send_to_a_closed_peer"])
def test_a_write_whose_reader_is_gone_raises_broken_pipe_in_the_tool(worker, tool):
    pid = worker.row()["pid"]
    first = worker.call(tool)
    assert first["raised"] == "BrokenPipeError", first
    # The same worker (the host's word), its module state kept.
    assert worker.row()["pid"] == pid
    again = worker.call(tool)
    assert again == {"raised": "BrokenPipeError", "calls": first["calls"] + 1}
    assert worker.row()["pid"] == pid and worker.row()["restarts"] == 0


# ------------------------------------------------------------------ against a plain interpreter
Match = Union[str, Callable[[str], bool]]


@dataclass(frozen=True)
class Expected:
    """A difference from a plain interpreter that a worker has on purpose: in ``section``,
    at ``key`` (a name, or a test of names), the worker's value is ``worker`` (a value, or a
    test of values) in the cases ``when`` accepts, for ``reason``."""
    section: str
    key: Match
    worker: Any
    when: Callable[[Case], bool]
    reason: str

    def covers(self, case: Case, section: str, key: str, value: Any) -> bool:
        named = self.key(key) if callable(self.key) else self.key == key
        held = self.worker(value) if callable(self.worker) else self.worker == value
        return self.section == section and named and held and self.when(case)


def always(case: Case) -> bool:
    return True


def _allowlisted(name: str) -> bool:
    return bool(allowed_environment({name: ""}))


#: Every way a worker's process state may differ from ``python -c``'s, and why.  A difference
#: not listed here fails the test (SIGPIPE back at its default, a limit nobody set...).
EXPECTED = (
    Expected("signals", "SIGUSR1", "a handler", always,
             "the host's soft timeout: SIGUSR1 raises ToolTimeout in the tool, so a call past "
             "its timeout is interrupted with its worker's state kept"),
    Expected("/proc/self/status SigCgt", "SIGUSR1", True, always,
             "the same handler, as the kernel sees it"),
    Expected("signals", "SIGINT", "a handler", lambda c: c.spawn,
             "the spawn path's soft timeout: the host writes the call's number on the control "
             "pipe and the control thread interrupts the main thread with interrupt_main(SIGINT) "
             "(no signal crosses processes on macOS and Windows)"),
    Expected("/proc/self/status SigCgt", "SIG33", True, lambda c: c.spawn,
             "glibc's own handler (set*id across threads), which it installs when a process "
             "starts its first thread: the spawn path's control thread"),
    *(Expected("sys.flags", flag, value, always,
               "workers' interpreters start as `python -I`: no CWD, PYTHONPATH or user "
               "site-packages on sys.path, so no file a tool can write becomes code the "
               "zygote or the next spawned worker runs")
      for flag, value in (("isolated", 1), ("ignore_environment", 1), ("no_user_site", 1),
                          ("safe_path", True))),
    Expected("sys.flags", "dont_write_bytecode", 0, always,
             "-I ignores the host's PYTHON* variables (here PYTHONDONTWRITEBYTECODE)"),
    *(Expected("stdio", f"{stream}.write_through", False, always,
               "-I ignores the host's PYTHON* variables (here PYTHONUNBUFFERED)")
      for stream in ("stdin", "stdout", "stderr")),
    *(Expected("stdio", f"{stream}.line_buffering", True, always,
               "a tool's output goes to the host's log a line at a time: a worker killed "
               "(timeout, memory, crash) loses no line it printed")
      for stream in ("stdout", "stderr")),
    Expected("rlimits", "RLIMIT_CORE", [0, 0], always,
             "no core dump of a worker (its memory holds its tenant's data); the hard limit "
             "comes down too, so a tool cannot raise it again"),
    Expected("rlimits", "RLIMIT_FSIZE", [4096 << 20, 4096 << 20], always,
             "max_file_size_mb (4096 by default), hard limit included"),
    *(Expected("rlimits", name, [1024, 1024], always,
               "max_open_files (1024 by default), hard limit included")
      for name in ("RLIMIT_NOFILE", "RLIMIT_OFILE")),
    Expected("rlimits", "RLIMIT_NPROC", [1024, 1024], lambda c: c.tenant_uid,
             "max_processes_per_tenant: all processes and threads of a tenant's uid"),
    Expected("umask", "umask", "0o77", lambda c: c.tenant_uid,
             "a worker holding its tenant's uid makes its files private to that uid (0600): "
             "without Landlock, file permissions are what keeps other tenants out"),
    Expected("environment", lambda name: not _allowlisted(name), False, lambda c: c.confined,
             "a confined worker gets the allowlisted variables only: no secret of the host's "
             "environment reaches a tool"),
    Expected("environment", "TMPDIR", True, lambda c: c.confined,
             "a confined worker's private temp dir, made by the host and removed with it"),
)


def flat(snapshot: dict) -> dict:
    """(section, key) -> value: sets as one key per member (True where present)."""
    out: dict = {}
    for section, value in snapshot.items():
        if section == "/proc/self/status":
            for field, members in value.items():
                out.update(_members(f"{section} {field}", members))
        elif section == "pthread_sigmask":
            out.update(_members(section, value))
        elif section == "environment":
            out.update({(section, name): True for name in value})
        elif section == "stdio":
            out.update({(section, f"{stream}.{field}"): v
                        for stream, fields in value.items() for field, v in fields.items()})
        elif isinstance(value, dict):
            out.update({(section, key): v for key, v in value.items()})
        else:
            out[(section, section)] = value
    return out


def _members(section: str, members: list) -> dict:
    """A set of signals, as one key per signal (1-64)."""
    names = [_signal_name(n) for n in range(1, 65)]
    return {(section, name): name in members for name in names}


def _signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"SIG{n}"


@pytest.fixture(scope="module")
def plain() -> dict:
    """The same probe in ``python -c`` with this interpreter, as the host would start it: the
    host's environment, stdin from /dev/null, stdout and stderr a pipe."""
    code = ("import json, runpy, sys; "
            "print(json.dumps(runpy.run_path(sys.argv[1])['snapshot']()))")
    # os.environ: what the host hands its workers (the C library's copy may hold more: a
    # terminal library sets COLUMNS and LINES there).
    out = subprocess.run([sys.executable, "-c", code, str(PROBE)], stdin=subprocess.DEVNULL,
                         env=dict(os.environ), capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return json.loads(out)


def differences(case: Case, worker: dict, plain: dict) -> list:
    """What differs and no row of EXPECTED explains: (section, key, the worker's, plain's)."""
    mine, theirs = flat(worker), flat(plain)
    left = []
    for section, key in sorted(mine.keys() | theirs.keys()):
        value = mine.get((section, key), False if section == "environment" else None)
        other = theirs.get((section, key), False if section == "environment" else None)
        if value == other:
            continue
        if not any(e.covers(case, section, key, value) for e in EXPECTED):
            left.append((section, key, value, other))
    return left


def test_a_worker_differs_from_a_plain_interpreter_only_as_confinement_needs(worker, plain):
    state = worker.call("tool_snapshot")
    unexplained = differences(worker.case, state, plain)
    assert not unexplained, "\n".join(map(repr, unexplained))
    # What the comparison stands on, seen directly.
    assert state["signals"]["SIGPIPE"] == plain["signals"]["SIGPIPE"] == "SIG_IGN"
    assert "SIGPIPE" in state["/proc/self/status"]["SigIgn"]
    assert state["a child's SIGPIPE"] == plain["a child's SIGPIPE"] == "killed by SIGPIPE"
    assert state["stdio"]["stdin"]["fd is"] == "/dev/null"
    if worker.case.confined:
        expected = set(allowed_environment(dict(os.environ))) | {"TMPDIR"}
        assert set(state["environment"]) == expected


def test_the_comparison_sees_a_signal_set_back_to_its_default(plain):
    """The table catches what it is for: SIGPIPE at its default in a worker, or a difference
    no row names, is reported; a listed one only where its row applies."""
    case = CASES["fork-fresh"]
    bad = json.loads(json.dumps(plain))
    bad["signals"]["SIGPIPE"] = "SIG_DFL"
    bad["/proc/self/status"]["SigIgn"].remove("SIGPIPE")
    assert differences(case, bad, plain) == [
        ("/proc/self/status SigIgn", "SIGPIPE", False, True),
        ("signals", "SIGPIPE", "SIG_DFL", "SIG_IGN")]
    spawn_only = json.loads(json.dumps(plain))
    spawn_only["signals"]["SIGINT"] = "a handler"
    assert differences(case, spawn_only, plain) == [
        ("signals", "SIGINT", "a handler", "default_int_handler")]
    assert differences(CASES["spawn"], spawn_only, plain) == []
