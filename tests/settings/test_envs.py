"""Per-library environments: declared beside the library, built by uv (wheels only, offline
here, from wheels the tests make), used by that library's workers and nobody else's."""
import importlib.util
import json
import os
import shutil
import site
import subprocess
import sys
import time

import pytest
from conftest import REPO, fork_only, poll
from support.envs_support import (
    PLAIN_TOOL,
    VERSION_TOOL,
    library,
    offline_uv,
    script_block,
    wheelhouse,
)

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.envs import Store
from lcp_sandbox.core.policy import BUILDER_IDS
from lcp_sandbox.core.requirements import DeclarationError, declared, env_key


@pytest.fixture(scope="module")
def house(open_tmp_module):
    # (where any user may read it: on a root host, builds run as a uid of their own)
    return wheelhouse(open_tmp_module / "wheelhouse")


@pytest.fixture
def uv_offline(house, tmp_path):
    with offline_uv(house, tmp_path / "uv-cache"):
        yield house


@pytest.fixture
def tools(tmp_path):
    folder = tmp_path / "tools"
    library(folder, "lib_one", VERSION_TOOL.format(name="one"), script_block("alpha==1.0"))
    library(folder, "lib_two", VERSION_TOOL.format(name="two"), requirements_txt="alpha==2.0\n")
    (folder / "plain.py").write_text(PLAIN_TOOL)
    return folder


def host_environment():
    """What the host's own environment holds: its path and its site-packages' listing."""
    listing = {d: sorted(os.listdir(d)) for d in site.getsitepackages() if os.path.isdir(d)}
    return list(sys.path), listing


def test_declarations_are_read_where_the_library_lives(tmp_path):
    loose = tmp_path / "loose.py"
    loose.write_text(script_block("b>=1", "a==1") + "def tool_x():\n    pass\n")
    found = declared([str(loose)], str(tmp_path))
    assert found is not None and found.requirements == ("a==1", "b>=1")
    (tmp_path / "requirements.txt").write_text("zzz\n")          # not a loose file's
    plain = tmp_path / "plain.py"
    plain.write_text("def tool_y():\n    pass\n")
    assert declared([str(plain)], str(tmp_path)) is None
    folder = tmp_path / "lib"
    folder.mkdir()
    (folder / "lib.py").write_text("def tool_z():\n    pass\n")
    (folder / "pyproject.toml").write_text('[project]\nname = "x"\ndependencies = ["c  <2"]\n')
    assert declared([str(folder / "lib.py")], str(folder)).requirements == ("c<2",)
    (folder / "requirements.txt").write_text("# pins\nd==1  # why\n\n")
    assert declared([str(folder / "lib.py")], str(folder)).requirements == ("d==1",)
    for bad in ("--index-url https://evil.example/simple\n", "-e .\n",
                "https://example.org/x.whl\n"):
        (folder / "requirements.txt").write_text(bad)
        with pytest.raises(DeclarationError, match="requirements.txt, line 1"):
            declared([str(folder / "lib.py")], str(folder))
    for bad in ("x @ https://evil.example/x.whl", "x @ ./local", "x\n--index-url https://e.example",
                "x --config-settings=a=b", "/abs/path", "-r other.txt"):
        loose.write_text(script_block(bad))
        with pytest.raises(DeclarationError, match="not a requirement from an index"):
            declared([str(loose)], str(tmp_path))
    loose.write_text(script_block('x[extra]>=1; python_version >= "3.8"'))
    assert declared([str(loose)], None).requirements == ('x[extra]>=1; python_version >= "3.8"',)
    py = {"version": "3"}
    assert env_key(("a==1", "b"), py) == env_key(("a==1", "b"), dict(py))
    assert env_key(("a==1",), py) != env_key(("a==2",), py)
    assert env_key(("a==1",), py) != env_key(("a==1",), {"version": "4"})


