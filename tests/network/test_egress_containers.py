"""A network policy in the default containers (emulated as tests/confinement/test_host_kinds.py does:
Docker's profile and capabilities as root; Kubernetes restricted: a non-root uid, no
capability, no_new_privs): no network namespace can be made, so a policy worker reaches the
host's egress proxy by port (Landlock's TCP rules, ABI 4+), or answers 503 naming both."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import FIXTURES, SUPPORT
from test_host_kinds import UNPRIVILEGED, WITHOUT_LANDLOCK, _emulated, user_python  # noqa: F401

LIBS = FIXTURES / "egress_libs"
HOST = SUPPORT / "egress_by_port_host.py"
REFUSED = "PermissionError EACCES"


def python(request, kind: str) -> str:
    """The host's Python in the container ``kind``: the restricted one's uid may run it."""
    return request.getfixturevalue("user_python") if kind == "restricted" else sys.executable


def run(kind: str, tmp, python: str, abi: int) -> dict:
    """The host script in the container ``kind`` ("docker" or "restricted") at most at
    Landlock ABI ``abi`` (0: the kernel's): what it printed."""
    work = tmp / f"{kind}-{abi}"
    work.mkdir(mode=0o755)
    shutil.copytree(LIBS, work / "libs")
    shutil.copy(HOST, work / "host.py")
    shutil.copy(WITHOUT_LANDLOCK, work / "without_landlock.py")
    cmd = [python, str(work / "host.py"), str(work / "libs"), str(work / "tenants"), str(abi)]
    cmd = _emulated(f"{kind}_abi", cmd, python, work / "without_landlock.py")
    if kind == "restricted":
        subprocess.run(["chown", "-R", f"{UNPRIVILEGED}:{UNPRIVILEGED}", str(work)], check=True)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=work,
                          env={**os.environ, "HOME": str(work)})
    assert done.returncode == 0, (kind, done.returncode, done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["docker", "restricted"])
def test_a_policy_worker_reaches_the_allowed_server_by_port_and_nothing_else(
        open_tmp, request, kind):
    got = run(kind, open_tmp, python(request, kind), 0)
    assert got["reach"]["output"] == {"status": 200, "body": "ok"}, got["reach"]
    assert got["other"]["output"]["status"] == 403, got["other"]
    assert got["b_to_allowed"]["output"]["status"] == 403, got["b_to_allowed"]
    assert got["sockets"]["output"] == {
        "tcp": REFUSED, "tcp_fastopen": REFUSED, "tcp6": REFUSED, "udp": REFUSED,
        "raw": REFUSED, "packet": REFUSED,
        "unix": REFUSED, "unix_dgram_pair": REFUSED, "listen": "PermissionError EPERM",
        "bind": REFUSED}, got["sockets"]
    assert got["far"]["output"] == "OSError EINVAL", got["far"]
    assert got["seen"] == {"allowed": ["/reach"], "other": []}
    network = got["stats"][0]["protections"]["network"]
    # (the host's probe found it cannot make one: it sent the worker by port)
    assert network.startswith("policy (1 rules: no network namespace of its own (not made "
                              "(the host cannot make one for its workers: unshare: Operation "
                              "not permitted)); Landlock ABI 7's TCP rules"), network


@pytest.mark.parametrize("kind", ["docker", "restricted"])
def test_below_landlock_abi_4_a_policy_is_refused_naming_both(open_tmp, request, kind):
    got = run(kind, open_tmp, python(request, kind), 3)
    for call in ("reach", "sockets", "b_to_allowed"):
        assert got[call]["status_code"] == 503, got[call]
        error = got[call]["error"]
        assert "a network policy needs a network namespace of its own, or Landlock ABI 4's " \
               "TCP rules" in error, error
        assert "unshare: Operation not permitted" in error, error
        assert "Landlock ABI 3, whose rules have no TCP ports" in error, error
    assert got["seen"] == {"allowed": [], "other": []}
