"""The host of tests/test_host_kinds.py, run as a process of its own under one host kind.

Two confined tenants of one Supervisor; tenant a's tool attacks tenant b and the host
process.  With "templates", both tenants' workers are first started once, so that the
attacker is forked from the library's confined template when the host kind allows one.
Prints one JSON line: what each call answered and what stats() said.

    python host_kind_attack.py LIBS TENANTS_ROOT CONFIG_JSON
    CONFIG_JSON: {"confine": true | "best-effort", "templates": bool, "abi": 0 | 1..5}
"""
import json
import os
import sys
import time

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import landlock_abi_at_most

libs, base, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
a, b = os.path.join(base, "a"), os.path.join(base, "b")
for d in (a, b):
    os.makedirs(d, exist_ok=True)
with open(os.path.join(b, "secret.txt"), "w") as f:
    f.write("b's secret")
sup = Supervisor(confine=config.get("confine", True),
                 tenants_root=base if config.get("templates") else None)
capped = landlock_abi_at_most(sup, config["abi"]) if config.get("abi") else None
if capped is not None:
    capped.__enter__()                     # (for the whole run)
ta, tb = (SandboxedBinding(tools_folders=[libs], tenant=t, workspace=r, workspace_root=r,
                           supervisor=sup) for t, r in (("a", a), ("b", b)))
out = {}
if config.get("templates"):                # the templates their first workers owe, made
    ta.execute_tool("tool_count"), tb.execute_tool("tool_count")
    deadline = time.monotonic() + 60
    while any(t["state"] == "starting" for t in sup.pool_stats()["templates"]):
        assert time.monotonic() < deadline, sup.pool_stats()["templates"]
        time.sleep(0.02)
    ta.restart_library("attacker"), tb.restart_library("attacker")
    out["templates"] = [t["state"] for t in sup.pool_stats()["templates"]]
out["b_first"] = tb.execute_tool("tool_count")
b_pid = (sup.stats(tenant="b") or [{}])[0].get("pid")
out["attack"] = ta.execute_tool("tool_attack", {"other_root": b, "other_pid": b_pid or 1,
                                                "host_pid": os.getpid()})
if config.get("confine", True) is True:
    out["kill"] = ta.execute_tool("tool_kill_everyone")
# (best effort, where nothing may scope it, kill(-1) would reach every process of the
# workers' uid on the machine, another run's included: not tried)
out["b_again"] = tb.execute_tool("tool_count")
out["b_same_worker"] = bool(b_pid) and sup.stats(tenant="b")[0]["pid"] == b_pid
out["a_stats"] = sup.stats(tenant="a")
out["planted"] = os.path.exists(os.path.join(b, "planted.txt"))
sup.close()
print(json.dumps(out, default=str))
