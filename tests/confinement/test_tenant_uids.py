"""run_as="per-tenant": a uid of its own per tenant, kept across supervisors, from one record
for the whole machine; the kernel's own file permissions then keep tenants apart even with
every other file protection off."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import FIXTURES

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import sweep, tenant_uids, uid_record
from lcp_sandbox.backends.local.confine.tenant_uids import TenantUids
from lcp_sandbox.core.outcomes import Unavailable
from lcp_sandbox.testing import protections_off

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="uids are given by a root host")
LIBS = FIXTURES / "priv_libs"
# A range of this test process's own: a suite run beside another (CI runs two) records its
# uids in a record of its own (conftest.py), so the two would otherwise share uids.
RANGE = (1_800_000_000 + os.getpid() % 997 * 1000, 1000)


@pytest.fixture(autouse=True)
def own_record(tmp_path, monkeypatch) -> Path:
    """Each test's own machine-wide record (LCP_SANDBOX_UIDS_DIR): its uids start free."""
    folder = tmp_path / "uids"
    monkeypatch.setenv(uid_record.ENV_VAR, str(folder))
    return folder


def record_lines(folder: Path) -> list:
    return [json.loads(line) for line in (folder / uid_record.RECORD).read_text().splitlines()]


def ids(binding) -> list:
    """The worker's [uid, gid] (its /proc/self/status)."""
    st = binding.execute_tool("tool_status")["output"]
    return [int(st["Uid"].split()[0]), int(st["Gid"].split()[0])]


def tenant(sup, root, name, **kw):
    ws = root / name
    ws.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=name, workspace=str(ws),
                            workspace_root=str(ws), **kw)


@needs_root
def test_each_tenant_gets_a_uid_of_its_own_and_keeps_it(open_tmp):
    with Supervisor(confine=True, run_as="per-tenant", uid_range=RANGE,
                    tenants_root=str(open_tmp)) as sup:
        a, b = tenant(sup, open_tmp, "a"), tenant(sup, open_tmp, "b")
        ua, ub = ids(a), ids(b)
    assert ua != ub and ua[0] == ua[1] and ub[0] == ub[1]
    assert all(RANGE[0] <= u[0] < RANGE[0] + RANGE[1] for u in (ua, ub))
    for name, uid in (("a", ua[0]), ("b", ub[0])):
        st = (open_tmp / name).stat()
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, 0o700)
    folder = Path(os.environ[uid_record.ENV_VAR])
    assert sorted(record_lines(folder), key=str) == sorted(
        [{"uid": ua[0], "root": str(open_tmp), "tenant": "a"},
         {"uid": ub[0], "root": str(open_tmp), "tenant": "b"}], key=str)
    for path, mode in ((folder, 0o700), (folder / uid_record.RECORD, 0o600)):
        assert path.stat().st_uid == 0 and stat.S_IMODE(path.stat().st_mode) == mode
    assert not (open_tmp / uid_record.OWN_RECORD).exists()
    with Supervisor(confine=True, run_as="per-tenant", uid_range=RANGE,
                    tenants_root=str(open_tmp)) as again:          # a restart: the same uid
        assert ids(tenant(again, open_tmp, "a")) == ua


@needs_root
def test_file_permissions_alone_keep_tenants_apart(open_tmp):
    """Landlock and the own root switched off (best effort): tenant a still cannot read
    tenant b's file, by the kernel's permission check alone; with one shared uid it could."""
    (open_tmp / "b").mkdir()
    (open_tmp / "b" / "secret.txt").write_text("b's secret")
    secret = str(open_tmp / "b" / "secret.txt")
    with Supervisor(confine="best-effort", run_as="per-tenant", uid_range=RANGE) as sup:
        with protections_off(sup, "landlock", "root"):
            b = tenant(sup, open_tmp, "b")
            assert b.execute_tool("tool_read", {"path": secret})["output"] == "b's secret"
            a = tenant(sup, open_tmp, "a")
            assert a.execute_tool("tool_read", {"path": secret})["output"] == "PermissionError"
    with Supervisor(confine="best-effort") as shared:                 # the same, one uid
        with protections_off(shared, "landlock", "root"):
            b = tenant(shared, open_tmp, "b")
            ids(b)                                                     # (b's root: nobody's)
            a = tenant(shared, open_tmp, "a2")
            assert a.execute_tool("tool_read", {"path": secret})["output"] == "b's secret"


