"""A confined template keeps one temp dir made ahead for its next worker: what it gives,
to whom, and what it refuses to give (temp_dirs.MadeAhead)."""
from __future__ import annotations

import os
import stat
import time

import pytest
from conftest import FIXTURES
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