def test_two_libraries_of_one_binding_each_answer_with_their_own_version(uv_offline, tools,
                                                                         tmp_path):
    before = host_environment()
    store = tmp_path / "store"
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        one, two = b.execute_tool("tool_one", {}), b.execute_tool("tool_two", {})
        assert one["output"]["version"] == "1.0", one
        assert two["output"]["version"] == "2.0", two
        for out in (one["output"], two["output"]):
            assert out["file"].startswith(str(store)) and out["prefix"].startswith(str(store))
        plain = b.execute_tool("tool_plain", {})["output"]
        assert plain == {"imported": False, "why": "No module named 'alpha'"}
        by_lib = {s["library"]: s["environment"] for s in b.stats()}
        assert by_lib["plain"] is None
        assert by_lib["lib_one"]["versions"] == {"alpha": "1.0"}
        assert by_lib["lib_two"]["where"] == str(tools / "lib_two" / "requirements.txt")
        assert by_lib["lib_one"]["prefix"] == one["output"]["prefix"]
        assert sup.metrics()["env_builds"]["ok"] == 2
        entries = {e["key"]: e for e in Store(str(store)).entries()}
        assert {e["libraries"][0] for e in entries.values()} == {
            str(tools / "lib_one" / "lib_one.py"), str(tools / "lib_two" / "requirements.txt")}
        for e in entries.values():
            lock = (store / e["key"] / "lock.txt").read_text()
            assert e["complete"] and "--hash=sha256:" in lock
    assert importlib.util.find_spec("alpha") is None
    assert host_environment() == before


def test_a_requirement_with_only_an_sdist_is_refused_by_name(uv_offline, tmp_path):
    folder = tmp_path / "tools"
    library(folder, "needs_sdist", VERSION_TOOL.format(name="s"), script_block("onlysdist"))
    library(folder, "fine", VERSION_TOOL.format(name="fine"), script_block("alpha==2.0"))
    store = tmp_path / "store"
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        out = b.execute_tool("tool_s", {})
        assert out["status_code"] == 500 and not out["success"]
        assert "[needs_sdist] tool 'tool_s' not run" in out["error"]
        assert "onlysdist" in out["error"] and "wheels only" in out["error"]
        assert [e for e in Store(str(store)).entries()] == []       # nothing was built
        assert b.execute_tool("tool_fine", {})["output"]["version"] == "2.0"   # unaffected
        assert sup.metrics()["env_builds"]["failed"] == 1
    unresolvable = tmp_path / "more"
    library(unresolvable, "too_new", VERSION_TOOL.format(name="new"), script_block("alpha>=9"))
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[unresolvable], supervisor=sup, workspace=tmp_path) as b:
        out = b.execute_tool("tool_new", {})
        assert out["status_code"] == 500 and "alpha>=9" in out["error"], out


