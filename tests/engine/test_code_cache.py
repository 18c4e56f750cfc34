"""The host compiles each library file once and sends the code in INIT (core/code_cache.py);
a worker runs it only while it is the file's (worker/library_code.py).

To tell which code a worker ran, the host is given code that differs from the file (the
file's tool says "file", the host's "host"): a worker that ignored the host's code, or ran
it for a file that changed, answers the other word.
"""
import marshal
import os
import py_compile
import subprocess
import sys
import textwrap
from importlib.util import MAGIC_NUMBER, cache_from_source

import pytest
from support.confined_kinds import KINDS, Confined

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox import protocol as P
from lcp_sandbox.backends.local.confine import confined
from lcp_sandbox.core import code_cache

FILE = textwrap.dedent('''
    def tool_which() -> dict:
        """Which code ran."""
        return {"code": "file"}
''')
HOST = 'def tool_which():\n    return {"code": "host"}\n'
ROOT = getattr(os, "geteuid", lambda: -1)() == 0


@pytest.fixture(autouse=True)
def _fresh_cache():
    code_cache.clear()
    yield
    code_cache.clear()


@pytest.fixture
def lib(open_tmp):
    folder = open_tmp / "libs"
    folder.mkdir()
    folder.chmod(0o755)
    path = folder / "which_code.py"
    path.write_text(FILE)
    path.chmod(0o644)
    return path


def host_code(path, source=HOST, magic=MAGIC_NUMBER, mtime_delta=0):
    st = os.stat(path)
    return P.Compiled(magic, st.st_mtime_ns + mtime_delta, st.st_size, st.st_ino,
                      marshal.dumps(compile(source, str(path), "exec")))


def which(folder, workspace, sup, tenant="t", **kw):
    b = SandboxedBinding(tools_folders=[str(folder)], workspace=str(workspace), supervisor=sup,
                         tenant=tenant, **kw)
    try:
        r = b.execute_tool("tool_which", {})
        assert r["status_code"] == 200, r
        return r["output"]["code"], b.stats()[0]["start"]
    finally:
        b.close()


def sends(monkeypatch, code):
    """The host compiles ``code`` for every file; returns the files it was asked for."""
    asked = []
    monkeypatch.setattr(confined, "compiled", lambda path: asked.append(path) or code)
    return asked


NO_TEMPLATE = {"which_code": {"sandbox": {"template": False}}}


# ---------------------------------------------------------------- the host's cache
def test_a_file_is_compiled_once_per_version(lib):
    first = code_cache.compiled(str(lib))
    assert first is not None and first.magic == MAGIC_NUMBER
    assert code_cache.compiled(str(lib)) is first
    ns = {}
    exec(marshal.loads(first.code), ns)
    assert ns["tool_which"]() == {"code": "file"}
    lib.write_text(FILE.replace('"file"', '"edited"'))
    second = code_cache.compiled(str(lib))
    assert second is not first and second.size == os.stat(lib).st_size
    exec(marshal.loads(second.code), ns)
    assert ns["tool_which"]() == {"code": "edited"}


@pytest.mark.parametrize("source", [b"def broken(:\n", b"x = 1\0\n", b"x = " + b"(" * 100_000 + b")" * 100_000,
                                    b"x = " + b"-" * 200_000 + b"1\n"],
                         ids=["syntax error", "NUL byte", "nested past the parser", "past the compiler's recursion"])
def test_nothing_is_sent_for_a_file_that_does_not_compile(lib, source):
    """(Nor does the host fail: the worker's own import says what is wrong.)"""
    lib.write_bytes(source)
    assert code_cache.compiled(str(lib)) is None


def test_nothing_is_sent_for_a_file_that_cannot_be_read(lib):
    assert code_cache.compiled(str(lib.parent / "missing.py")) is None


