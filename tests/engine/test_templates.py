"""Library templates: a library is imported once, its workers fork from the template.

Libraries under tests/fixtures/template_libs/.  No timing assertions: what is checked is who
imported, what each worker holds, and what the host reports.
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import FIXTURES

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.system.proc import memory

LIBS = FIXTURES / "template_libs"
HOSTILE = FIXTURES / "hostile_libs"


@pytest.fixture
def counter(tmp_path, monkeypatch):
    path = tmp_path / "imports"
    monkeypatch.setenv("TPL_COUNTER", str(path))
    return path


def imports(path: Path) -> int:
    return len(path.read_text()) if path.exists() else 0


def binding(sup, tenant, folder=LIBS, **kw):
    return SandboxedBinding(tools_folders=[str(folder)], supervisor=sup, tenant=tenant, **kw)


def start_of(sup, tenant, library):
    return next(s["start"] for s in sup.stats(tenant) if s["library"] == library)


def warm(sup, folder, tool, tmp_path, **kw):
    """Two tenants' first calls: the first makes the template, the second waits for it."""
    for t in ("warm1", "warm2"):
        assert binding(sup, t, folder, workspace=str(tmp_path), **kw).execute_tool(tool, {})["status_code"] == 200


def templates(sup, library):
    return [t for t in sup.pool_stats()["templates"] if t["library"] == library]


def test_later_tenants_do_not_import_again(counter, tmp_path):
    with Supervisor() as sup:
        outs = []
        for t in ("a", "b", "c", "d"):
            b = binding(sup, t, workspace=str(tmp_path), host_tool_configs={"tpl_counter": {"who": t}})
            r = b.execute_tool("tool_touch", {"x": 1})
            assert r["status_code"] == 200, r
            outs.append(r["output"])
        # The first worker imports from the zygote's spare; the second makes the template.
        assert start_of(sup, "a", "tpl_counter") == "fresh (first worker of the library: no template yet)"
        assert [start_of(sup, t, "tpl_counter") for t in "bcd"] == ["template"] * 3
        assert imports(counter) == 2                      # the first worker's and the template's
        assert len({o["pid"] for o in outs}) == 4
        for t, o in zip("abcd", outs):
            assert o["config"] == t and o["inits"] == 1  # init_tools_library per worker, its own config
            assert o["name"] == "lollms_client.tools_bindings.lcp.persistent_tpl_counter"
            assert o["same_module"] is True
        tpl = templates(sup, "tpl_counter")
        assert len(tpl) == 1 and tpl[0]["state"] == "ok" and tpl[0]["workers"] == 3


def test_state_is_per_tenant_and_random_is_reseeded(counter, tmp_path):
    with Supervisor() as sup:
        warm(sup, LIBS, "tool_touch", tmp_path)
        a, b = binding(sup, "a", workspace=str(tmp_path)), binding(sup, "b", workspace=str(tmp_path))
        a.execute_tool("tool_touch", {"x": 1})
        ra = a.execute_tool("tool_touch", {"x": 2})["output"]
        rb = b.execute_tool("tool_touch", {"x": 3})["output"]
        assert ra["calls"] == [1, 2] and rb["calls"] == [3]
        assert ra["random"] != rb["random"]
        assert start_of(sup, "b", "tpl_counter") == "template"


def test_numpy_library_shares_its_import_and_reseeds_numpy(tmp_path):

    with Supervisor() as sup:
        warm(sup, LIBS, "tool_matmul", tmp_path)
        outs = [binding(sup, t, workspace=str(tmp_path)).execute_tool("tool_matmul", {})["output"]
                for t in ("a", "b")]
        assert [o["sum"] for o in outs] == [512.0, 512.0]
        assert outs[0]["draw"] != outs[1]["draw"]
        assert start_of(sup, "a", "tpl_numpy") == start_of(sup, "b", "tpl_numpy") == "template"
        for s in sup.stats():
            assert 0 < s["uss"] < s["rss"]                # charged for its own pages, not numpy's


def test_pipe_opened_at_import_cannot_connect_tenants(tmp_path):
    with Supervisor() as sup:
        a, b = binding(sup, "a", workspace=str(tmp_path)), binding(sup, "b", workspace=str(tmp_path))
        assert a.execute_tool("tool_send", {"data": "secret"})["output"] == "sent"
        assert b.execute_tool("tool_receive", {})["output"] == "<nothing>"
        assert a.execute_tool("tool_receive", {})["output"] == "secret"
        start = start_of(sup, "b", "tpl_pipe")
        assert start.startswith("fresh (refused: ") and "descriptor" in start


def test_thread_started_at_import_falls_back_to_a_fresh_import(tmp_path):
    with Supervisor() as sup:
        warm(sup, LIBS, "tool_threads", tmp_path)
        r = binding(sup, "a", workspace=str(tmp_path)).execute_tool("tool_threads", {})
        assert r["status_code"] == 200 and r["output"] == 2
        assert start_of(sup, "a", "tpl_thread") == "fresh (refused: started a thread at import)"


def test_template_can_be_turned_off(counter, tmp_path):
    cfg = {"tpl_counter": {"sandbox": {"template": False}}}
    with Supervisor() as sup:
        for t in ("a", "b"):
            binding(sup, t, workspace=str(tmp_path), host_tool_configs=cfg).execute_tool("tool_touch", {})
            assert start_of(sup, t, "tpl_counter") == "fresh (templates off for this library)"
        assert imports(counter) == 2 and templates(sup, "tpl_counter") == []