def test_a_second_host_process_reuses_the_store_with_the_network_off(uv_offline, tools,
                                                                     tmp_path):
    store = tmp_path / "store"
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_one", {})["output"]["version"] == "1.0"
    code = ("import json, sys\nfrom lcp_sandbox import SandboxedBinding, Supervisor\n"
            "sup = Supervisor(envs_dir=sys.argv[2])\n"
            "with SandboxedBinding(tools_folders=[sys.argv[1]], supervisor=sup) as b:\n"
            "    out = b.execute_tool('tool_one', {})\n"
            "    print(json.dumps([out, sup.metrics()['env_builds']]))\n"
            "sup.close()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_")}
    env.update(UV_OFFLINE="1", UV_NO_INDEX="1", UV_FIND_LINKS=str(tmp_path / "no-wheels"),
               UV_CACHE_DIR=str(tmp_path / "empty-cache"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", code, str(tools), str(store)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    out, builds = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["output"]["version"] == "1.0", (out, done.stderr)
    assert builds["ok"] == 0 and builds["failed"] == 0
    assert not (tmp_path / "empty-cache").exists()      # uv was never asked


def test_a_broken_lock_or_a_vanished_store_is_rebuilt_not_half_used(uv_offline, tools,
                                                                    tmp_path):
    store = tmp_path / "store"
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        first = b.execute_tool("tool_one", {})["output"]
        prefix = first["prefix"]
        with open(os.path.join(prefix, "lock.txt"), "a") as f:
            f.write("alpha==6.6\n")                      # no longer what .complete says
        assert Store(str(store)).ready(os.path.basename(prefix)) is None
        b.restart_library("lib_one")
        assert b.execute_tool("tool_one", {})["output"] == first
        assert sup.metrics()["env_builds"]["ok"] == 2
        shutil.rmtree(store)                             # the whole store, mid-run
        b.restart_library("lib_one")
        assert b.execute_tool("tool_one", {})["output"] == first
        assert sup.metrics()["env_builds"]["ok"] == 3
        os.remove(os.path.join(prefix, ".complete"))     # a build that never finished
        b.restart_library("lib_one")
        assert b.execute_tool("tool_one", {})["output"] == first
        assert sup.metrics()["env_builds"]["ok"] == 4
        assert b.execute_tool("tool_two", {})["output"]["version"] == "2.0"
        (tools / "lib_two" / "requirements.txt").unlink()  # it declares nothing any more
        b.restart_library("lib_two")
        out = b.execute_tool("tool_two", {})
        assert out["status_code"] == 500 and "No module named 'alpha'" in out["error"]
        assert {s["library"]: s["environment"] is None for s in b.stats()} == {
            "lib_one": False, "lib_two": True}


def test_the_wait_for_an_environment_has_its_own_limit(uv_offline, tools, tmp_path):
    store = tmp_path / "store"
    with Supervisor(envs_dir=str(store), env_wait_s=0) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        out = b.execute_tool("tool_one", {})
        assert out["status_code"] == 503, out
        assert "environment" in out["error"] and "not ready within 0 s" in out["error"]
        assert "alpha==1.0" in out["error"]
        assert sup.metrics()["refusals"].get("env_pending") == 1
        assert poll(lambda: sup.metrics()["env_builds"]["ok"] == 1)   # the build went on
        assert b.execute_tool("tool_one", {})["output"]["version"] == "1.0"


def test_the_build_does_not_count_against_the_tools_timeout(uv_offline, tools, tmp_path,
                                                            monkeypatch):
    # A build that takes longer than the tool's timeout (3 s against 2 s: made slow here,
    # whatever uv's speed); the worker's start, which does count, is well inside 2 s even
    # on a busy machine's spawn path (0.05 s once was not).
    from lcp_sandbox.backends.envs import manager
    real = manager.build

    def slow_build(*args):
        done = time.monotonic() + 3.0
        real(*args)
        time.sleep(max(0.0, done - time.monotonic()))               # (a slow build)

    monkeypatch.setattr(manager, "build", slow_build)
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path,
                             timeout_s=2.0) as b:
        out = b.execute_tool("tool_one", {})
        assert out["status_code"] == 200, out
        assert sup.metrics()["env_builds"]["seconds_max"] > 2.0     # it took longer than that


def test_spawned_workers_use_their_environments(uv_offline, tools, tmp_path):
    with Supervisor(envs_dir=str(tmp_path / "store"), start_method="spawn") as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_one", {})["output"]["version"] == "1.0"
        assert b.execute_tool("tool_two", {})["output"]["version"] == "2.0"
        assert b.execute_tool("tool_plain", {})["output"]["imported"] is False
        assert sup.pool_stats()["start_method"] == "spawn"


@fork_only("library templates")
def test_a_template_per_environment_serves_new_tenants(uv_offline, tools, tmp_path):
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup:
        answers, starts = {}, {}
        for tenant in ("a", "b", "c"):
            with SandboxedBinding(tools_folders=[tools], supervisor=sup, tenant=tenant,
                                  workspace=tmp_path) as b:
                answers[tenant] = (b.execute_tool("tool_one", {})["output"]["version"],
                                   b.execute_tool("tool_two", {})["output"]["version"])
                starts[tenant] = {s["library"]: s["start"] for s in b.stats()}
        assert set(answers.values()) == {("1.0", "2.0")}
        assert starts["c"] == {"lib_one": "template", "lib_two": "template"}, starts
        assert {t["library"] for t in sup.pool_stats()["templates"]} >= {"lib_one", "lib_two"}


def test_a_package_the_engine_already_runs_at_another_version_is_refused_by_name(
        uv_offline, tmp_path):
    folder = tmp_path / "tools"
    library(folder, "old_msgpack", "import msgpack\n\ndef tool_m() -> str:\n"
                                   "    return msgpack.V\n", script_block("msgpack==0.0.1"))
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        out = b.execute_tool("tool_m", {})
        assert out["status_code"] == 500, out
        assert "msgpack 0.0.1" in out["error"] and "cannot be layered" in out["error"]
        assert b.stats()[0]["environment"]["versions"] == {"msgpack": "0.0.1"}


PIPMASTER_TOOL = '''
import pipmaster as pm

AT_IMPORT = pm.ensure_packages({"alpha": "==1.0"})


def tool_ask(requirements: list) -> dict:
    """What pipmaster answers in the worker."""
    try:
        return {"ensured": pm.ensure_packages(requirements)}
    except ImportError as exc:
        return {"refused": str(exc), "kind": type(exc).__name__}


def tool_facts() -> dict:
    """pipmaster's questions, answered from the environment."""
    return {"at_import": AT_IMPORT, "alpha": pm.get_installed_version("alpha"),
            "has_2": pm.is_installed("alpha", ">=2"), "has_1": pm.is_installed("alpha"),
            "manager": pm.get_pip_manager().is_installed("alpha", "==1.*")}
'''

PIPMASTER_PLAIN = '''
import pipmaster


def tool_install_x() -> dict:
    """What an undeclared install does in a worker of the host's environment."""
    try:
        return {"installed": pipmaster.ensure_packages({"alpha": "==1.0"})}
    except ImportError as exc:
        return {"refused": str(exc)}
'''


def test_pipmaster_answers_from_the_workers_environment_and_never_installs(uv_offline,
                                                                          tmp_path):
    before = host_environment()
    folder = tmp_path / "tools"
    library(folder, "asks", PIPMASTER_TOOL, script_block("alpha==1.0"))
    (folder / "undeclared.py").write_text(PIPMASTER_PLAIN)
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_facts", {})["output"] == {
            "at_import": True, "alpha": "1.0", "has_2": False, "has_1": True, "manager": True}
        assert b.execute_tool("tool_ask", {"requirements": ["alpha>=1,<2"]})["output"] == {
            "ensured": True}
        out = b.execute_tool("tool_ask", {"requirements": ["alpha>=2", "gamma"]})["output"]
        assert out["kind"] == "NotInEnvironment"
        assert "alpha>=2 (1.0 is installed), gamma not in its environment" in out["refused"]
        assert "declare them with the library" in out["refused"]
        plain = b.execute_tool("tool_install_x", {})["output"]
        assert "alpha==1.0 not in the host's environment" in plain["refused"]
    assert importlib.util.find_spec("alpha") is None
    assert host_environment() == before


