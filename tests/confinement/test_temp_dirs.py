"""A confined template keeps one temp dir made ahead for its next worker: what it gives,
to whom, and what it refuses to give (temp_dirs.MadeAhead)."""
from __future__ import annotations

import os
import stat
import time

import pytest
from conftest import FIXTURES, fork_only
from support.confined_kinds import Confined

from lcp_sandbox.backends.local.confine.temp_dirs import MadeAhead

LIBS = FIXTURES / "priv_libs"
ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(not ROOT, reason="the host is not root: no uid to give a folder to")
WORKER = (4242, 4242)


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def owner_mode(path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, stat.S_IMODE(st.st_mode)


def test_one_made_ahead_is_the_hosts_until_taken_then_the_workers(open_tmp):
    ahead = MadeAhead(str(open_tmp))
    assert ahead.path is None
    ahead.make()
    ahead.make()                                              # one at a time
    made = ahead.path
    assert os.listdir(open_tmp) == [os.path.basename(made)]
    assert owner_mode(made) == (os.geteuid(), 0o700)
    before = fds()
    assert ahead.take(WORKER) == made and ahead.path is None
    assert fds() == before - 1                                # its descriptor is closed
    assert owner_mode(made) == ((WORKER[0] if ROOT else os.geteuid()), 0o700)
    again = ahead.take(WORKER)                                # none made: made now, as before
    assert again != made and os.path.dirname(again) == str(open_tmp)
    assert owner_mode(again)[0] == (WORKER[0] if ROOT else os.geteuid())


@needs_root
@pytest.mark.parametrize("swap", ["link", "folder"])
def test_one_swapped_while_it_waited_is_not_given(open_tmp, swap):
    """The folder it waits in may be the workers' own (they share a uid): one of them can
    swap it for a link to any file, or for another folder.  The host gives neither."""
    ahead = MadeAhead(str(open_tmp))
    ahead.make()
    made = ahead.path
    victim = open_tmp / "victim"
    victim.mkdir(mode=0o755)
    os.rename(made, open_tmp / "moved")
    if swap == "link":
        os.symlink(victim, made)
    else:
        os.mkdir(made, 0o700)                                 # the host's uid, but not the one it made
    with pytest.raises(PermissionError, match="was replaced"):
        ahead.take(WORKER)
    assert owner_mode(victim) == (0, 0o755)
    assert os.lstat(made).st_uid == 0 and os.lstat(open_tmp / "moved").st_uid == 0


def test_after_close_nothing_is_held_or_made(open_tmp):
    before = fds()
    ahead = MadeAhead(str(open_tmp))
    ahead.make()
    ahead.close()
    assert fds() == before and ahead.path is None
    ahead.make()
    assert ahead.path is None and len(os.listdir(open_tmp)) == 1
    gone = MadeAhead(str(open_tmp / "removed"))               # its template's folder is gone
    gone.make()
    assert gone.path is None and fds() == before


def test_a_worker_from_a_confined_template_gets_the_one_made_ahead(open_tmp):
    kind = Confined("template", open_tmp / "tenants")
    try:
        b = kind.binding(LIBS, "t1")
        want = _made_ahead(kind.sup)
        r = b.execute_tool("tool_write", {"name": "f.txt", "text": "x"})
        assert r["success"], r
        assert os.path.dirname(r["output"]["tmp"]) == want
        assert r["output"]["tmp_owner"] == os.stat(want).st_uid       # given to the worker's uid
        assert b.stats()[0]["start"] == "template"
        after = _made_ahead(kind.sup, other_than=want)            # the next, made once it answered
        assert owner_mode(after) == (os.geteuid(), 0o700)
    finally:
        kind.close()


def test_a_start_refused_for_a_swapped_temp_dir_gives_its_template_back(open_tmp):
    """A worker of the tenants' uid swaps the temp dir made ahead for a link: the next
    tenant's first call is refused (503, saying why), and the template it had claimed for
    that worker counts no worker of it: it can still be retired when idle."""
    kind = Confined("template", open_tmp / "tenants")
    try:
        b = kind.binding(LIBS, "t1")
        made = _made_ahead(kind.sup)
        before = _workers(kind.sup)
        os.rename(made, made + "-moved")
        os.symlink(open_tmp, made)
        r = b.execute_tool("tool_write", {"name": "f.txt", "text": "x"})
        assert r["status_code"] == 503 and "was replaced" in r["error"], r
        assert "tool_write" in r["error"] and "could not start a worker" in r["error"], r
        assert _workers(kind.sup) == before
        assert owner_mode(open_tmp)[0] == 0                       # nothing given through the link
    finally:
        kind.close()


def _workers(sup) -> list:
    return sorted(t["workers"] for t in sup.pool_stats()["templates"] if t["confined"])


def _made_ahead(sup, other_than: str = "") -> str:
    """The temp dir made ahead by ``sup``'s one confined template, once one (other than
    ``other_than``) is made: after a call is answered, asynchronously."""
    deadline = time.monotonic() + 30
    while True:
        made = [t.ahead.path for t in sup.templates._by_key.values() if t.ahead is not None]
        if made and made[0] and made[0] != other_than:
            return made[0]
        assert time.monotonic() < deadline, "no temp dir made ahead within 30 s"
        time.sleep(0.005)


# ---------------------------------------------------------------- none left behind
LEFTOVER_LIBS = FIXTURES / "leftover_libs"


def _mine(uids: set) -> set:
    """The workers' temp dirs (and their templates' folders) in the system's temp dir
    that are of ``uids``."""
    import glob
    import tempfile
    found = set()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), "lcp-sandbox-*")):
        inside = glob.glob(os.path.join(path, "lcp-sandbox-*"))
        for each in (path, *inside):
            try:
                if os.lstat(each).st_uid in uids:
                    found.add(each)
            except OSError:
                pass
    return found