def test_settings_are_checked():
    with pytest.raises(ValueError, match="uid_range"):
        Supervisor(run_as="per-tenant", uid_range=(0, 10))
    with pytest.raises(ValueError, match="run_as"):
        Supervisor(run_as="per-tenants")


def test_the_record_is_appended_to_and_a_torn_line_is_skipped(tmp_path, own_record):
    """One line per tenant, appended (a new tenant's first call waits for the write); a
    line a crash tore is skipped."""
    first = TenantUids(RANGE, str(tmp_path))
    a, b = first.of("a"), first.of("b")
    with open(own_record / uid_record.RECORD, "a") as f:
        f.write('{"uid": 1, "root": "/x", "ten')                     # torn
    again = TenantUids(RANGE, str(tmp_path))
    assert again.of("a") == a and again.of("b") == b
    c = again.of("c")
    assert c not in (a, b) and RANGE[0] <= c[0] < RANGE[0] + RANGE[1]
    assert TenantUids(RANGE, str(tmp_path)).tenants() == ["a", "b", "c"]
    lines = (own_record / uid_record.RECORD).read_text().splitlines()
    assert len(lines) == 4 and lines[2] == '{"uid": 1, "root": "/x", "ten'   # (skipped)


def test_a_host_that_is_not_root_refuses_a_uid_per_tenant(monkeypatch, tmp_path):
    """It cannot give one: every tenant would keep the host's uid. Refused (503), unless
    best effort; a fixed run_as is what it always was.  (Where the machine's record folder
    cannot be made, as for a host that is not root, the supervisor's own record serves.)"""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(uid_record.ENV_VAR, str(tmp_path / "a-file" / "uids"))
    uids = TenantUids(RANGE, None)
    monkeypatch.setattr(tenant_uids.os, "geteuid", lambda: 1000)
    with pytest.raises(Unavailable) as caught:
        uids.worker_ids("per-tenant", "a", True, "lib", "tool_x")
    assert caught.value.result["status_code"] == 503
    assert "needs a root host" in caught.value.result["error"] and "uid 1000" in caught.value.result["error"]
    assert uids.worker_ids("per-tenant", "a", "best-effort", "lib", "tool_x")[1] is True
    assert uids.where.startswith("this supervisor's only (")
    assert uids.worker_ids((5151, 5252), "a", True, "lib", "tool_x") == ((5151, 5252), False)


@needs_root
@pytest.mark.parametrize("run_as", ["per-tenant", (65534, 65534)])
def test_a_templated_worker_cannot_renice_another_tenants_worker(open_tmp, run_as):
    """A worker forked from a template has no PID namespace of its own (Landlock scopes its
    signals, not priorities or affinity): with a uid per tenant the kernel refuses both;
    with the uid they share, the system call filter (by pid, only the caller itself)."""
    import time
    libs = FIXTURES / "host_kind_libs"
    with Supervisor(confine=True, run_as=run_as, uid_range=RANGE,
                    tenants_root=str(open_tmp)) as sup:
        made = {}
        for name in ("a", "b"):
            ws = open_tmp / name
            ws.mkdir()
            made[name] = SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=name,
                                          workspace=str(ws), workspace_root=str(ws))
            made[name].execute_tool("tool_count")
        deadline = time.monotonic() + 60                   # their templates, made
        while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for name in ("a", "b"):                           # both now forked from templates
            made[name].restart_library("attacker")
        made["b"].execute_tool("tool_count")
        b_pid = sup.stats(tenant="b")[0]["pid"]
        got = made["a"].execute_tool("tool_attack", {"other_root": str(open_tmp / "b"),
                                                     "other_pid": b_pid, "host_pid": os.getpid()})
        assert [sup.stats(tenant=t)[0]["start"] for t in "ab"] == ["template"] * 2
        out = got["output"]
        assert out["renice_other"] == out["pin_other"] == out["signal_other"] == "PermissionError"
        assert out["read_secret"] in ("PermissionError", "FileNotFoundError")