CONFINED_TOOL = '''
import os
import alpha


def tool_look(store: str, other: str) -> dict:
    """Its alpha, and what it can see of the rest of the store."""
    seen = {}
    for what, path in (("store", store), ("other", os.path.join(other, "lock.txt"))):
        try:
            seen[what] = os.listdir(path) if what == "store" else open(path).read()[:20]
        except OSError as exc:
            seen[what] = type(exc).__name__
    return {"version": alpha.V, "uid": os.getuid(), **seen}
'''


def test_a_confined_worker_reads_its_environment_and_nothing_else_of_the_store(
        uv_offline, tools, open_tmp, tmp_path):
    store = open_tmp / "store"
    folder = open_tmp / "tools"
    library(folder, "peek", CONFINED_TOOL, script_block("alpha==2.0"))
    shutil.copytree(tools / "lib_one", folder / "lib_one")
    (open_tmp / "ws").mkdir()
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        other = b.execute_tool("tool_one", {})["output"]["prefix"]      # unconfined: built
    with Supervisor(envs_dir=str(store), confine=True) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup,
                             workspace=open_tmp / "ws") as b:
        out = b.execute_tool("tool_look", {"store": str(store), "other": other})
        assert out["status_code"] == 200, out
        seen = out["output"]
        assert seen["version"] == "2.0"
        assert seen["store"] in ("PermissionError", "FileNotFoundError"), seen
        assert seen["other"] in ("PermissionError", "FileNotFoundError"), seen
        if os.geteuid() == 0:
            assert seen["uid"] != 0
        assert b.stats()[0]["environment"]["versions"] == {"alpha": "2.0"}


