"""What makes a cold start cheap is in place: the worker's own account of the state it
was handed (its first session rehearsed by its spare, the zygote's pre-imports frozen
and its code already specialized) and the zygote's reserve of spares.  No timings."""
import os
import sys
import time

import psutil
import pytest
from conftest import running

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local import zygote_client
from lcp_sandbox.worker import confine, zygote

PROBE = '''
import gc, os, sys

_FROZEN = gc.get_freeze_count()
_TRACKED = {id(o) for o in gc.get_objects()}
# what this library's import found not imported yet, of the modules imported ahead
_NOT_AHEAD = [m for m in sys.modules["lcp_sandbox.worker.ahead"].AHEAD if m not in sys.modules]


def tool_probe() -> dict:
    """What this worker was handed."""
    loop = sys.modules["lcp_sandbox.worker.loop"]
    code = loop.session.__code__
    return {"success": True, "output": {
        "pid": os.getpid(),
        "rehearsed": list(loop.REHEARSED),
        "frozen": _FROZEN,
        # modules the zygote imported before gc.freeze() are in no collected generation
        "thawed_modules": [m for m in ("lcp_sandbox.worker.template", "lcp_sandbox.worker.rehearsal",
                                       "lcp_sandbox.worker.loop")
                           if id(sys.modules[m].__dict__) in _TRACKED],
        "specialized": (code._co_code_adaptive != code.co_code) if hasattr(code, "_co_code_adaptive") else None,
        "rehearsal_module_left": any(n.endswith("lcp_sandbox_rehearsal") for n in sys.modules),
        "not_ahead": _NOT_AHEAD,
    }}
'''


@pytest.fixture
def probe(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "cold_probe.py").write_text(PROBE)
    with Supervisor() as sup:
        def run(tenant: str, template: bool = False) -> dict:
            b = SandboxedBinding(tools_folders=[str(lib)], workspace=str(tmp_path), supervisor=sup, tenant=tenant,
                                 host_tool_configs={"cold_probe": {"sandbox": {"template": template}}})
            try:
                r = b.execute_tool("tool_probe", {})
                assert r["success"] is True, r
                return r["output"]
            finally:
                b.close()
        run.sup = sup
        yield run


def test_a_plain_worker_was_rehearsed_and_starts_from_frozen_specialized_memory(probe):
    out = probe("t1")
    assert out["rehearsed"] == ["session", "lcp_sandbox_rehearsal.py"]   # its spare ran a whole session
    assert not out["rehearsal_module_left"]                              # and left nothing of it
    assert out["frozen"] > 0                                             # the zygote's gc.freeze()
    assert out["thawed_modules"] == []                                   # imported before the fork
    assert out["not_ahead"] == []                   # the modules libraries commonly import, too
    if out["specialized"] is None:
        pytest.skip("this Python does not expose specialized bytecode")
    assert out["specialized"] is True                                    # the zygote's own rehearsals


def test_a_template_worker_was_rehearsed_too(probe):
    probe("t1", template=True)                      # the library's first worker: from the zygote
    out = probe("t2", template=True)                # the second one's start makes the template
    assert out["rehearsed"] == ["session", "lcp_sandbox_rehearsal.py"]
    assert not out["rehearsal_module_left"]
    assert out["not_ahead"] == []


def test_spares_and_a_worker_forked_ahead_are_waiting(probe):
    """After a cold start (its worker retired), the zygote refills its spares and the
    host its worker forked ahead: a burst of cold starts forks nothing."""
    probe("t1")
    zyg = probe.sup._zygote
    zygote_process = psutil.Process(zyg.pid)

    def waiting() -> int:
        return sum(1 for p in zygote_process.children() if running(p))
    deadline = time.monotonic() + 30
    while waiting() != zygote.PLAIN_SPARES + zygote_client.RESERVED or len(zyg._reserved) != zygote_client.RESERVED:
        assert time.monotonic() < deadline, "the zygote's spares or the host's reserved worker were not refilled"
        time.sleep(0.01)
    assert zygote.PLAIN_SPARES >= 2 and zygote_client.RESERVED >= 1
    reserved_pid = zyg._reserved[0][2].result(10)
    assert probe("t2")["pid"] == reserved_pid       # the next cold start is served by it


def test_set_environment_makes_the_environment_exactly_the_given_one(monkeypatch):
    monkeypatch.setenv("LCP_TEST_KEEP", "same")
    monkeypatch.setenv("LCP_TEST_CHANGE", "old")
    monkeypatch.setenv("LCP_TEST_DROP", "x")
    want = {**os.environ, "LCP_TEST_CHANGE": "new", "LCP_TEST_ADD": "a"}
    del want["LCP_TEST_DROP"]
    try:
        confine.set_environment(want)
        assert dict(os.environ) == want
        assert os.getenv("LCP_TEST_CHANGE") == "new" and os.getenv("LCP_TEST_DROP") is None
    finally:
        os.environ.pop("LCP_TEST_ADD", None)


if sys.platform != "linux":                        # (the engine's workers are Linux-only)
    pytestmark = pytest.mark.skip("Linux only")


def test_a_zygote_whose_host_is_gone_ends_quietly_when_it_has_something_to_tell():
    """The host closed its end (a supervisor closing) while the zygote was answering a
    FORK: the zygote ends as on EOF (its workers die with it), with no traceback."""
    from lcp_sandbox.worker.zygote import Zygote

    class Gone:
        def send(self, data: bytes) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    ended = []
    zygote = Zygote.__new__(Zygote)
    zygote.ctl = Gone()
    zygote.exit = lambda: ended.append(True)
    zygote.tell(b"record")
    assert ended == [True]
