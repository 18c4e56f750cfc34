"""One record of given uids for the whole machine (backends/local/confine/uid_record.py):
two engines (two supervisors, two host processes) never give one uid to two tenants, a
tenant's name does not choose its uid, and the record's folder is root's alone."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from lcp_sandbox import Supervisor
from lcp_sandbox.backends.local.confine import tenant_uids, uid_record
from lcp_sandbox.backends.local.confine.tenant_uids import TenantUids

RANGE = (1_840_000_000 + os.getpid() % 997 * 1000, 1000)
ENGINE = """\
import json, sys
from lcp_sandbox.backends.local.confine.tenant_uids import TenantUids
first, count, root, n = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
uids = TenantUids((first, count), root)
sys.stdin.readline()                                   # both start together
print(json.dumps({f"t{i}": uids.of(f"t{i}")[0] for i in range(n)}))
"""


@pytest.fixture
def record(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "uids"
    monkeypatch.setenv(uid_record.ENV_VAR, str(folder))
    return folder


def test_two_host_processes_never_give_one_uid_to_two_tenants(tmp_path, record):
    """Two engines with tenants' folders of their own and the same tenants' names, in two
    processes started together: 80 tenants each, 160 uids."""
    procs = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        procs.append(subprocess.Popen(
            [sys.executable, "-c", ENGINE, str(RANGE[0]), "400", str(tmp_path / name), "80"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    got = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    one, two = (set(g.values()) for g in got)
    assert len(one) == len(two) == 80 and not one & two, sorted(one & two)
    again = TenantUids((RANGE[0], 400), str(tmp_path / "two"))       # a restart of "two"
    assert {t: again.of(t)[0] for t in got[1]} == got[1]


def test_two_supervisors_of_one_process_give_uids_apart(tmp_path, record):
    for name in ("x", "y"):
        (tmp_path / name).mkdir()
    with Supervisor(tenants_root=str(tmp_path / "x"), uid_range=RANGE) as x, \
            Supervisor(tenants_root=str(tmp_path / "y"), uid_range=RANGE) as y:
        ux = {t: x.uids.of(t)[0] for t in ("alice", "bob")}
        uy = {t: y.uids.of(t)[0] for t in ("alice", "bob")}
        assert not set(ux.values()) & set(uy.values())
        assert x.pool_stats()["uid_record"] == f"machine-wide ({record})"


def test_a_tenant_s_name_does_not_choose_its_uid(tmp_path, record):
    """Uids are given in turn: a name that hashes to another tenant's uid gets the next
    free one; without a tenants' folder, one engine's uids are its process's."""
    uids = TenantUids(RANGE, str(tmp_path))
    assert [uids.of(t)[0] for t in ("zeta", "alpha", "mid")] == [RANGE[0] + i for i in range(3)]
    rootless = TenantUids(RANGE, None)
    assert rootless.of("zeta")[0] == RANGE[0] + 3
    line = json.loads((record / uid_record.RECORD).read_text().splitlines()[-1])
    assert line["engine"].split()[0] == str(os.getpid())


def test_an_engine_s_gone_uids_are_swept_before_they_serve_again(tmp_path, record):
    """An engine without a tenants' folder gives uids for its process's life: once that
    process is gone, they are as given back (swept when wanted)."""
    code = ("from lcp_sandbox.backends.local.confine.tenant_uids import TenantUids;"
            f"TenantUids(({RANGE[0]}, 1), None).of('t')")
    subprocess.run([sys.executable, "-c", code], check=True)
    uids = TenantUids((RANGE[0], 1), str(tmp_path))
    assert uids.of("next")[0] == RANGE[0]
    states = [json.loads(x) for x in (record / uid_record.RECORD).read_text().splitlines()]
    assert [s.get("clean") or s.get("tenant") for s in states] == ["t", True, "next"]


# ---------------------------------------------------------------- where the record is
def test_the_record_is_in_var_lib_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(uid_record.ENV_VAR, raising=False)
    assert uid_record.record_folder() == "/var/lib/lcp-sandbox/uids"
    monkeypatch.setenv(uid_record.ENV_VAR, "relative/uids")
    with pytest.raises(ValueError, match="LCP_SANDBOX_UIDS_DIR='relative/uids' must be an "
                                         "absolute path"):
        Supervisor(run_as="per-tenant")


@pytest.mark.skipif(os.geteuid() != 0, reason="a folder of another uid is made by root")
def test_a_record_folder_others_may_write_or_own_is_never_used(tmp_path, record):
    record.mkdir(mode=0o700)
    record.chmod(0o733)
    with pytest.raises(OSError, match="is not a folder of uid 0 with mode 0700"):
        TenantUids(RANGE, str(tmp_path)).of("a")
    record.chmod(0o700)
    os.chown(record, 4242, 4242)
    with pytest.raises(OSError, match="uid 4242, mode 0700"):
        TenantUids(RANGE, str(tmp_path)).of("a")


def test_where_no_machine_record_can_be_made_the_supervisor_keeps_its_own(tmp_path,
                                                                         monkeypatch, caplog):
    """(A read-only /var/lib, a host that is not root) the engine's own record in its
    tenants' folder, as before, with a warning and pool_stats() saying so."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv(uid_record.ENV_VAR, str(tmp_path / "a-file" / "uids"))
    (tmp_path / "tenants").mkdir()
    with Supervisor(tenants_root=str(tmp_path / "tenants"), uid_range=RANGE) as sup:
        uid = sup.uids.of("a")[0]
        where = sup.pool_stats()["uid_record"]
    assert where.startswith("this supervisor's only (") and "a-file" in where
    assert "another engine on this machine may give the same uids" in where
    assert "recorded for this supervisor only" in caplog.text
    own = tmp_path / "tenants" / uid_record.OWN_RECORD
    assert json.loads(own.read_text()) == {"uid": uid, "root": str(tmp_path / "tenants"),
                                           "tenant": "a"}
    assert stat.S_IMODE(own.stat().st_mode) == 0o600


def test_an_engine_s_own_record_from_before_is_taken_in_once(tmp_path, record, caplog):
    """The store an engine kept in its tenants' folder before: its tenants keep their uids
    in the machine's record; one whose uid the machine's record gives another gets a new
    one; its released uids are swept before they serve."""
    other = TenantUids(RANGE, str(tmp_path / "elsewhere"))
    taken = other.of("z")[0]                                   # RANGE[0]
    old = tmp_path / uid_record.OWN_RECORD
    old.write_text("".join(json.dumps(x) + "\n" for x in [
        {"tenant": "a", "uid": RANGE[0] + 7}, {"tenant": "b", "uid": taken},
        {"tenant": "c", "uid": RANGE[0] + 9}, {"tenant": "c", "uid": RANGE[0] + 9,
                                               "released": True}]))
    uids = TenantUids(RANGE, str(tmp_path))
    assert uids.tenants() == ["a"] and uids.of("a")[0] == RANGE[0] + 7
    assert uids.of("b")[0] not in (taken, RANGE[0] + 7)
    assert "is another's in the machine's record" in caplog.text
    assert uids.record.entries[RANGE[0] + 9].state == uid_record.RELEASED
    assert not old.exists() and (tmp_path / (uid_record.OWN_RECORD + ".moved")).exists()
    assert tenant_uids.TenantUids(RANGE, str(tmp_path)).tenants() == ["a", "b"]