def test_envs_build_list_prune_from_the_command_line(uv_offline, tools, tmp_path, capsys):
    from lcp_sandbox.fronts.cli import main
    store = str(tmp_path / "store")
    assert main(["envs", "build", str(tools), "--store", store]) == 0
    built = capsys.readouterr().out
    assert "lib_one: " in built and "(alpha==1.0)" in built and "(alpha==2.0)" in built
    assert "plain" not in built                           # declares nothing: nothing built
    assert main(["envs", "list", "--store", store, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(e["versions"]["alpha"] for e in listed) == ["1.0", "2.0"]
    assert all(e["complete"] and e["size"] > 0 for e in listed)
    with Supervisor(envs_dir=store) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_two", {})["output"]["version"] == "2.0"
        assert sup.metrics()["env_builds"]["ok"] == 0     # built ahead: the call built nothing
    (tools / "lib_two" / "requirements.txt").write_text("alpha==1.0\n")   # now shares lib_one's
    assert main(["envs", "prune", "--store", store, "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would remove ")
    assert len(Store(store).entries()) == 2
    assert main(["envs", "prune", "--store", store]) == 0
    assert [e["versions"] for e in Store(store).entries()] == [{"alpha": "1.0"}]
    library(tools, "bad", VERSION_TOOL.format(name="bad"), script_block("onlysdist"))
    assert main(["envs", "build", str(tools), "--store", store]) == 1
    out = capsys.readouterr().out
    assert "bad: " in out and "onlysdist" in out


def test_the_host_gives_requirements_to_a_library_that_declares_none(uv_offline, tmp_path):
    folder = tmp_path / "tools"
    folder.mkdir()
    (folder / "undeclared.py").write_text(PIPMASTER_PLAIN)
    given = {"undeclared": {"sandbox": {"requirements": ["alpha==1.0"]}}}
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup:
        with SandboxedBinding(given, tools_folders=[folder], supervisor=sup,
                              workspace=tmp_path) as b:
            assert b.execute_tool("tool_install_x", {})["output"] == {"installed": True}
            env = b.stats()[0]["environment"]
            assert env["versions"] == {"alpha": "1.0"} and "['requirements']" in env["where"]
        wrong = {"undeclared": {"sandbox": {"requirements": "alpha==1.0"}}}
        with SandboxedBinding(wrong, tools_folders=[folder], supervisor=sup,
                              workspace=tmp_path) as b:
            out = b.execute_tool("tool_install_x", {})
            assert out["status_code"] == 500 and "'requirements' must be a list" in out["error"]


def run_builder(spec: dict) -> dict:
    """The builder process (worker/builder.py) run as the host runs it; its answer."""
    from lcp_sandbox.backends.boot import boot_argv
    done = subprocess.run(boot_argv("from lcp_sandbox.worker.builder import main; main()", ""),
                          input=json.dumps(spec), capture_output=True, text=True, timeout=60)
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Landlock is Linux's")
def test_the_builder_writes_only_beneath_the_store_and_uvs_cache(uv_offline, tools, tmp_path):
    from lcp_sandbox.backends.envs.build import builder_ids
    from lcp_sandbox.worker.confine.landlock import landlock_abi
    if landlock_abi() < 1:
        pytest.skip("a kernel without Landlock: builds run unconfined, with a warning")
    inside, outside = tmp_path / "store", tmp_path / "elsewhere"
    inside.mkdir(), outside.mkdir()
    ids = builder_ids()
    for folder in (inside, outside):     # (its uid may write both: Landlock stops the second)
        if ids:
            os.chown(folder, *ids)
    steps = [{"argv": ["sh", "-c", f"echo in > {inside}/f"]},
             {"argv": ["sh", "-c", f"echo out > {outside}/f"]}]
    answer = run_builder({"write": [str(inside)], "reach": [str(outside)], "run_as": ids,
                          "steps": steps})
    assert answer["landlock"].startswith("on")
    assert answer["results"][0]["rc"] == 0 and answer["results"][1]["rc"] != 0
    assert "Permission denied" in answer["results"][1]["words"]
    assert (inside / "f").read_text() == "in\n" and not (outside / "f").exists()
    with Supervisor(envs_dir=str(inside)) as sup, \
            SandboxedBinding(tools_folders=[tools], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_one", {})["output"]["version"] == "1.0"
        assert sup.metrics()["env_builds"]["builder_landlock"].startswith("on")


ROOT_HOST = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                               reason="a root host's builds run as a uid of their own")


@ROOT_HOST
def test_the_builder_runs_as_its_own_uid_and_reads_no_root_only_file(open_tmp):
    secret, out = open_tmp / "secret", open_tmp / "out"
    secret.write_text("root's")
    secret.chmod(0o600)
    out.mkdir()
    os.chown(out, *BUILDER_IDS)
    steps = [{"argv": ["sh", "-c", f"id -u; id -G; echo made > {out}/f"]},
             {"argv": ["cat", str(secret)]}]
    answer = run_builder({"write": [str(out)], "run_as": list(BUILDER_IDS), "steps": steps})
    assert answer["runs_as"].startswith(f"uid {BUILDER_IDS[0]} gid {BUILDER_IDS[1]}"), answer
    assert answer["results"][0]["words"].split() == [str(BUILDER_IDS[0]), str(BUILDER_IDS[1])]
    assert os.stat(out / "f").st_uid == BUILDER_IDS[0]
    assert answer["results"][1]["rc"] != 0 and "Permission denied" in answer["results"][1]["words"]
    as_root = run_builder({"write": [str(out)], "run_as": None, "steps": steps})
    assert "never run as root" in as_root["refused"] and as_root["results"] == []


@ROOT_HOST
def test_a_root_hosts_build_reads_only_what_a_user_may_and_writes_as_its_own_uid(
        uv_offline, open_tmp, tmp_path, monkeypatch):
    folder = tmp_path / "tools"
    library(folder, "lib", VERSION_TOOL.format(name="x"), script_block("alpha==1.0"))
    private = open_tmp / "private"
    private.mkdir(mode=0o700)
    shutil.copy(uv_offline / "alpha-1.0-py3-none-any.whl", private)
    store, cache = tmp_path / "store", tmp_path / "uv-cache"
    with Supervisor(envs_dir=str(store)) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        # The host's own find-links, in a folder only root may read: root would read it.
        monkeypatch.setenv("UV_FIND_LINKS", str(private))
        out = b.execute_tool("tool_x", {})
        assert out["status_code"] == 500, out
        assert f"{private}" in out["error"] and "Permission denied" in out["error"], out
        assert sup.metrics()["env_builds"]["builder_runs_as"].startswith(
            f"uid {BUILDER_IDS[0]} ")
        monkeypatch.setenv("UV_FIND_LINKS", str(uv_offline))
        built = b.execute_tool("tool_x", {})["output"]["prefix"]
    assert os.stat(os.path.join(built, "lock.txt")).st_uid == BUILDER_IDS[0]
    for own in (store / ".building", cache):       # its alone: no tenant writes there
        st = os.stat(own)
        assert (st.st_uid, st.st_mode & 0o777) == (BUILDER_IDS[0], 0o700), own
    assert {os.stat(p).st_uid for p in cache.rglob("*")} == {BUILDER_IDS[0]}


@ROOT_HOST
def test_a_root_host_hands_its_uv_settings_to_the_builder_and_keeps_its_cache_apart(
        uv_offline, tmp_path, monkeypatch):
    folder = tmp_path / "tools"
    library(folder, "lib", VERSION_TOOL.format(name="x"), script_block("alpha==1.0"))
    # root's own uv.toml (below a folder only root may read) names the wheels
    config = tmp_path / "config"
    (config / "uv").mkdir(parents=True)
    (config / "uv" / "uv.toml").write_text(f'find-links = ["{uv_offline}"]\n')
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    monkeypatch.delenv("UV_FIND_LINKS")
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        assert b.execute_tool("tool_x", {})["output"]["version"] == "1.0"
    roots = tmp_path / "roots-cache"
    roots.mkdir()
    monkeypatch.setenv("UV_CACHE_DIR", str(roots))
    library(folder, "lib", VERSION_TOOL.format(name="x"), script_block("alpha==2.0"))
    with Supervisor(envs_dir=str(tmp_path / "store")) as sup, \
            SandboxedBinding(tools_folders=[folder], supervisor=sup, workspace=tmp_path) as b:
        out = b.execute_tool("tool_x", {})
        assert out["status_code"] == 500, out
        assert f"uv's cache {roots} is uid 0's" in out["error"], out
        assert f"chown -R {BUILDER_IDS[0]}:{BUILDER_IDS[1]} {roots}" in out["error"], out


@pytest.mark.parametrize("kind", ["fresh", "base", "template"])
def test_confined_workers_of_every_start_kind_use_their_environment(uv_offline, tools, open_tmp,
                                                                     kind):
    from support.confined_kinds import Confined
    folder = open_tmp / "tools"
    shutil.copytree(tools, folder)
    confined = Confined(kind, open_tmp / "tenants", envs_dir=str(open_tmp / "store"))
    try:
        for tenant in ("a", "b"):
            b = confined.binding(folder, tenant)
            assert b.execute_tool("tool_one", {})["output"]["version"] == "1.0"
            assert b.execute_tool("tool_two", {})["output"]["version"] == "2.0"
            assert b.execute_tool("tool_plain", {})["output"]["imported"] is False
            assert {s["library"]: s["protections"]["filesystem"].startswith("on")
                    for s in b.stats()} == {"lib_one": True, "lib_two": True, "plain": True}
    finally:
        confined.close()                 # (checks every worker started as ``kind``)


@pytest.mark.skipif(not os.path.exists("/proc/locks"), reason="reads the kernel's /proc/locks")
def test_two_host_processes_building_one_environment_build_it_once(uv_offline, tmp_path):
    from lcp_sandbox.backends.envs import Environments
    store = str(tmp_path / "store")
    key = Environments(store).key(("alpha==2.0",))
    code = ("import json, sys\nfrom lcp_sandbox.backends.envs import Environments\n"
            "envs = Environments(sys.argv[1])\n"
            "built = envs.ensure(('alpha==2.0',), 'x.py', 'lib', 'tool')\n"
            "print(json.dumps([built.versions, envs.snapshot()['ok']]))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    def waiting(pids) -> bool:              # both blocked on the environment's file lock
        with open("/proc/locks") as f:
            blocked = [line.split() for line in f if "->" in line]
        return {str(p) for p in pids} <= {fields[5] for fields in blocked}

    with Store(store).locked(key):          # held here until both wait for it
        procs = [subprocess.Popen([sys.executable, "-c", code, store], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for _ in range(2)]
        assert poll(lambda: waiting([p.pid for p in procs]), 60)
    answers = [json.loads(p.communicate(timeout=120)[0].strip().splitlines()[-1]) for p in procs]
    assert [versions for versions, _ in answers] == [{"alpha": "2.0"}] * 2
    assert sorted(builds for _, builds in answers) == [0, 1]      # one built, one found it
    assert [e["key"] for e in Store(store).entries()] == [key]