def test_confined_workers_import_fresh(counter, tmp_path):
    with Supervisor(confine=True) as sup:
        root = tmp_path / "root"
        root.mkdir()
        b = binding(sup, "a", workspace_root=str(root), workspace=str(root))
        assert b.execute_tool("tool_touch", {})["status_code"] == 200
        assert start_of(sup, "a", "tpl_counter").startswith("fresh (confined")


def test_dead_template_is_replaced(counter, tmp_path):
    with Supervisor() as sup:
        warm(sup, LIBS, "tool_touch", tmp_path)
        old = templates(sup, "tpl_counter")[0]["pid"]
        os.kill(old, signal.SIGKILL)
        starts, pids = [], []
        for t in ("b", "c", "d"):
            r = binding(sup, t, workspace=str(tmp_path)).execute_tool("tool_touch", {"x": 5})
            assert r["status_code"] == 200 and r["output"]["calls"] == [5]
            starts.append(start_of(sup, t, "tpl_counter"))
            pids += [x["pid"] for x in templates(sup, "tpl_counter")]
        assert "template" in starts[1:] and set(pids) - {old, 0}
        assert all(s in ("template", "fresh (its template was gone)", "fresh (first worker of the library: no "
                         "template yet)") for s in starts)


def test_changed_file_retires_its_template(counter, tmp_path):
    folder = tmp_path / "libs"
    folder.mkdir()
    shutil.copy(LIBS / "tpl_counter.py", folder / "tpl_counter.py")
    with Supervisor() as sup:
        warm(sup, folder, "tool_touch", tmp_path)
        old = templates(sup, "tpl_counter")[0]["pid"]
        with open(folder / "tpl_counter.py", "a") as f:
            f.write("\nCHANGED = True\n")
        for t in ("b", "c"):
            binding(sup, t, folder, workspace=str(tmp_path)).execute_tool("tool_touch", {})
        now = templates(sup, "tpl_counter")
        assert [t["pid"] for t in now] != [old] and len(now) == 1
        assert start_of(sup, "c", "tpl_counter") == "template"
        assert imports(counter) == 4                      # fresh + template, for each version
        assert sup._zygote.wait_exit(old, 10) is not None      # the old template was killed


def test_idle_template_is_evicted(counter, tmp_path):
    with Supervisor(idle_timeout_s=0.2) as sup:
        warm(sup, LIBS, "tool_touch", tmp_path)
        pid = templates(sup, "tpl_counter")[0]["pid"]
        assert sup._zygote.wait_exit(pid, 30) is not None       # its worker retired, then it
        assert templates(sup, "tpl_counter") == []


def test_uss_counts_only_private_pages():
    rss, uss = memory(os.getpid())
    assert 0 < uss < rss


# ----------------------------------------------------------------- hostile workers, templated
def test_garbage_frame_from_a_templated_worker_is_a_violation(tmp_path):
    with Supervisor() as sup:
        warm(sup, HOSTILE, "tool_ok", tmp_path)
        b = binding(sup, "mallory", HOSTILE, workspace=str(tmp_path), timeout_s=20)
        r = b.execute_tool("tool_raw", {"frames": [[P.RESULT, "c1c1c1c1"]], "output": "first"})
        assert r["status_code"] == 500 and "protocol violation" in r["error"]
        assert b.execute_tool("tool_raw", {"frames": [], "output": "second"})["output"] == "second"
        assert start_of(sup, "mallory", "hostile") == "template"


def test_huge_frame_from_a_templated_worker_is_refused(tmp_path):
    with Supervisor() as sup:
        warm(sup, HOSTILE, "tool_ok", tmp_path)
        b = binding(sup, "mallory", HOSTILE, workspace=str(tmp_path), timeout_s=20)
        header = (600 * 1024 * 1024).to_bytes(4, "big") + bytes([P.RESULT])
        r = b.execute_tool("tool_raw", {"frames": [["bytes", header.hex()]]})
        assert r["status_code"] == 500 and "cap" in r["error"]
        assert b.execute_tool("tool_ok", {"x": 7})["output"]["x"] == 7
        assert start_of(sup, "mallory", "hostile") == "template"


# ----------------------------------------------------------------- descriptors
_FD_SCRIPT = textwrap.dedent('''
    import resource, sys, tempfile
    resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[3])))
    from lcp_sandbox import SandboxedBinding, Supervisor
    ws = tempfile.mkdtemp()
    codes = []
    with Supervisor() as sup:
        print("LIMIT", sup.pool_stats()["open_files"])
        for i in range(int(sys.argv[4])):
            b = SandboxedBinding(tools_folders=[sys.argv[1]], supervisor=sup, tenant=f"t{i}", workspace=ws)
            r = b.execute_tool("tool_touch", {})
            codes.append(r["status_code"])
            if r["status_code"] != 200:
                print("ERROR", r["error"])
                break
    print("CODES", codes)
''')


def _fd_run(soft, hard, n):
    return subprocess.run([sys.executable, "-c", _FD_SCRIPT, str(LIBS), str(soft), str(hard), str(n)],
                          capture_output=True, text=True, timeout=300)


def test_running_out_of_descriptors_is_a_503_naming_the_limit():
    p = _fd_run(60, 60, 60)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    err = next(line for line in p.stdout.splitlines() if line.startswith("ERROR"))
    assert "file descriptors" in err and "60 open files" in err
    assert "503]" in p.stdout.splitlines()[-1]


def test_the_soft_open_files_limit_is_raised_to_the_hard_one():
    p = _fd_run(64, 4096, 1)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "'soft': 4096" in p.stdout and "'raised_from': 64" in p.stdout
