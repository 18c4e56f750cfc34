"""Public controls a front (the MCP server) needs: restart one library's worker."""
from __future__ import annotations

import textwrap

import pytest

from lcp_sandbox import SandboxedBinding

LIB_V1 = textwrap.dedent('''
    COUNTER = 0

    def tool_bump() -> dict:
        """Adds one to a module counter."""
        global COUNTER
        COUNTER += 1
        return {"success": True, "output": {"version": 1, "counter": COUNTER}}
''')


@pytest.fixture
def lib_binding(tmp_path, supervisor):
    folder = tmp_path / "libs"
    (folder / "bumper").mkdir(parents=True)
    (folder / "bumper" / "bumper.py").write_text(LIB_V1)
    b = SandboxedBinding(tools_folders=[folder], workspace=str(tmp_path / "ws"), supervisor=supervisor,
                         tenant=f"control-{tmp_path.name}")
    yield b, folder / "bumper" / "bumper.py"
    b.close()


def test_restart_library_starts_a_fresh_worker_with_the_new_code(lib_binding):
    b, path = lib_binding
    assert b.execute_tool("tool_bump")["output"] == {"version": 1, "counter": 1}
    assert b.execute_tool("tool_bump")["output"] == {"version": 1, "counter": 2}
    pid = b.stats()[0]["pid"]
    # (another size too: a same-size rewrite within the same second would reuse the
    # stale bytecode in __pycache__, whose check is the source's mtime in seconds and size)
    path.write_text(LIB_V1.replace('"version": 1', '"version": 20'))
    assert b.restart_library("bumper") is True
    assert [s["pid"] for s in b.stats() if s["library"] == "bumper"] in ([], [None])
    b.discover_tools(force_refresh=True)
    assert b.execute_tool("tool_bump")["output"] == {"version": 20, "counter": 1}
    assert b.stats()[0]["pid"] != pid


def test_restart_of_an_unknown_library_says_so(lib_binding):
    b, _ = lib_binding
    assert b.restart_library("nope") is False
    assert b.restart_library("bumper") is True            # known, no worker running: nothing to stop
