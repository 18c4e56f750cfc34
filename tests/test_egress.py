"""Network by policy: a confined worker reaches the hosts its library is allowed, through the
host's egress proxy, and nothing else.  Servers on the host's loopback stand for the outside."""
from __future__ import annotations

import http.server
import logging
import threading
import time

import pytest
from conftest import HERE, poll

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local import egress
from lcp_sandbox.core.egress_rules import policy_of

LIBS = HERE / "egress_libs"          # (CI runs these on the spawn start path too)


class Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self):               # noqa: N802 (the base class's name)
        self.server.seen.append(self.path)
        body = f"{self.server.name} {self.path}".encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def servers():
    """Two servers on the host's loopback: "allowed" and "other" (each records its requests)."""
    made = {}
    for name in ("allowed", "other"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        server.name, server.seen = name, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made[name] = server
    yield {name: s.server_address[1] for name, s in made.items()}, made
    for server in made.values():
        server.shutdown()
        server.server_close()


@pytest.fixture(scope="module")
def sup():
    with Supervisor(confine=True) as s:
        yield s


def binding(sup, root, tenant: str, network) -> SandboxedBinding:
    ws = root / tenant
    ws.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=tenant,
                            workspace=str(ws), workspace_root=str(ws),
                            host_tool_configs={"netprobe": {"sandbox": {"network": network}}})


def out(t: SandboxedBinding, tool: str, **params):
    got = t.execute_tool(tool, params)
    assert got["success"], got
    return got["output"]


@pytest.fixture(scope="module")
def one_port(sup, servers, open_tmp_module):
    """A library allowed the "allowed" server's port only."""
    ports, _ = servers
    return binding(sup, open_tmp_module, "one-port", {"allow": [f"127.0.0.1:{ports['allowed']}"]})


def test_clients_reach_the_allowed_port_and_nothing_else(one_port, servers, sup):
    ports, made = servers
    allowed, other = (f"http://127.0.0.1:{ports[n]}" for n in ("allowed", "other"))
    env = out(one_port, "tool_env")
    assert env["HTTP_PROXY"].startswith("http://127.0.0.1:") and env["NO_PROXY"] == ""
    assert out(one_port, "tool_urllib", url=allowed + "/u") == {"status": 200,
                                                                "body": "allowed /u"}
    assert out(one_port, "tool_requests", url=allowed + "/r") == {"status": 200,
                                                                  "body": "allowed /r"}
    assert out(one_port, "tool_httpx", url=allowed + "/h") == {"status": 200,
                                                              "body": "allowed /h"}
    assert out(one_port, "tool_tunnel", host="127.0.0.1", port=ports["allowed"]) == {
        "status": 200, "body": "allowed /tunnel"}
    for tool in ("tool_urllib", "tool_requests", "tool_httpx"):
        refused = out(one_port, tool, url=other + "/x")
        assert refused["status"] == 403 and f"no allow rule matches 127.0.0.1:{ports['other']}" \
            in refused["body"]
    tunnel = out(one_port, "tool_tunnel", host="127.0.0.1", port=ports["other"])
    assert tunnel["status"] is None and "403" in tunnel["body"]
    for port in ports.values():             # past the proxy: its namespace has no way out
        assert out(one_port, "tool_raw", host="127.0.0.1", port=port) == "ConnectionRefusedError"
    assert out(one_port, "tool_unix", path=sup.egress.path) == "PermissionError"
    assert made["other"].seen == []
    assert made["allowed"].seen == ["/u", "/r", "/h", "/tunnel"]
    prot = sup.stats(tenant="one-port")[0]["protections"]
    assert prot["network"].startswith("policy (1 rules: own network namespace")
    assert prot["unix_sockets"].startswith("blocked")


def test_the_metadata_address_is_refused_at_once(one_port):
    started = time.monotonic()
    got = out(one_port, "tool_urllib", url="http://169.254.169.254/latest/meta-data/")
    assert got["status"] == 403 and "no allow rule matches 169.254.169.254:80" in got["body"]
    assert time.monotonic() - started < 10               # a refusal, not a connect timeout


