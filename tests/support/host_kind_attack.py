"""The host of tests/confinement/test_host_kinds.py, run as a process of its own under one host kind.

Two confined tenants of one Supervisor per network setting ("on", "off", "policy": tenants
a-on and b-on, a-off and b-off...); tenant a's tool attacks tenant b and the host process,
whose endpoints (TCP and UDP on loopback, an abstract and a pathname unix socket) it tries
to reach.  With "templates", both tenants' workers are first started once, so that the
attacker is forked from the library's confined template when the host kind allows one.
Prints one JSON line: for each network setting, what each call answered and what stats()
said.

    python host_kind_attack.py LIBS TENANTS_ROOT CONFIG_JSON
    CONFIG_JSON: {"confine": true | "best-effort", "templates": bool, "abi": 0 | 1..5,
                  "networks": ["on", "off", "policy"] (default ["on"]),
                  "tenants_root": bool (default: as "templates"),
                  "fresh": bool (the library's "template": false: every worker starts fresh),
                  "unused_folder_mode": a mode: a tenant's folder with a secret the host made
                  with it, no worker of its tenant yet}
"""
import json
import os
import socket
import sys
import tempfile
import time

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import landlock_abi_at_most

NETWORKS = {"on": True, "off": False, "policy": {"allow": ["example.com"]}}

libs, base, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sup = Supervisor(confine=config.get("confine", True),
                 tenants_root=base if config.get("tenants_root", config.get("templates"))
                 else None)
capped = landlock_abi_at_most(sup, config["abi"]) if config.get("abi") else None
if capped is not None:
    capped.__enter__()                     # (for the whole run)


def endpoints() -> tuple[dict, list]:
    """The host's own endpoints a tenant must not reach with the network off."""
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.setblocking(False)
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"lcp-host-kind-host-{os.getpid()}"
    abstract.bind("\0" + name)
    abstract.listen(8)
    # (where every uid may reach it: only the worker's confinement may stop a connect)
    folder = tempfile.mkdtemp(prefix="lcp-host-kind-")
    os.chmod(folder, 0o755)
    path = os.path.join(folder, "host.sock")
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(path)
    os.chmod(path, 0o777)
    unix.listen(8)
    return ({"tcp": tcp.getsockname()[1], "udp": udp.getsockname()[1], "abstract": name,
             "unix": path}, [tcp, udp, abstract, unix])


def received(udp: socket.socket) -> bool:
    try:
        return bool(udp.recv(64))
    except BlockingIOError:
        return False


def attack(network: str, host: dict) -> dict:
    """Tenants a-NETWORK and b-NETWORK; a attacks."""
    a, b = os.path.join(base, f"a-{network}"), os.path.join(base, f"b-{network}")
    for d in (a, b):
        os.makedirs(d, exist_ok=True)
        os.chmod(d, 0o700)
    with open(os.path.join(b, "secret.txt"), "w") as f:
        f.write("b's secret")
    sandbox = {"network": NETWORKS[network], **({"template": False} if config.get("fresh") else {})}
    cfg = {"attacker": {"sandbox": sandbox}}
    ta, tb = (SandboxedBinding(tools_folders=[libs], tenant=f"{t}-{network}", workspace=r,
                               workspace_root=r, supervisor=sup, host_tool_configs=cfg)
              for t, r in (("a", a), ("b", b)))
    out = {}
    if config.get("templates"):            # the templates their first workers owe, made
        ta.execute_tool("tool_count"), tb.execute_tool("tool_count")
        deadline = time.monotonic() + 60
        while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
            assert time.monotonic() < deadline, sup.pool_stats()["templates"]
            time.sleep(0.02)
        ta.restart_library("attacker"), tb.restart_library("attacker")
        out["templates"] = [t["state"] for t in sup.pool_stats()["templates"]]
    out["b_first"] = tb.execute_tool("tool_count")
    b_pid = (sup.stats(tenant=f"b-{network}") or [{}])[0].get("pid")
    listening = tb.execute_tool("tool_listen_abstract").get("output") or {}
    out["attack"] = ta.execute_tool("tool_attack", {
        "other_root": b, "other_pid": b_pid or 1, "host_pid": os.getpid(), "host": host,
        "other_abstract": listening.get("name", "") if isinstance(listening, dict) else ""})
    out["name_processes"] = ta.execute_tool("tool_name_processes", {
        "other_pid": b_pid or 1, "host_pid": os.getpid(), "host_pgid": os.getpgid(0)})
    if config.get("confine", True) is True:
        out["kill"] = ta.execute_tool("tool_kill_everyone")
    # (best effort, where nothing may scope it, kill(-1) would reach every process of the
    # workers' uid on the machine, another run's included: not tried)
    out["b_again"] = tb.execute_tool("tool_count")
    out["b_same_worker"] = bool(b_pid) and sup.stats(tenant=f"b-{network}")[0]["pid"] == b_pid
    out["a_stats"] = sup.stats(tenant=f"a-{network}")
    out["b_stats"] = sup.stats(tenant=f"b-{network}")
    out["planted"] = os.path.exists(os.path.join(b, "planted.txt"))
    out["new_tenant"] = new_tenant(network, cfg)
    return out


def new_tenant(network: str, cfg: dict) -> dict:
    """A third tenant's first call, once the others' templates are made: how it started."""
    root = os.path.join(base, f"c-{network}")
    os.makedirs(root, exist_ok=True)
    os.chmod(root, 0o700)
    tc = SandboxedBinding(tools_folders=[libs], tenant=f"c-{network}", workspace=root,
                          workspace_root=root, supervisor=sup, host_tool_configs=cfg)
    first = tc.execute_tool("tool_count")
    got = sup.stats(tenant=f"c-{network}")
    return {"first": first, "start": got[0]["start"] if got else None}


host, keep = endpoints()
if config.get("unused_folder_mode"):
    unused = os.path.join(base, "unused")
    os.makedirs(unused)
    os.chmod(unused, config["unused_folder_mode"])
    with open(os.path.join(unused, "secret.txt"), "w") as f:
        f.write("an unused tenant's secret")
out = {}
for network in config.get("networks", ["on"]):
    out[network] = attack(network, host)
    out[network]["udp_received"] = received(keep[1])
sup.close()
os.unlink(host["unix"])
os.rmdir(os.path.dirname(host["unix"]))
print(json.dumps(out, default=str))