@needs_root
def test_a_worker_that_writes_as_it_ends_leaves_no_temp_dir(open_tmp):
    """Its temp dir is removed once it is gone, not while it still writes there (it
    would then stay behind, with what was written after the removal began)."""
    from lcp_sandbox import SandboxedBinding, Supervisor
    with Supervisor(confine=True, uid_range=(1_850_000_000 + os.getpid() % 997 * 100, 100),
                    tenants_root=str(open_tmp)) as sup:
        (open_tmp / "a").mkdir()
        a = SandboxedBinding(tools_folders=[LEFTOVER_LIBS], supervisor=sup, tenant="a",
                             workspace=str(open_tmp / "a"), workspace_root=str(open_tmp / "a"))
        tmp = a.execute_tool("tool_temp_dir")["output"]
        assert os.path.isdir(tmp)
        a.close()                                   # its worker asked to stop: it writes on
        assert not os.path.lexists(tmp)


@needs_root
@fork_only("confined templates")
def test_no_temp_dir_is_left_after_close_with_per_tenant_templates(open_tmp):
    """Confined workers of a uid per tenant, forked from templates, one of them
    SIGKILLed, one tenant's first worker starting while the supervisor closes: once it
    is closed, nothing of theirs is left in the system's temp dir."""
    import signal
    import threading

    from lcp_sandbox import SandboxedBinding, Supervisor
    libs = FIXTURES / "uid_libs"
    sup = Supervisor(confine=True, uid_range=(1_850_100_000 + os.getpid() % 997 * 100, 100),
                     tenants_root=str(open_tmp))

    def tenant(name: str) -> SandboxedBinding:
        (open_tmp / name).mkdir()
        return SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=name,
                                workspace=str(open_tmp / name),
                                workspace_root=str(open_tmp / name))
    try:
        made = {t: tenant(t) for t in "abc"}
        for b in made.values():
            assert b.execute_tool("tool_ids")["status_code"] == 200
        deadline = time.monotonic() + 60
        while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for b in made.values():
            b.restart_library("uidprobe")
            assert b.execute_tool("tool_ids")["status_code"] == 200
        from lcp_sandbox.worker.confine.landlock import landlock_abi
        if landlock_abi():                          # (without Landlock: fresh, refused)
            assert {sup.stats(tenant=t)[0]["start"] for t in made} == {"template"}
        uids = {sup.uids.of(t)[0] for t in made} | {sup.uids.of("late")[0]}
        parents = {t.tmp_parent for t in sup.templates._by_key.values() if t.tmp_parent}
        os.kill(sup.stats(tenant="a")[0]["pid"], signal.SIGKILL)
        assert made["a"].execute_tool("tool_ids")["status_code"] in (200, 500)
        assert _mine(uids) and all(os.path.isdir(p) for p in parents)
        late = tenant("late")
        racing = threading.Thread(target=late.execute_tool, args=("tool_ids",))
        racing.start()
    finally:
        sup.close()
    racing.join(60)
    assert _mine(uids) == set()
    assert not any(os.path.lexists(p) for p in parents)