def _templated(sup, bindings: dict, library: str, tool: str = "tool_ids") -> None:
    """Each tenant's worker started once, the templates that owes made, then restarted:
    forked from them."""
    import time
    for b in bindings.values():
        b.execute_tool(tool)
    deadline = time.monotonic() + 60
    while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
        assert time.monotonic() < deadline, sup.pool_stats()["templates"]
        time.sleep(0.02)
    for b in bindings.values():
        b.restart_library(library)


@needs_root
def test_one_template_serves_every_tenant_each_as_its_own_uid(open_tmp):
    """The default of a root host with a tenants_root: a uid per tenant, from one shared
    template.  The template keeps CAP_SETUID/CAP_SETGID permitted for its workers, and
    neither its import nor a tool can raise them into use or change uid (the key filter:
    worker/confine/handoff.py).  Without that filter the import's capset() would succeed."""
    libs = FIXTURES / "uid_libs"
    with Supervisor(confine=True, uid_range=RANGE, tenants_root=str(open_tmp)) as sup:
        assert sup.run_as == "per-tenant"
        made = {t: SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=t,
                                    workspace=str(open_tmp / t), workspace_root=str(open_tmp / t))
                for t in ("a", "b", "c")}
        for t in made:
            (open_tmp / t).mkdir()
        _templated(sup, made, "uidprobe")
        got = {t: b.execute_tool("tool_ids", {"other_uid": sup.uids.of("a")[0]})["output"]
               for t, b in made.items()}
        assert [sup.stats(tenant=t)[0]["start"] for t in made] == ["template"] * 3
        tpls = [t for t in sup.pool_stats()["templates"] if t["library"] == "uidprobe"]
        assert [(t["state"], t["workers"]) for t in tpls] == [("ok", 3)]        # one, shared
        uids = {t: sup.uids.of(t)[0] for t in made}
        assert len(set(uids.values())) == 3
        for t, out in got.items():
            u = uids[t]
            assert out["uid"] == out["gid"] == f"{u} {u} {u} {u}" and out["groups"] == ""
            assert out["caps"] == ["0000000000000000"] * 5, out
            # the import ran in the template, as nobody, with the right permitted and unusable
            assert out["at_import"] == {"uid": 65534, "capset": "Operation not permitted",
                                        "setresuid": "Operation not permitted"}, out
            assert out["now"]["capset"] == out["now"]["setresuid"] == "Operation not permitted"
            prot = sup.stats(tenant=t)[0]["protections"]["privileges"]
            assert prot.startswith(f"uid {u} gid {u}, no capabilities (its tenant's own"), prot


