"""What a new user trips over, in the binding: relative and missing workspaces,
params that are not a dict, and calls after close()."""
import asyncio
import types

import pytest
from conftest import LIBS

from lcp_sandbox import SandboxedBinding, Supervisor


def cwd_of(result: dict) -> str:
    assert result["success"] is True, result
    return result["output"]["cwd"]


# ================================================================ workspaces
def test_relative_workspace_is_resolved_against_the_host_cwd(make_binding, tmp_path, monkeypatch):
    """Not against the worker's CWD of the previous call: that call ran in w1, and w1/rel
    exists too, so a worker-side resolution would land there."""
    host_cwd = tmp_path / "host"
    for d in (host_cwd / "rel", tmp_path / "w1" / "rel"):
        d.mkdir(parents=True)
    monkeypatch.chdir(host_cwd)
    b = make_binding()
    assert cwd_of(b.execute_tool("tool_whoami", {}, workspace=str(tmp_path / "w1"))) == str(tmp_path / "w1")
    assert cwd_of(b.execute_tool("tool_whoami", {}, workspace="rel")) == str(host_cwd / "rel")
    assert cwd_of(b.execute_tool("tool_whoami", {}, workspace="rel")) == str(host_cwd / "rel")


def test_relative_workspace_is_checked_and_run_in_the_same_place(make_binding, tmp_path, monkeypatch):
    """The 403 check and the worker's CWD agree on where a relative workspace is."""
    root = tmp_path / "root"
    (root / "a").mkdir(parents=True)
    (root / "b").mkdir()
    monkeypatch.chdir(tmp_path)
    b = make_binding(workspace=str(root / "a"), workspace_root=str(root))
    assert cwd_of(b.execute_tool("tool_whoami", {})) == str(root / "a")
    assert cwd_of(b.execute_tool("tool_whoami", {}, workspace="root/b")) == str(root / "b")
    outside = b.execute_tool("tool_whoami", {}, workspace="elsewhere")
    assert outside["status_code"] == 403 and str(tmp_path / "elsewhere") in outside["error"]


def test_missing_workspace_is_created(make_binding, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    b = make_binding(workspace="./workspace/deep")            # relative, does not exist
    assert not (tmp_path / "workspace").exists()               # making the binding creates nothing
    assert cwd_of(b.execute_tool("tool_whoami", {})) == str(tmp_path / "workspace" / "deep")
    assert cwd_of(b.execute_tool("tool_whoami", {}, workspace="per_call")) == str(tmp_path / "per_call")
    assert (tmp_path / "per_call").is_dir()


def test_missing_workspace_is_created_only_inside_the_tenant_root(make_binding, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    b = make_binding(workspace=str(root / "new"), workspace_root=str(root))
    assert cwd_of(b.execute_tool("tool_whoami", {})) == str(root / "new")
    r = b.execute_tool("tool_whoami", {}, workspace=str(tmp_path / "outside" / "new"))
    assert r["status_code"] == 403
    assert not (tmp_path / "outside").exists()                 # refused before anything is made


def test_library_functions_get_the_same_workspace_checks(make_binding, tmp_path):
    """call_library_function (mounted_libraries[name].fn()) checks the root before it creates."""
    root = tmp_path / "root"
    root.mkdir()
    outside = make_binding(workspace=str(tmp_path / "outside" / "ws"), workspace_root=str(root))
    with pytest.raises(RuntimeError, match="outside the root"):
        outside.mounted_libraries["stateful"].tool_increment()
    assert not (tmp_path / "outside").exists()
    inside = make_binding(workspace=str(root / "new"), workspace_root=str(root))
    assert inside.mounted_libraries["stateful"].tool_whoami()["output"]["cwd"] == str(root / "new")


def test_workspace_that_cannot_be_created_is_a_clear_failure(make_binding, tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    b = make_binding()
    r = b.execute_tool("tool_whoami", {}, workspace=str(tmp_path / "a_file" / "ws"))
    assert r["success"] is False and r["status_code"] == 500
    assert "cannot be created" in r["error"] and "a_file" in r["error"] and "tool_whoami" in r["error"]
    assert b.stats() == []                                      # no worker was started for it


# ================================================================ params
@pytest.mark.parametrize("params", [[], [1, 2], "step=1", 3])
def test_params_that_are_not_a_mapping_raise_a_clear_type_error(make_binding, params):
    b = make_binding()
    with pytest.raises(TypeError) as info:
        b.execute_tool("tool_increment", params)
    text = str(info.value)
    assert "tool_increment" in text and type(params).__name__ in text and "dict" in text
    with pytest.raises(TypeError, match="tool_increment"):
        asyncio.run(b.aexecute_tool("tool_increment", params))


def test_none_and_any_mapping_are_accepted_as_params(make_binding):
    b = make_binding()
    assert b.execute_tool("tool_increment", None)["output"] == 1
    assert b.execute_tool("tool_increment", types.MappingProxyType({"step": 2}))["output"] == 3
    assert b.execute_tool("tool_nope", [1])["status_code"] == 404          # unknown tool: 404 first, as LCPBinding


# ================================================================ after close()
def test_closed_binding_answers_503_sync_and_async(tmp_path):
    b = SandboxedBinding(tools_folders=[LIBS], workspace=str(tmp_path))
    assert b.execute_tool("tool_increment", {})["output"] == 1
    assert asyncio.run(b.aexecute_tool("tool_increment", {}))["output"] == 2
    b.close()
    sync = b.execute_tool("tool_increment", {})
    assert sync["status_code"] == 503 and sync["success"] is False and "closed" in sync["error"]
    asynchronous = asyncio.run(b.aexecute_tool("tool_increment", {}))
    assert asynchronous == sync
    b.close()                                         # idempotent


def test_closed_binding_on_a_shared_supervisor_starts_no_worker(tmp_path):
    with Supervisor() as sup:
        other = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="other", workspace=str(tmp_path))
        b = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="closing", workspace=str(tmp_path))
        assert b.execute_tool("tool_increment", {})["success"] is True
        b.close()
        assert not any(s["pid"] for s in sup.stats(tenant="closing"))
        r = b.execute_tool("tool_increment", {})
        assert r["status_code"] == 503 and "closed" in r["error"] and "tool_increment" in r["error"]
        assert asyncio.run(b.aexecute_tool("tool_increment", {})) == r
        with pytest.raises(RuntimeError, match="closed"):
            b.mounted_libraries["stateful"].tool_increment()
        assert not any(s["pid"] for s in sup.stats(tenant="closing"))     # nothing was started again
        assert other.execute_tool("tool_increment", {})["output"] == 1     # the supervisor still serves others
        other.close()
