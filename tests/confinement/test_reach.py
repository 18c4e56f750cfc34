"""A confined worker of another uid must reach its library's folder, the Python environment
and the interpreter.  Where it cannot be given a view past a folder only root may pass (a
filter refuses namespaces: a container's default), the host finds that before the worker
starts and refuses the call naming the folder and what to change; serve-mcp does the same
when it starts.  (Elsewhere the worker covers such a folder: test_privileges.py.)"""
from __future__ import annotations

import os

import pytest

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import handover

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="workers of another uid need a root "
                                                          "host")

LIBRARY = '''\
def tool_hello() -> dict:
    """Say hello."""
    return {"success": True, "output": "hello"}
'''


@pytest.fixture
def closed_tools(open_tmp):
    """A tools folder below a folder only root may pass (mode 0700, as /root), in a folder
    every uid may pass."""
    closed = open_tmp / "closed"
    tools = closed / "tools"
    tools.mkdir(parents=True)
    (tools / "hello.py").write_text(LIBRARY, encoding="utf-8")
    os.chmod(tools, 0o755)
    os.chmod(closed, 0o700)
    return closed, tools


def test_the_folder_in_a_uids_way_is_named_with_what_to_change(closed_tools, open_tmp):
    closed, tools = closed_tools
    why = handover.unreachable(65534, 65534, [str(tools)])
    assert f"uid 65534 cannot reach the library's folder {tools}" in why
    assert f"may not pass through {closed} (mode 0700, uid 0's)" in why
    assert f"chmod o+x {closed}" in why
    os.chmod(closed, 0o711)
    # (this machine's Python may lie below a folder of its own: only the library is asked of)
    assert str(tools) not in handover.unreachable(65534, 65534, [str(tools)])


def test_a_worker_that_could_not_reach_its_library_is_refused_before_it_starts(
        closed_tools, open_tmp, monkeypatch):
    """On a host whose workers can make no namespace (a container), a library below a
    0700 folder: 503 naming that folder, and no worker was started."""
    closed, tools = closed_tools
    monkeypatch.setattr(handover, "_namespaces_refused", lambda: True)
    with Supervisor(confine=True) as sup:
        ws = open_tmp / "ws"
        ws.mkdir()
        t = SandboxedBinding(tools_folders=[tools], supervisor=sup, tenant="closed",
                             workspace=str(ws), workspace_root=str(ws))
        got = t.execute_tool("tool_hello", {})
        assert got["status_code"] == 503, got
        assert f"may not pass through {closed} (mode 0700" in got["output"], got
        assert f"chmod o+x {closed}" in got["output"]
        assert [s["pid"] for s in sup.stats()] == [None]           # no worker started
        monkeypatch.setattr(handover, "_namespaces_refused", lambda: False)
        # where it can be given a view past the folder, the same call runs
        assert t.execute_tool("tool_hello", {})["output"] == "hello"


def test_serve_mcp_says_at_start_what_its_workers_could_not_reach(closed_tools, monkeypatch,
                                                                  capsys):
    from lcp_sandbox.fronts import cli
    closed, tools = closed_tools
    monkeypatch.setattr(handover, "_namespaces_refused", lambda: True)
    code = cli.main(["serve-mcp", str(tools), "--transport", "http", "--port", "0"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"may not pass through {closed}" in err and f"chmod o+x {closed}" in err