def test_nothing_is_sent_while_a_fresh_pyc_is_there(lib):
    pyc = cache_from_source(str(lib))
    py_compile.compile(str(lib), cfile=pyc, doraise=True,
                       invalidation_mode=py_compile.PycInvalidationMode.TIMESTAMP)
    assert code_cache.compiled(str(lib)) is None
    # A .pyc of another version of the file: the worker would compile, so the host does.
    st = os.stat(lib)
    os.utime(lib, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert code_cache.compiled(str(lib)) is not None


def test_the_cache_starts_again_past_its_cap(lib, monkeypatch):
    other = lib.parent / "other.py"
    other.write_text(FILE)
    a = code_cache.compiled(str(lib))
    monkeypatch.setattr(code_cache, "MAX_BYTES", len(a.code) + 1)
    b = code_cache.compiled(str(other))
    assert code_cache.compiled(str(other)) is b
    assert code_cache.compiled(str(lib)) is not a
    # and past its count of files
    monkeypatch.setattr(code_cache, "MAX_BYTES", 1 << 30)
    monkeypatch.setattr(code_cache, "MAX_ENTRIES", 1)
    c = code_cache.compiled(str(other))
    assert c is not b and code_cache.compiled(str(other)) is c


# ---------------------------------------------------------------- what a worker runs
def test_a_worker_runs_the_code_the_host_compiled(lib, open_tmp, monkeypatch):
    sends(monkeypatch, host_code(lib))
    with Supervisor() as sup:
        assert which(lib.parent, open_tmp, sup, host_tool_configs=NO_TEMPLATE)[0] == "host"


def test_a_worker_keeps_no_copy_of_the_code_it_ran(lib, open_tmp, monkeypatch):
    """(It would count in the worker's memory for its whole life.)"""
    sends(monkeypatch, host_code(lib, source=(
        "def tool_which():\n"
        "    from lcp_sandbox.worker.loop import ACTIVE\n"
        "    return {'code': [c is not None for c in ACTIVE[0].code]}\n")))
    with Supervisor() as sup:
        assert which(lib.parent, open_tmp, sup, host_tool_configs=NO_TEMPLATE)[0] == [False]


def test_the_real_cache_runs_the_file(lib, open_tmp):
    with Supervisor() as sup:
        assert which(lib.parent, open_tmp, sup, host_tool_configs=NO_TEMPLATE)[0] == "file"


@pytest.mark.parametrize("stale", [dict(mtime_delta=1), dict(magic=b"\0\0\r\n")],
                         ids=["file changed since", "another interpreter's bytecode"])
def test_code_that_is_not_the_files_is_not_run(lib, open_tmp, monkeypatch, stale):
    sends(monkeypatch, host_code(lib, **stale))
    with Supervisor() as sup:
        assert which(lib.parent, open_tmp, sup, host_tool_configs=NO_TEMPLATE)[0] == "file"


def test_the_host_compiles_no_file_it_does_not_trust_at_import(lib, open_tmp, monkeypatch):
    asked = sends(monkeypatch, host_code(lib))
    untrusted = {"which_code": {"sandbox": {"template": False, "trusted_import": False}}}
    with Supervisor() as sup:
        assert which(lib.parent, open_tmp, sup, host_tool_configs=untrusted)[0] == "file"
    assert asked == []


def test_the_host_compiles_no_file_beneath_tenants_root(lib, open_tmp, monkeypatch):
    """A tenant could have written it: its worker compiles it, under its own confinement."""
    if not ROOT:
        pytest.skip("tests/confinement run confined workers on every host kind; here, root's")
    asked = sends(monkeypatch, host_code(lib))
    root = open_tmp / "t1"
    root.mkdir()
    root.chmod(0o777)
    with Supervisor(confine=True, tenants_root=str(open_tmp)) as sup:
        code, start = which(lib.parent, root, sup, tenant="t1", workspace_root=str(root))
        # (the spawn path starts every confined worker fresh: no template to refuse)
        assert sup.start_method == "spawn" or "beneath tenants_root" in start
    assert code == "file"
    assert asked == []


def test_a_template_imports_the_code_the_host_compiled(lib, open_tmp, monkeypatch):
    sends(monkeypatch, host_code(lib))
    with Supervisor() as sup:
        if sup.start_method == "spawn":
            pytest.skip("fork-only (zygote path): the spawn path has no library templates")
        starts = [which(lib.parent, open_tmp, sup, tenant=t) for t in ("a", "b", "c")]
    assert [code for code, _ in starts] == ["host"] * 3
    assert "template" in [start for _, start in starts]


@pytest.mark.parametrize("kind", KINDS)
def test_a_confined_worker_runs_the_code_the_host_compiled(lib, open_tmp, monkeypatch, kind):
    """(The base serves libraries not trusted at import: their workers compile them.)"""
    if not ROOT:
        pytest.skip("tests/confinement run confined workers on every host kind; here, root's")
    sends(monkeypatch, host_code(lib))
    c = Confined(kind, open_tmp / "tenants")
    try:
        b = c.binding(lib.parent, "t1")
        r = b.execute_tool("tool_which", {})
        assert r["status_code"] == 200, r
        assert r["output"]["code"] == ("file" if kind == "base" else "host")
        c.check(b)
    finally:
        c.close()


@pytest.mark.skipif(os.name != "posix", reason="a file's mode does not keep its owner from reading it here")
def test_a_file_the_worker_cannot_read_is_not_run_from_the_hosts_code(lib):
    """run_file opens the file first: the host's code never runs what the worker could not
    import itself (here, as another uid, or with the file unreadable to its owner)."""
    lib.chmod(0o600)
    code = host_code(lib)
    child = textwrap.dedent(f'''
        import importlib.util, os, pickle, sys
        from lcp_sandbox.worker.library_code import run_file
        if os.geteuid() == 0:
            os.setgid(65534); os.setuid(65534)
        else:
            os.chmod({str(lib)!r}, 0)
        code = pickle.loads(sys.stdin.buffer.read())
        spec = importlib.util.spec_from_file_location("which_code", {str(lib)!r})
        mod = importlib.util.module_from_spec(spec)
        try:
            run_file(mod, spec.loader, {str(lib)!r}, [code], 0)
        except PermissionError:
            print("refused")
        else:
            print(mod.tool_which()["code"])
    ''')
    import pickle
    out = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(code),
                         capture_output=True, check=True)
    assert out.stdout.decode().strip() == "refused", out
