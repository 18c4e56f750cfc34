"""The host of tests/confinement/test_left_behind.py, run as a process of its own (under a
host kind's emulation: tests/support/without_landlock.py).

Tenant a's tool leaves what it can where its uid may write (leftover_libs/leaver); the host
removes tenant a (Supervisor.remove_tenant: its uid given back); tenant b, given the same
uid (a range of one), looks for it.  Prints one JSON line.

    python left_behind_host.py LIBS TENANTS_ROOT CONFIG_JSON
    CONFIG_JSON: {"first_uid": int, "key": int, "unswept": bool (the sweep switched off:
                  what b would find without it; a leaves no process then, which would
                  keep its uid from b), "come_back": bool (instead: a worker that makes
                  its temp dir again as it ends, once the host removed it; whether it is
                  there once its tenant's binding is closed)}
"""
import json
import os
import sys

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import sweep, tenant_uids

libs, base, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if config.get("unswept"):
    class _Unswept:
        """The sweep switched off: nothing is removed, nothing is looked for."""
        @staticmethod
        def sweep(uid, keep=()):
            return sweep.Left()
    tenant_uids.sweeping = _Unswept
IPC = ["shmget", "shmctl", "semget", "semctl", "msgget", "msgctl"]
CONFIG = {"leaver": {"sandbox": {"syscalls": {"allow": IPC}}}}
sup = Supervisor(confine=True, tenants_root=base, uid_range=(config["first_uid"], 1))


def tenant(name: str) -> SandboxedBinding:
    root = os.path.join(base, name)
    os.makedirs(root, exist_ok=True)
    return SandboxedBinding(tools_folders=[libs], tenant=name, workspace=root,
                            workspace_root=root, supervisor=sup, host_tool_configs=CONFIG)


out = {}
if config.get("come_back"):
    c = tenant("c")
    out["come_back"] = c.execute_tool("tool_come_back")
    c.close()
    out["came_back"] = os.path.lexists(out["come_back"]["output"])
    sup.remove_tenant("c", os.path.join(base, "c"))
    sup.close()
    print(json.dumps(out, default=str))
    sys.exit(0)
a = tenant("a")
out["left"] = a.execute_tool("tool_leave", {"key": config["key"],
                                            "process": not config.get("unswept")})
out["a_stats"] = sup.stats(tenant="a")
a.close()
out["released"] = sup.remove_tenant("a", os.path.join(base, "a"))
b = tenant("b")
port = (out["left"].get("output") or {}).get("port", 0)
out["found"] = b.execute_tool("tool_find", {"key": config["key"], "port": port})
out["b_stats"] = sup.stats(tenant="b")
out["record"] = sup.pool_stats()["uid_record"]
b.close()
sup.remove_tenant("b", os.path.join(base, "b"))
sup.close()
print(json.dumps(out, default=str))