@needs_root
@pytest.mark.parametrize("start", ["fresh", "template"])
def test_a_tenant_s_processes_are_capped_and_another_tenant_forks_on(open_tmp, start):
    """With a uid per tenant, RLIMIT_NPROC of that uid caps all of one tenant's processes:
    tenant a's fork beyond the cap fails with EAGAIN inside its tool while tenant b, at the
    same time, forks all it asks for.  One uid shared by every tenant gets no such cap."""
    libs = FIXTURES / "nproc_libs"
    with Supervisor(confine=True, uid_range=RANGE, tenants_root=str(open_tmp),
                    max_processes_per_tenant=40) as sup:
        made = {t: SandboxedBinding(tools_folders=[libs], supervisor=sup, tenant=t,
                                    workspace=str(open_tmp / t), workspace_root=str(open_tmp / t))
                for t in ("a", "b")}
        for t in made:
            (open_tmp / t).mkdir()
        if start == "template":
            _templated(sup, made, "holder", "tool_ping")
        a = made["a"].execute_tool("tool_hold", {"count": 60})["output"]
        b = made["b"].execute_tool("tool_hold", {"count": 30})["output"]
        for t in made:
            assert made[t].execute_tool("tool_release")["output"] == "released"
        starts = [sup.stats(tenant=t)[0]["start"] for t in made]
        assert (starts == ["template"] * 2) == (start == "template"), starts
        prot = sup.stats(tenant="a")[0]["protections"]["tenant_processes"]
    assert a["held"] < 40 and a["error"] == "BlockingIOError 11", a
    assert b == {"held": 30, "error": None}
    assert prot.startswith("on (its tenant's uid: at most 40 processes"), prot
    with Supervisor(confine=True, run_as=(65534, 65534), tenants_root=str(open_tmp),
                    max_processes_per_tenant=40) as shared:
        a2 = SandboxedBinding(tools_folders=[libs], supervisor=shared, tenant="a",
                              workspace=str(open_tmp / "a"), workspace_root=str(open_tmp / "a"))
        assert a2.execute_tool("tool_hold", {"count": 60})["output"] == {"held": 60, "error": None}
        a2.execute_tool("tool_release")
        assert "tenant_processes" not in shared.stats(tenant="a")[0]["protections"]


# ---------------------------------------------------------------- given back
@needs_root
def test_a_uid_given_back_is_swept_then_given_again_and_the_record_says_so(tmp_path,
                                                                          own_record):
    """A range of 4: a fifth tenant gets none while four hold theirs, and gets the uid of one
    that gave it back, once it was swept clean; a restart reads the same (the fifth tenant
    keeps its uid, the released tenant has none)."""
    four = (RANGE[0], 4)
    uids = TenantUids(four, str(tmp_path))
    held = {t: uids.of(t)[0] for t in "abcd"}
    assert sorted(held.values()) == list(range(RANGE[0], RANGE[0] + 4))   # in turn, no hash
    with pytest.raises(OSError, match=r"no uid left in uid_range"):
        uids.of("e")
    assert uids.release("b") == held["b"] and uids.release("b") is None
    assert uids.of("e")[0] == held["b"]
    assert record_lines(own_record)[-3:] == [
        {"uid": held["b"], "released": True}, {"uid": held["b"], "clean": True},
        {"uid": held["b"], "root": str(tmp_path), "tenant": "e"}]
    again = TenantUids(four, str(tmp_path))
    assert again.tenants() == ["a", "c", "d", "e"] and again.of("e")[0] == held["b"]
    with pytest.raises(OSError, match=r"no uid left in uid_range"):
        again.of("b")                                   # b's uid is e's now: none left


@needs_root
def test_a_uid_is_not_given_again_while_a_file_of_it_remains_in_the_tenants_folder(
        tmp_path, monkeypatch):
    """Given back, the uid still owns a file under tenants_root (left in a folder any uid may
    enter: the host's to delete, not the sweep's): a new tenant does not get it.  A process
    started as it after it was given back is killed when the uid is next wanted."""
    import subprocess
    monkeypatch.setattr(tenant_uids, "HELD_RECHECK_S", 0.0)
    uids = TenantUids((RANGE[0] + 10, 1), str(tmp_path))
    uid = uids.of("a")[0]
    (tmp_path / "shared").mkdir(mode=0o777)
    left = tmp_path / "shared" / "left.txt"
    left.write_text("a's")
    os.chown(left, uid, uid)
    uids.release("a")
    with pytest.raises(OSError, match="1 given back still hold something"):
        uids.of("b")
    assert left.exists()
    left.unlink()
    sleeper = subprocess.Popen(["sleep", "60"], user=uid, group=uid)
    try:
        assert uids.of("b")[0] == uid                  # swept: the sleeper killed
        assert sleeper.wait(10) == -9
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_record_is_rewritten_once_most_of_it_says_nothing(tmp_path, monkeypatch,
                                                             own_record):
    """Tenants come and go: the record stays about as long as what it says (a line per
    uid), and a restart reads the same from it."""
    monkeypatch.setattr(tenant_uids.sweeping, "sweep", lambda uid, keep: sweep.Left())
    monkeypatch.setattr(tenant_uids, "_process_uids", set)
    uids = TenantUids((RANGE[0], 8), str(tmp_path))
    uids.of("kept")
    for i in range(3000):
        uids.of(f"t{i}")
        uids.release(f"t{i}")
    lines = record_lines(own_record)
    assert len(lines) < 4200, len(lines)
    again = TenantUids((RANGE[0], 8), str(tmp_path))
    assert again.tenants() == ["kept"] and again.of("kept") == uids.of("kept")
    assert again.record.entries == uids.record.entries