def test_a_library_allowed_one_public_name_cannot_reach_the_hosts_loopback(sup, servers,
                                                                           open_tmp_module):
    ports, made = servers
    t = binding(sup, open_tmp_module, "example-only", {"allow": ["example.com:443"]})
    seen = list(made["allowed"].seen)
    got = out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/loop")
    assert got["status"] == 403
    assert out(t, "tool_tunnel", host="localhost", port=ports["allowed"])["status"] is None
    assert made["allowed"].seen == seen


def test_a_name_no_rule_admits_is_never_resolved(sup, open_tmp_module, monkeypatch):
    """A tool cannot make the host look up names of its choosing (DNS as a way out)."""
    asked = []
    resolve = egress._resolve

    def recorded(host, port):
        asked.append(host)
        return resolve(host, port)
    monkeypatch.setattr(egress, "_resolve", recorded)
    t = binding(sup, open_tmp_module, "no-lookups", {"allow": ["localhost:9"]})
    got = out(t, "tool_urllib", url="http://secret-data.exfil.invalid/")
    assert got["status"] == 403 and "no allow rule matches secret-data.exfil.invalid:80" \
        in got["body"]
    assert out(t, "tool_urllib", url="http://localhost:9/")["status"] == 403   # (loopback)
    assert asked == ["localhost"]


def test_a_name_resolving_to_loopback_needs_the_address_listed_per_tenant(sup, servers,
                                                                          open_tmp_module):
    """Two tenants of one supervisor, two policies: each is held to its own."""
    ports, _ = servers
    port = ports["allowed"]
    by_name = binding(sup, open_tmp_module, "by-name", {"allow": [f"localhost:{port}"]})
    listed = binding(sup, open_tmp_module, "listed",
                     {"allow": [f"localhost:{port}", f"127.0.0.1:{port}"]})
    refused = out(by_name, "tool_urllib", url=f"http://localhost:{port}/n")
    assert refused["status"] == 403
    assert "resolves to 127.0.0.1, a loopback address that no allow rule lists" in refused["body"]
    assert out(listed, "tool_urllib", url=f"http://localhost:{port}/n")["status"] == 200


def test_deny_comes_first(sup, servers, open_tmp_module):
    ports, _ = servers
    t = binding(sup, open_tmp_module, "denied", {"allow": ["127.0.0.0/8"],
                                                 "deny": [f"127.0.0.1:{ports['other']}"]})
    assert out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/")["status"] == 200
    got = out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['other']}/")
    assert got["status"] == 403 and "denied by the rule" in got["body"]


def test_a_flood_is_bounded_per_worker_and_others_still_get_through(sup, servers, one_port,
                                                                    open_tmp_module):
    ports, _ = servers
    flood = binding(sup, open_tmp_module, "flood", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    release = open_tmp_module / "flood" / "release"
    n = egress.MAX_PER_WORKER + 40
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=flood.execute_tool(
        "tool_flood", {"n": n, "refusals": 40, "release": str(release)}, timeout_s=120)))
    worker.start()
    try:
        assert poll(lambda: sup.egress.connections >= egress.MAX_PER_WORKER)
        assert out(one_port, "tool_urllib",
                   url=f"http://127.0.0.1:{ports['allowed']}/during")["status"] == 200
    finally:
        release.touch()
        worker.join(90)
    assert result["out"]["output"] == 40, result      # each beyond its share: 429 at once
    assert poll(lambda: sup.egress.connections == 0)


