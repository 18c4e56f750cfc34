import os
import shutil
import sys
import tempfile
from pathlib import Path

import psutil
import pytest

# tests/ holds conftest.py, the test files grouped by area (core, engine, confinement,
# network, settings, fronts, project), the libraries and corpora they run (fixtures/) and
# the helpers they share (support/, imported as the package ``support``).
HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
SUPPORT = HERE / "support"
LIBS = FIXTURES / "libs"
REPO = HERE.parent
sys.path.insert(0, str(HERE))


# The machine's record of tenants' uids (backends/local/confine/uid_record.py): a test run's
# own, which its subprocesses inherit, so that no test writes the real one; removed at exit.
if not os.environ.get("LCP_SANDBOX_UIDS_DIR"):
    os.environ["LCP_SANDBOX_UIDS_DIR"] = tempfile.mkdtemp(prefix="lcp-test-uids-")
    import atexit
    atexit.register(shutil.rmtree, os.environ["LCP_SANDBOX_UIDS_DIR"], True)

# The forced spawn run (.ci/run): LCP_SANDBOX_START_METHOD=spawn makes every Supervisor()
# start its workers as fresh interpreters.  A test of a fork-only feature says so.
SPAWN = os.environ.get("LCP_SANDBOX_START_METHOD") == "spawn"


def fork_only(feature: str):
    """Skip under the forced spawn run: the test is about ``feature``, fork-only."""
    return pytest.mark.skipif(SPAWN, reason=f"fork-only (zygote path): {feature}")


# Processes of the session's Ray cluster (see ray_cluster): they and what they start are
# Ray's, not leftovers of a test, and they start and stop processes on their own schedule.
_RAY_ROOTS: set = set()


def _ray_processes() -> set:
    out = set()
    for pid in _RAY_ROOTS:
        try:
            root = psutil.Process(pid)
            out.add(pid)
            out.update(p.pid for p in root.children(recursive=True))
        except psutil.Error:
            pass
    return out


def running(proc: psutil.Process) -> bool:
    """Whether ``proc`` still runs: a process may exit between listing it and asking its
    status, and then counts as not running rather than raising."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def descendants() -> set:
    """Pids of the live (non-zombie) descendants of the test process (the Ray cluster's excluded)."""
    out = {p.pid for p in psutil.Process().children(recursive=True) if running(p)}
    return out - _ray_processes() if _RAY_ROOTS else out


def gone(pid: int) -> bool:
    """The process no longer runs: it does not exist, or is a zombie all of whose threads
    have exited (a killed process's leader turns zombie while its other threads still
    exit, and its descriptors close only with the last of them)."""
    try:
        proc = psutil.Process(pid)
        return proc.status() == psutil.STATUS_ZOMBIE and proc.num_threads() <= 1
    except psutil.NoSuchProcess:
        return True


def poll(cond, timeout: float = 30.0) -> bool:
    """Wait for ``cond()`` (polled) within a generous timeout; whether it came true."""
    import time
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_gone(pid: int, timeout: float = 20.0) -> bool:
    """Whether the process is gone (or a zombie) within ``timeout``; polls /proc."""
    return poll(lambda: gone(pid), timeout)


def spinning(pid: int, window: float = 0.3) -> bool:
    """Whether the process burns CPU (the host's view: its CPU time over ``window``)."""
    import threading
    proc = psutil.Process(pid)
    before = sum(proc.cpu_times()[:2])
    threading.Event().wait(window)
    return sum(proc.cpu_times()[:2]) - before > window / 4


def stop_server(proc, grace_s: float = 30.0) -> None:
    """SIGTERM a server process, SIGKILL it if it is still there after ``grace_s``."""
    import subprocess
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def new_processes():
    """Returns the descendants started since the test began (others' leftovers excluded)."""
    before = descendants()
    return lambda: descendants() - before


@pytest.fixture(scope="module")
def supervisor():
    """One Supervisor for a test module (its workers are shared by the module's bindings)."""
    from lcp_sandbox import Supervisor
    sup = Supervisor()
    yield sup
    sup.close()


@pytest.fixture(autouse=True)
def _forget_inprocess_modules():
    """Upstream LCPBinding caches tool modules in sys.modules: none may leak between tests."""
    yield
    for name in [n for n in sys.modules if n.startswith("lollms_client.tools_bindings.lcp.persistent_")]:
        del sys.modules[name]


def _open_tmp():
    path = Path(os.path.realpath(tempfile.mkdtemp(prefix="lcp-test-")))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def open_tmp_module():
    """open_tmp, for a whole test module."""
    yield from _open_tmp()


@pytest.fixture
def open_tmp():
    """A fresh temp dir that any user may traverse (not list), removed after the test.

    pytest's tmp_path lies under 0700 folders; a confined worker of a root host runs as
    an unprivileged uid (65534 by default) and could not reach a workspace there."""
    yield from _open_tmp()


@pytest.fixture
def libs(tmp_path) -> Path:
    """A private copy of tests/fixtures/libs (tests may write markers next to modules)."""
    dst = tmp_path / "libs"
    shutil.copytree(LIBS, dst, ignore=shutil.ignore_patterns("__pycache__", "*.imported"))
    return dst


@pytest.fixture
def make_binding(libs, tmp_path):
    """Build SandboxedBindings over the test libraries; all are closed after the test."""
    from lcp_sandbox import SandboxedBinding
    made = []

    def make(**kw):
        kw.setdefault("tools_folders", [libs])
        kw.setdefault("workspace", str(tmp_path))
        b = SandboxedBinding(**kw)
        made.append(b)
        return b

    yield make
    for b in made:
        b.close()


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster for the session: a head and one more node, one CPU each, every
    process on this machine (Ray picks the node address).  Shut down at the session's end."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    from ray.cluster_utils import Cluster
    before = {p.pid for p in psutil.Process().children()}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    _RAY_ROOTS.update({p.pid for p in psutil.Process().children()} - before)
    ray.init(address=cluster.address)
    _RAY_ROOTS.update({p.pid for p in psutil.Process().children()} - before)
    yield cluster
    ray.shutdown()
    cluster.shutdown()
    _RAY_ROOTS.clear()


def pytest_sessionfinish(session):
    left = descendants()
    if left:
        print("\nLEFTOVER", [(p, psutil.Process(p).cmdline()[:4]) for p in left])