@needs_root
def test_removing_a_tenant_deletes_its_root_and_gives_its_uid_back(open_tmp):
    with Supervisor(confine=True, uid_range=(RANGE[0] + 20, 1), tenants_root=str(open_tmp)) as sup:
        a = tenant(sup, open_tmp, "a")
        ua = ids(a)
        (open_tmp / "a" / "notes.txt").write_text("a's")
        refused = tenant(sup, open_tmp, "b").execute_tool("tool_status")
        assert refused["status_code"] == 503 and "no uid left in uid_range" in refused["error"]
        a.close()
        with pytest.raises(ValueError, match="not a tenant's own folder"):
            sup.remove_tenant("a", str(open_tmp))           # tenants_root itself: refused
        assert sup.remove_tenant("a", str(open_tmp / "a")) == ua[0]
        assert not (open_tmp / "a").exists()
        b = tenant(sup, open_tmp, "b")
        assert ids(b) == ua                                 # the uid a gave back
        assert (open_tmp / "b").stat().st_uid == ua[0]


def test_a_sweep_holds_no_other_tenant_back_and_its_uid_goes_to_no_one_meanwhile(
        tmp_path, monkeypatch, own_record):
    """A uid given back is swept (a walk of the shared folders: long where they are full)
    under its own lock, not the record's: while a's sweep is held up, b gets a uid at once;
    c, of another engine on the same record, finds only a's uid left and waits for its
    sweep rather than taking it, then gets it swept clean; then none is left for d."""
    import threading
    started, go = threading.Event(), threading.Event()
    real = sweep.sweep

    def held_up(uid, keep):
        started.set()
        assert go.wait(60)
        return real(uid, keep)
    monkeypatch.setattr(tenant_uids.sweeping, "sweep", held_up)
    two = (RANGE[0] + 20, 2)
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    uids, other = TenantUids(two, str(tmp_path / "one")), TenantUids(two, str(tmp_path / "two"))
    a = uids.of("a")[0]
    got: dict = {}

    def ask(owner, tenant):
        try:
            got[tenant] = owner.of(tenant)[0]
        except OSError as exc:
            got[tenant] = exc
    releasing = threading.Thread(target=uids.release, args=("a",))
    releasing.start()
    try:
        assert started.wait(30)
        asking = threading.Thread(target=ask, args=(uids, "b"))
        asking.start()
        asking.join(10)
        assert not asking.is_alive(), "b waited for a's sweep"
        assert got["b"] != a and two[0] <= got["b"] < two[0] + two[1]
        waiting = threading.Thread(target=ask, args=(other, "c"))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and "c" not in got, got      # a's uid: not while swept
    finally:
        go.set()
        releasing.join(60)
    waiting.join(60)
    assert got["c"] == a                                       # swept clean, then given
    lines = [line for line in record_lines(own_record) if line["uid"] == a]
    assert lines[-3:] == [{"uid": a, "released": True}, {"uid": a, "clean": True},
                          {"uid": a, "root": str(tmp_path / "two"), "tenant": "c"}]
    with pytest.raises(OSError, match="no uid left"):
        uids.of("d")
