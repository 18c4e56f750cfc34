"""Public controls a front (the MCP server) needs: restart one library's worker."""
from __future__ import annotations

import textwrap
import threading
import time
from pathlib import Path

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


# ---------------------------------------------------------------- interrupt
SLEEPER = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    STATE = {"calls": 0, "interrupted": 0}
    _CONFIRM_HANDLER = None

    def set_confirm_handler(handler):
        global _CONFIRM_HANDLER
        _CONFIRM_HANDLER = handler

    def tool_sleep(marker: str, seconds: float = 30.0, ask: bool = False) -> dict:
        """Writes the marker file (or asks the confirm handler), then sleeps.

        Args:
            marker (str): file written when the sleep starts
            seconds (float): how long to sleep
            ask (bool): ask the confirm handler first
        """
        STATE["calls"] += 1
        if ask:
            _CONFIRM_HANDLER("sleep", "sleeper")
        try:                       # the marker inside: an interrupt sent once it exists is counted
            Path(marker).write_text("sleeping")
            time.sleep(seconds)
        except BaseException:
            STATE["interrupted"] += 1
            raise
        return {"success": True, "output": "slept"}

    def tool_state() -> dict:
        """The module state and the worker's pid."""
        return {"success": True, "output": {**STATE, "pid": os.getpid()}}
''')


@pytest.fixture
def sleeper(tmp_path, supervisor):
    (tmp_path / "libs" / "sleeper").mkdir(parents=True)
    (tmp_path / "libs" / "sleeper" / "sleeper.py").write_text(SLEEPER)
    b = SandboxedBinding(tools_folders=[tmp_path / "libs"], workspace=str(tmp_path / "ws"),
                         supervisor=supervisor, tenant=f"interrupt-{tmp_path.name}", timeout_s=60)
    yield b
    b.close()


def wait_for(path: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def in_thread(fn, *args, **kwargs):
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("result", fn(*args, **kwargs)), daemon=True)
    t.start()
    return t, box


def test_interrupt_stops_the_call_of_that_thread_and_keeps_the_worker(sleeper, tmp_path):
    pid = sleeper.execute_tool("tool_state")["output"]["pid"]
    marker = tmp_path / "marker"
    t, box = in_thread(sleeper.execute_tool, "tool_sleep", {"marker": str(marker)})
    wait_for(marker)
    queued, queued_box = in_thread(sleeper.execute_tool, "tool_state")
    assert sleeper.interrupt(queued.ident) is False          # still waiting for the worker: untouched
    assert sleeper.interrupt(threading.get_ident()) is False  # this thread runs no call
    assert sleeper.interrupt(t.ident) is True
    t.join(30)
    queued.join(30)
    r = box["result"]
    assert r["status_code"] == 499 and r["success"] is False, r
    assert "cancelled by the host" in r["error"] and "kept" in r["error"]
    assert queued_box["result"]["output"] == {"calls": 1, "interrupted": 1, "pid": pid}


def test_interrupt_while_the_tool_waits_for_the_host_lands_after_the_answer(sleeper, tmp_path):
    entered, release = threading.Event(), threading.Event()
    caller = {}

    def confirm(source, script_label, argv=None):
        caller["thread"] = threading.get_ident()             # handlers run on the calling thread
        entered.set()
        release.wait(30)
        return ("allow", "")

    sleeper.set_confirm_handler(confirm)
    marker = tmp_path / "marker2"
    t, box = in_thread(sleeper.execute_tool, "tool_sleep", {"marker": str(marker), "ask": True})
    assert entered.wait(30)
    assert sleeper.interrupt(caller["thread"]) is True        # the worker is waiting for this answer
    release.set()
    t.join(30)
    # Not dropped: raised once the answer is in (or in the sleep, when the signal, which
    # travels through the zygote, lands after the answer).
    assert box["result"]["status_code"] == 499, box["result"]
    assert sleeper.execute_tool("tool_state")["output"]["calls"] == 1          # same worker, state kept


SLOW_IMPORT = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    _base = Path(os.environ["SLOW_IMPORT_DIR"])
    (_base / "loading").write_text("yes")
    _deadline = time.monotonic() + 30
    while not (_base / "go").exists() and time.monotonic() < _deadline:   # until the test says so
        time.sleep(0.01)

    def tool_body(seconds: float = 30.0) -> dict:
        """Sleeps, then says it ran.

        Args:
            seconds (float): how long
        """
        time.sleep(seconds)
        return {"success": True, "output": "ran"}
''')


def test_interrupt_while_the_library_loads_stops_the_tool_before_it_runs(tmp_path, supervisor, monkeypatch):
    (tmp_path / "libs" / "slow").mkdir(parents=True)
    (tmp_path / "libs" / "slow" / "slow.py").write_text(SLOW_IMPORT)
    monkeypatch.setenv("SLOW_IMPORT_DIR", str(tmp_path))           # the workers get the host's environment
    with SandboxedBinding(tools_folders=[tmp_path / "libs"], workspace=str(tmp_path / "ws"),
                          supervisor=supervisor, tenant=f"slow-{tmp_path.name}") as b:
        t, box = in_thread(b.execute_tool, "tool_body")
        wait_for(tmp_path / "loading")
        assert b.interrupt(t.ident) is True
        (tmp_path / "go").write_text("go")
        t.join(30)
        # The signal came while the library loaded (not in a tool): kept, and raised as the
        # tool starts (a dropped one would let the tool sleep its 30 s and succeed).
        assert box["result"]["status_code"] == 499, box["result"]
        assert b.execute_tool("tool_body", {"seconds": 0})["output"] == "ran"   # the same worker goes on