def test_a_worker_that_sends_garbage_leaves_the_proxy_serving(sup, servers, open_tmp_module):
    ports, _ = servers
    t = binding(sup, open_tmp_module, "garbage", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    got = out(t, "tool_garbage")
    assert got == {"answer": "HTTP/1.1 400 Bad Request", "dialers": 1}
    assert out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/after")["status"] == 200
    other = binding(sup, open_tmp_module, "after-garbage",
                    {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    assert out(other, "tool_urllib",
               url=f"http://127.0.0.1:{ports['allowed']}/after")["status"] == 200


def test_refusals_are_counted_by_rule_and_logged_with_who_and_where(sup, servers, caplog,
                                                                   open_tmp_module):
    ports, _ = servers
    t = binding(sup, open_tmp_module, "counted", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    before = sup.metrics()["egress"]
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.egress"):
        out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['other']}/")
        out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/")
    after = sup.metrics()["egress"]
    rule = f"allow 127.0.0.1:{ports['allowed']}"
    assert after["refused"]["no allow rule"] == before["refused"].get("no allow rule", 0) + 1
    assert after["admitted"][rule] == before["admitted"].get(rule, 0) + 1
    said = [r.getMessage() for r in caplog.records if r.name == "lcp_sandbox.egress"]
    assert any("tenant counted, library netprobe, to 127.0.0.1 port "
               f"{ports['other']}" in m for m in said), said


def test_a_policy_needs_a_confined_worker_and_rules_that_parse(open_tmp):
    with Supervisor() as plain:
        t = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, workspace=str(open_tmp),
                             host_tool_configs={"netprobe": {"sandbox": {
                                 "network": {"allow": ["example.com"]}}}})
        got = t.execute_tool("tool_env", {})
        assert got["status_code"] == 500 and "only a confined worker" in got["error"]
        for bad, said in (({"allow": ["example.com:http"]}, "the port 'http'"),
                          ({"allow": ["exa mple.com"]}, "'exa mple.com' is not a host"),
                          ({"alow": []}, "'alow'"), ({"allow": "example.com"}, "a list")):
            t = SandboxedBinding(tools_folders=[LIBS], supervisor=plain, confine=True,
                                 workspace=str(open_tmp), workspace_root=str(open_tmp),
                                 host_tool_configs={"netprobe": {"sandbox": {"network": bad}}})
            got = t.execute_tool("tool_env", {})
            assert got["status_code"] == 500 and said in got["error"], (bad, got)
        assert plain.stats() == []                            # no worker was started


def test_policy_rules():
    import ipaddress
    p = policy_of({"allow": ["api.example.com:443", "*.cdn.example.net", "[2001:db8::1]:80",
                             "10.0.0.0/8:5432"], "deny": ["bad.cdn.example.net"]})
    a = ipaddress.ip_address
    assert p.check("API.example.com.", 443, [a("93.184.216.34")]).admitted
    assert not p.check("api.example.com", 80, [a("93.184.216.34")]).admitted
    assert p.check("x.cdn.example.net", 8080, [a("93.184.216.34")]).admitted
    assert not p.check("cdn.example.net", 80, [a("93.184.216.34")]).admitted      # apex
    assert not p.check("bad.cdn.example.net", 80, [a("93.184.216.34")]).admitted
    assert not p.check("x.cdn.example.net", 80, [a("10.1.2.3")]).admitted   # 5432 only
    assert p.check("2001:db8::1", 80, [a("2001:db8::1")]).admitted
    assert p.check("10.9.9.9", 5432, [a("10.9.9.9")]).admitted
    # an IPv4-mapped IPv6 address is the IPv4 address it reaches
    assert not p.check("api.example.com", 443, [a("::ffff:127.0.0.1")]).admitted
    # a name allowed, one of its addresses not: refused (no rebinding to the unlisted one)
    assert not p.check("api.example.com", 443, [a("93.184.216.34"), a("169.254.169.254")]).admitted


def test_serve_mcp_flags_make_the_policy_or_say_what_is_wrong():
    from lcp_sandbox.fronts import mcp_cli
    from lcp_sandbox.fronts.cli import build_parser

    def network(*argv):
        args = build_parser().parse_args(["serve-mcp", "tools", *argv])
        confine = (args.transport == "http") if args.confine is None else args.confine
        return mcp_cli._network(args, confine)

    assert network() is True and network("--no-network") is False
    assert network("--transport", "http", "--network-allow", "example.com:443",
                   "--network-allow", "*.example.org", "--network-deny", "10.0.0.0/8") == {
        "allow": ["example.com:443", "*.example.org"], "deny": ["10.0.0.0/8"]}
    for argv, said in ((["--network-allow", "example.com"], "only confined workers"),
                       (["--confine", "--network-allow", "a b"], "'a b' is not a host"),
                       (["--network-deny", "x.org"], "needs --network-allow"),
                       (["--confine", "--no-network", "--network-allow", "x.org"],
                        "contradict")):
        with pytest.raises(Exception) as caught:
            network(*argv)
        assert said in str(caught.value), argv
