"""A host with a network policy library, run by tests/network/test_egress_containers.py inside an
emulated default container (no network namespace can be made there).

    python egress_by_port_host.py LIBS WORK ABI

ABI: 0 for the kernel's Landlock, else the most the engine may use.  Two servers on the
host's loopback stand for the outside: tenant a is allowed the first, tenant b the second.
Prints one JSON line: what each call answered, what the servers saw, what stats() said.
"""
import contextlib
import http.server
import json
import os
import sys
import threading

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.testing import landlock_abi_at_most


class Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self):               # noqa: N802 (the base class's name)
        self.server.seen.append(self.path)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


def serve() -> http.server.ThreadingHTTPServer:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.seen = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


libs, work, abi = sys.argv[1], sys.argv[2], int(sys.argv[3])
allowed, other = serve(), serve()
ports = {"allowed": allowed.server_address[1], "other": other.server_address[1]}
sup = Supervisor(confine=True)
out: dict = {}
with landlock_abi_at_most(sup, abi) if abi else contextlib.nullcontext():
    tenants = {}
    for tenant, server in (("a", "allowed"), ("b", "other")):
        ws = os.path.join(work, tenant)
        os.makedirs(ws, exist_ok=True)
        rules = {"allow": [f"127.0.0.1:{ports[server]}"]}
        tenants[tenant] = SandboxedBinding(
            tools_folders=[libs], supervisor=sup, tenant=tenant, workspace=ws,
            workspace_root=ws, host_tool_configs={"netprobe": {"sandbox": {"network": rules}}})
    a, b = tenants["a"], tenants["b"]
    url = "http://127.0.0.1:{}/{}".format
    out["reach"] = a.execute_tool("tool_urllib", {"url": url(ports["allowed"], "reach")})
    out["other"] = a.execute_tool("tool_urllib", {"url": url(ports["other"], "other")})
    out["sockets"] = a.execute_tool("tool_sockets", {"host": "127.0.0.1", "port": ports["other"]})
    env = a.execute_tool("tool_env", {})["output"]
    proxy = int(env["HTTP_PROXY"].rsplit(":", 1)[1]) if isinstance(env, dict) else 0
    out["far"] = a.execute_tool("tool_far", {"address": "192.0.2.1", "port": proxy or 1})
    out["b_to_allowed"] = b.execute_tool("tool_urllib", {"url": url(ports["allowed"], "b")})
    out["stats"] = sup.stats(tenant="a")
out["seen"] = {"allowed": allowed.seen, "other": other.seen}
sup.close()
print(json.dumps(out))
