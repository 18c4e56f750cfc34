"""Network by policy: a confined worker reaches the hosts its library is allowed, through the
host's egress proxy, and nothing else.  Servers on the host's loopback stand for the outside."""
from __future__ import annotations

import errno
import http.server
import ipaddress
import logging
import os
import signal
import socket
import threading
import time

import pytest
from conftest import FIXTURES, poll

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.backends.local.confine import egress_accept, egress_conn, egress_proxy
from lcp_sandbox.backends.local.confine.egress_port import Handed
from lcp_sandbox.backends.metrics import Metrics
from lcp_sandbox.core.egress_rules import authority_of, canonical_host, policy_of, rule_of
from lcp_sandbox.testing import landlock_abi_at_most, protections_off

LIBS = FIXTURES / "egress_libs"          # (CI runs these on the spawn start path too)


class Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self):               # noqa: N802 (the base class's name)
        self.server.seen.append(self.path)
        self.server.hosts.append(self.headers["Host"])
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
        server.name, server.seen, server.hosts = name, [], []
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
    prot = sup.stats(tenant="one-port")[0]["protections"]
    # past the proxy: its own namespace has no way out; without one (a default container)
    # Landlock's TCP rules refuse the connect
    past = "PermissionError" if by_port(prot) else "ConnectionRefusedError"
    for port in ports.values():
        assert out(one_port, "tool_raw", host="127.0.0.1", port=port) == past
    assert out(one_port, "tool_unix", path=sup.egress.path) == "PermissionError"
    assert made["other"].seen == []
    assert made["allowed"].seen == ["/u", "/r", "/h", "/tunnel"]
    assert prot["network"].startswith(("policy (1 rules: own network namespace",
                                       "policy (1 rules: no network namespace of its own"))
    assert prot["unix_sockets"].startswith("blocked")


def by_port(protections: dict) -> bool:
    """Whether a worker reaches the proxy by port (no network namespace of its own)."""
    return "no network namespace of its own" in protections["network"]


def test_a_worker_in_a_namespace_of_its_own_gets_no_socket_of_the_host_s_network(
        one_port, servers, sup):
    """The proxy hands TCP sockets (of the host's network) only to a worker that proved it
    has no namespace of its own: else one could reach every port of the host's loopback."""
    ports, made = servers
    seen = list(made["other"].seen)
    got = out(one_port, "tool_dialer_socket", host="127.0.0.1", port=ports["other"])
    # (where it has no namespace, it is given one, and Landlock's TCP rules hold it)
    protections = sup.stats(tenant="one-port")[0]["protections"]
    assert got == "PermissionError EACCES" if by_port(protections) else \
        got.startswith("no socket"), got
    assert made["other"].seen == seen


def test_what_a_worker_offers_on_its_dialer_proves_nothing(one_port, servers, sup):
    """The way a worker reaches the proxy is the host's record of its token: one in a
    namespace of its own that offers every socket it holds (its channel to the supervisor
    among them, a socket of the host's network) as a "proof" gets neither the by-port
    listener's port nor a socket of the host's network; one sent by port gains nothing
    by it (Landlock's TCP rules still hold its sockets to the proxy's port)."""
    ports, made = servers
    seen = list(made["other"].seen)
    got = out(one_port, "tool_dialer_forged", host="127.0.0.1", port=ports["other"])
    assert got["offered"] >= 1, got
    if by_port(sup.stats(tenant="one-port")[0]["protections"]):
        assert got["socket"] == "given" and got["connect"] == "PermissionError EACCES", got
    else:
        assert got == {"offered": got["offered"], "port": "0", "socket": "none (b'n')",
                       "connect": ""}, got
        assert sup.egress.by_port.listener is None
    assert made["other"].seen == seen


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
    resolve = egress_proxy._resolve

    def recorded(host, port):
        asked.append(host)
        return resolve(host, port)
    monkeypatch.setattr(egress_proxy, "_resolve", recorded)
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
    # (a container's /etc/hosts names ::1 too: one such sentence for each address)
    assert "127.0.0.1, a loopback address that no allow rule lists" in refused["body"]
    assert out(listed, "tool_urllib", url=f"http://localhost:{port}/n")["status"] == 200


def test_a_name_reaches_the_one_of_its_addresses_a_rule_lists_and_no_other(
        sup, servers, open_tmp_module, monkeypatch):
    """localhost resolving to an unlisted loopback address first (as ::1 comes before
    127.0.0.1 in a container's /etc/hosts) and the listed one next: the proxy connects to
    the listed one, never to the first, where a decoy listens on the same port."""
    ports, made = servers
    port = ports["allowed"]
    decoy = http.server.ThreadingHTTPServer(("127.0.0.2", port), Recorder)
    decoy.name, decoy.seen, decoy.hosts = "decoy", [], []
    threading.Thread(target=decoy.serve_forever, daemon=True).start()
    resolve = egress_proxy._resolve
    monkeypatch.setattr(egress_proxy, "_resolve", lambda host, p: [
        ipaddress.ip_address("127.0.0.2"), ipaddress.ip_address("127.0.0.1")]
        if host == "localhost" else resolve(host, p))
    try:
        t = binding(sup, open_tmp_module, "first-unlisted",
                    {"allow": [f"localhost:{port}", f"127.0.0.1:{port}"]})
        got = out(t, "tool_urllib", url=f"http://localhost:{port}/which")
        assert (got["status"], got["body"]) == (200, "allowed /which"), got
        assert decoy.seen == []
    finally:
        decoy.shutdown()
        decoy.server_close()


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
    # the tunnels' far end: a listener whose backlog holds them all, handshakes done by the
    # kernel (a server's usual backlog of 5 drops SYNs under load: connects take seconds)
    sink = socket.create_server(("127.0.0.1", 0), backlog=4 * egress_proxy.MAX_PER_WORKER)
    target = f"127.0.0.1:{sink.getsockname()[1]}"
    flood = binding(sup, open_tmp_module, "flood", {"allow": [target]})
    release = open_tmp_module / "flood" / "release"
    answered = open_tmp_module / "flood" / "answered"
    n = egress_proxy.MAX_PER_WORKER + 40
    result = {}
    # (each connection a tunnel, so the share stays taken until the release, whatever the
    # machine's load: the tool waits for every answer, not for a time, and says when)
    worker = threading.Thread(target=lambda: result.update(out=flood.execute_tool(
        "tool_flood", {"n": n, "release": str(release), "target": target,
                       "answered": str(answered)}, timeout_s=150)))
    worker.start()
    try:
        poll(lambda: answered.exists() or not worker.is_alive(), 120)
        assert answered.exists(), f"the flood's connections were not all answered: {result}"
        assert sup.egress.connections >= egress_proxy.MAX_PER_WORKER
        assert out(one_port, "tool_urllib",
                   url=f"http://127.0.0.1:{ports['allowed']}/during")["status"] == 200
    finally:
        release.touch()
        worker.join(90)
        sink.close()
    # its share established, each beyond it turned away: 429, or (a machine so busy that
    # more than a share of a by-port worker's sockets waited to be accepted: the oldest
    # unaccepted are let go, egress_port.py) closed or reset unanswered
    answers = dict(result["out"]["output"])
    assert answers.pop("200") == egress_proxy.MAX_PER_WORKER, result
    assert answers.pop("unanswered") == 0, result
    assert set(answers) <= {"429", "closed", "reset"} and sum(answers.values()) == 40, result
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


def test_a_worker_s_second_listener_is_closed_unserved(sup, servers, open_tmp_module):
    """The proxy accepts on the one listener a worker handed over at its start, and on no
    other it sends later (the proxy would serve its tenant's policy to whatever connects)."""
    ports, _ = servers
    t = binding(sup, open_tmp_module, "listeners", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    got = out(t, "tool_second_listener")
    by_port = "no network namespace" in sup.stats(tenant="listeners")[0]["protections"]["network"]
    assert got == ("cannot listen" if by_port else "refused")
    assert out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/after")["status"] == 200


def still_open(fd: int, inode: int) -> bool:
    """Whether ``fd`` is still the file of ``inode`` (not closed, nor reused since)."""
    try:
        return os.fstat(fd).st_ino == inode
    except OSError:
        return False


def test_only_a_listening_tcp_socket_of_another_network_namespace_is_taken():
    """What a hostile worker could hand over as its listener: none of the host's network (a
    stranger on the host could reach it), no socket that does not listen, no other kind."""
    host_listener = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    unix_listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix_listener.bind("")
    unix_listener.listen()
    plain = socket.socket()
    r, w = os.pipe()
    for sock in (host_listener, udp, unix_listener, plain):
        fd = os.dup(sock.fileno())
        assert egress_accept.listening_socket(fd) is None, sock
        assert not still_open(fd, os.fstat(sock.fileno()).st_ino), sock
        sock.close()
    inode = os.fstat(r).st_ino
    assert egress_accept.listening_socket(r) is None
    assert not still_open(r, inode)
    os.close(w)


def test_what_is_sent_as_a_listener_and_refused_is_closed_once():
    """A listener refused (not one, or not the first) and what came with it: each closed,
    none twice (a descriptor number closed twice may be another thread's by then)."""
    proxy = egress_proxy.EgressProxy(Metrics())
    handed = Handed(egress_proxy.Identity("t", "lib", policy_of({"allow": ["example.com"]})),
                    set())
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        r, w = os.pipe()
        fds = [socket.socket(socket.AF_INET, kind).detach(), r]
        inodes = [os.fstat(fd).st_ino for fd in fds]
        proxy._listener(handed, fds)                   # (raised EBADF when closed twice)
        assert not any(map(still_open, fds, inodes))
        os.close(w)
    assert handed.listener is None


_LISTEN_IN_A_NAMESPACE = """import ctypes, socket, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x40000000):
    sys.exit(3)
with socket.socket(fileno=int(sys.argv[1])) as back:
    tcp = socket.create_server(("127.0.0.1", 0))
    socket.send_fds(back, [b"l"], [tcp.fileno()])
"""


def a_listener_of_another_namespace() -> int:
    """A listening TCP socket made in a network namespace of its own (what a worker the
    host gave a namespace hands over), received here: its descriptor."""
    here, there = socket.socketpair()
    with here, there:
        import subprocess
        import sys
        done = subprocess.run([sys.executable, "-c", _LISTEN_IN_A_NAMESPACE, str(there.fileno())],
                              pass_fds=[there.fileno()], timeout=30, check=False)
        if done.returncode == 3:
            pytest.skip("this host makes no network namespace (a worker here comes by port)")
        assert done.returncode == 0
        _, fds, _, _ = socket.recv_fds(here, 1, 1)
    return fds[0]


def test_a_listener_is_taken_only_from_a_worker_the_host_gave_a_namespace():
    """The host's record of the token decides: the same listener (one of another network
    namespace, which a worker in a namespace of its own hands over) is taken from a worker
    the host gave a namespace, and closed unread from one it sent by port, which is in the
    host's network and may serve nothing there."""
    proxy = egress_proxy.EgressProxy(Metrics())
    proxy._start()
    try:
        ident = egress_proxy.Identity("t", "lib", policy_of({"allow": ["example.com"]}))
        for by_port in (True, False):
            handed = Handed(ident, set(), by_port)
            fd = a_listener_of_another_namespace()
            inode = os.fstat(fd).st_ino
            proxy._listener(handed, [fd])
            assert (handed.listener is None) is by_port
            assert still_open(fd, inode) is not by_port
    finally:
        proxy.close()


def test_a_dialer_with_a_token_the_host_never_gave_is_closed(sup, one_port):
    """A dialer is known by the token the host gave its worker: any other line ends it."""
    out(one_port, "tool_env")                           # (the proxy is up)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as d:
        d.settimeout(20)
        d.connect(sup.egress.path)
        d.sendall(b"0" * egress_proxy.TOKEN_BYTES + b"\n" + egress_proxy.ASK_PORT)
        assert closed_unanswered(d)


def test_a_connection_accepted_as_its_dialer_ended_is_closed_unserved():
    proxy = egress_proxy.EgressProxy(Metrics())
    handed = Handed(egress_proxy.Identity("t", "lib", policy_of({"allow": ["example.com"]})),
                    set())
    handed.ended = True
    client, server = socket.socketpair()
    proxy._take(handed, server)
    assert server.fileno() == -1 and client.recv(10) == b""
    assert proxy.connections == 0 and proxy.tenants == {} and not handed.came
    client.close()


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
    # a name allowed, one of its addresses not: that one is never connected to (no
    # rebinding to it); none of them allowed: refused
    mixed = p.check("api.example.com", 443, [a("169.254.169.254"), a("93.184.216.34")])
    assert mixed.admitted and mixed.addresses == (a("93.184.216.34"),)
    assert not p.check("api.example.com", 443, [a("169.254.169.254"), a("10.0.0.1")]).admitted


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



# ------------------------------------------------------------ one name, request to socket
class Seams:
    """The proxy's resolver and connect, recorded: the resolver reads a name as the C
    resolver does (up to a NUL), and nothing is connected (502)."""

    def __init__(self, names: dict):
        self.names, self.resolved, self.connected = names, [], []

    def resolve(self, host, port):
        self.resolved.append(host)
        name = host.split("\0")[0]
        try:
            return [ipaddress.ip_address(name)]
        except ValueError:
            return [ipaddress.ip_address(a) for a in self.names.get(name, ["93.184.215.14"])]

    def connect(self, addresses, port):
        self.connected.append(([str(a) for a in addresses], port))
        raise egress_conn.ProxyRefusal(502, "not connected (test)")


@pytest.fixture
def seams(monkeypatch):
    made = Seams({"vm": ["127.0.0.1"], "localhost": ["127.0.0.1"]})
    monkeypatch.setattr(egress_proxy, "_resolve", made.resolve)
    monkeypatch.setattr(egress_conn, "connect", made.connect)
    return made


def exchange(rules: list, head: bytes, metrics=None) -> bytes:
    """What a proxy whose worker has the policy ``rules`` answers ``head`` (in this thread)."""
    proxy = egress_proxy.EgressProxy(metrics or Metrics())
    ident = egress_proxy.Identity("t", "lib", policy_of({"allow": rules}))
    client, server = socket.socketpair()
    with client, server:
        client.sendall(head)
        client.shutdown(socket.SHUT_WR)
        egress_conn.serve(server, lambda host, port: proxy._admit(ident, host, port))
        server.shutdown(socket.SHUT_WR)
        return b"".join(iter(lambda: client.recv(65536), b""))


def test_a_nul_in_a_connect_host_matches_nothing_and_is_never_resolved(seams):
    """The rule read the whole string, the C resolver stopped at the NUL (3fff::7)."""
    metrics = Metrics()
    got = exchange(["*.example.com:443"],
                   b"CONNECT 3fff::7\x00.example.com:443 HTTP/1.1\r\nHost: x.example.com\r\n\r\n",
                   metrics)
    assert got.startswith(b"HTTP/1.1 400 "), got
    assert seams.resolved == [] and seams.connected == []
    assert metrics.snapshot()["egress"]["admitted"] == {}


def test_a_nul_in_a_url_host_does_not_reach_the_loopback_beside_it(seams):
    """vm\\0.example.com matched *.example.com; the resolver read "vm" (the loopback here)."""
    got = exchange(["*.example.com:8080", "127.0.0.1:8080"],
                   b"GET http://vm\x00.example.com:8080/ HTTP/1.1\r\nHost: vm.example.com\r\n\r\n")
    assert got.startswith(b"HTTP/1.1 400 "), got
    assert seams.resolved == [] and seams.connected == []


def test_a_nul_in_a_url_host_through_a_worker_and_the_real_resolver(sup, servers,
                                                                    open_tmp_module):
    ports, made = servers
    port = ports["allowed"]
    t = binding(sup, open_tmp_module, "nul-host",
                {"allow": [f"*.example.com:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"]})
    seen = list(made["allowed"].seen)
    got = out(t, "tool_raw_proxy", head=f"GET http://localhost\0.example.com:{port}/nul "
                                        f"HTTP/1.1\r\nHost: x.example.com\r\n\r\n")
    assert got["status"] == "HTTP/1.1 400 Bad Request", got
    assert made["allowed"].seen == seen


@pytest.mark.parametrize("target", [
    "vm%00.example.com", "vm .example.com", "vm\t.example.com", "a..example.com",
    "x@vm.example.com", "vm\\.example.com", "vm.example.com%2e", "-vm.example.com",
    "vm_.example.com", "xn--abc.example.com", "\u00e9.example.com"])
def test_a_host_spelled_two_ways_is_refused_before_the_rules(seams, target):
    for head in (f"CONNECT {target}:443 HTTP/1.0\r\n\r\n",
                 f"GET http://{target}:443/ HTTP/1.0\r\n\r\n"):
        got = exchange(["*.example.com"], head.encode("utf-8"))
        assert got.startswith(b"HTTP/1.1 400 "), (head, got)
    assert seams.resolved == [] and seams.connected == []


def test_the_one_spelling_of_a_host():
    assert canonical_host("API.Example.COM.") == "api.example.com"
    assert canonical_host("r3---sn-a.googlevideo.com") == "r3---sn-a.googlevideo.com"
    assert canonical_host("xn--bcher-kva.example") == "xn--bcher-kva.example"
    assert canonical_host("::ffff:127.0.0.1") == "::ffff:7f00:1"
    assert authority_of("[2001:db8::1]:443") == ("2001:db8::1", 443)
    assert authority_of("example.com", 80) == ("example.com", 80)
    # the resolver would read these as addresses, or read them otherwise than the rules
    for bad in ("127.1", "0x7f.1", "2130706433", "fe80::1%eth0", "", ".", "a" * 64 + ".com",
                "example.com..", "bücher.example", "3fff::7\0.example.com"):
        with pytest.raises(ValueError):
            canonical_host(bad)
    for bad in ("3fff::7:443", "[127.0.0.1]:80", "example.com:0", "example.com:+1",
                "example.com:", "example.com"):
        with pytest.raises(ValueError):
            authority_of(bad)
    # a rule's non-ASCII name is matched as the A-label clients send
    assert rule_of("*.Bücher.example:443").suffix == ".xn--bcher-kva.example"
    with pytest.raises(ValueError, match="is not a host"):
        rule_of("under_score.example")
    decision = policy_of({"allow": ["*.example.com"]}).check("vm\0.example.com", 80, [])
    assert not decision.admitted and decision.rule == "malformed host"


def test_plain_http_goes_with_the_host_of_its_url(one_port, servers):
    """A proxy replaces the client's Host with the URL's: a server behind the checked
    address cannot be asked for another site."""
    ports, made = servers
    port = ports["allowed"]
    got = out(one_port, "tool_raw_proxy",
              head=f"GET http://127.0.0.1:{port}/fronted HTTP/1.1\r\nHost: evil.example\r\n\r\n")
    assert got["status"].split()[1] == "200", got
    assert made["allowed"].hosts[made["allowed"].seen.index("/fronted")] == f"127.0.0.1:{port}"


# ------------------------------------------------------------ fairness
def held(proxy, ident, n: int, refused: bool = False) -> list:
    """``n`` connections of ``ident``'s worker, accepted by the proxy's threads on a
    listener of the worker's (as one in a namespace of its own hands over), each taken
    before this returns: served (waiting for its head) or, ``refused``, answered."""
    listener = socket.create_server(("127.0.0.1", 0))
    handed = Handed(ident, set())
    proxy._accept_on(listener, lambda conn, _: proxy._take(handed, conn))
    ends = []
    for _ in range(n):
        before = proxy.connections
        ends.append(socket.create_connection(listener.getsockname(), timeout=20))
        if refused:
            ends[-1].setblocking(True)
            assert select_readable(ends[-1])
        else:
            assert poll(lambda: proxy.connections == before + 1), (proxy.connections, before)
    return ends


def select_readable(sock) -> bool:
    import select
    return bool(select.select([sock], [], [], 20)[0])


def answer(client) -> bytes:
    client.setblocking(False)
    try:
        return client.recv(4096)
    except BlockingIOError:
        return b""


def test_each_tenant_has_a_share_and_the_host_answers_503_with_retry_after():
    proxy = egress_proxy.EgressProxy(Metrics())
    proxy._start()
    proxy.max_per_worker, proxy.max_per_tenant, proxy.max_connections = 2, 3, 5
    assert egress_proxy.MAX_PER_TENANT == egress_proxy.MAX_CONNECTIONS // 32
    policy = policy_of({"allow": ["example.com"]})
    a1, a2, b, c = (egress_proxy.Identity(t, lib, policy)
                    for t, lib in (("a", "one"), ("a", "two"), ("b", "one"), ("c", "one")))
    clients, refused = held(proxy, a1, 2) + held(proxy, a2, 1), []
    try:
        # tenant a holds its share (3) through two workers; the host has room (3 of 5)
        refused += held(proxy, a1, 1, refused=True) + held(proxy, a2, 1, refused=True)
        clients += held(proxy, b, 2)
        assert [answer(x) for x in clients] == [b""] * 5
        assert proxy.tenants == {"a": 3, "b": 2} and proxy.connections == 5
        refused += held(proxy, c, 1, refused=True)
        said = [answer(x).decode() for x in refused]
        assert [x.split("\r\n")[0] for x in said] == [
            "HTTP/1.1 429 Too Many Requests", "HTTP/1.1 429 Too Many Requests",
            "HTTP/1.1 503 Service Unavailable"], said
        assert all("\r\nRetry-After: 1\r\n" in x for x in said)
        for text, limit in zip(said, ("this worker's limit of 2", "this tenant's limit of 3",
                                      "the host's limit of 5"), strict=True):
            assert limit in text
        # a slot given back is taken again
        clients.pop().close()
        assert poll(lambda: proxy.connections == 4)
        clients += held(proxy, c, 1)
        assert answer(clients[-1]) == b"" and proxy.tenants == {"a": 3, "b": 1, "c": 1}
    finally:
        for x in clients + refused:
            x.close()
    assert poll(lambda: proxy.connections == 0) and proxy.tenants == {}
    proxy.close()


def test_a_killed_worker_s_connections_end_though_the_server_never_answers(sup, open_tmp_module):
    """Tunnels to a server that holds its answers (a long poll): once their worker is
    killed, the proxy ends them, and their slots are its tenant's and the host's again."""
    release = threading.Event()

    class Held(Recorder):
        # (the base class's name)
        def do_GET(self):               # noqa: N802
            release.wait(120)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Held)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    t = binding(sup, open_tmp_module, "long-poll", {"allow": [f"127.0.0.1:{port}"]})
    hold = {"host": "127.0.0.1", "port": port, "n": 6, "path": "/hold"}
    try:
        before = sup.egress.connections
        assert out(t, "tool_hold", **hold) == {"opened": 6, "held": 6}
        assert sup.egress.tenants["long-poll"] == 6 and sup.egress.connections == before + 6
        os.kill(sup.stats(tenant="long-poll")[0]["pid"], signal.SIGKILL)
        assert poll(lambda: "long-poll" not in sup.egress.tenants), sup.egress.tenants
        assert sup.egress.connections == before
        # its next worker's (a fresh module state), under the same caps
        assert out(t, "tool_hold", **hold) == {"opened": 6, "held": 6}
    finally:
        t.close()
        release.set()
        server.shutdown()
        server.server_close()


def test_a_head_trickled_a_byte_at_a_time_ends_at_one_deadline(sup, one_port, monkeypatch):
    """Each byte comes well within the deadline; the whole head does not."""
    monkeypatch.setattr(sup.egress, "head_timeout_s", 1.0)
    got = out(one_port, "tool_trickle", gap=0.25, most=80)
    assert got["answer"].startswith("HTTP/1.1 400 Bad Request"), got
    assert "no complete request head within 1 s" in got["answer"]
    assert got["sent"] < 80


def test_the_head_limit_is_exact(one_port, servers):
    ports, made = servers
    port = ports["allowed"]

    def head(size: int, path: str) -> str:
        start = f"GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: "
        return start + "a" * (size - len(start) - 4) + "\r\n\r\n"
    limit = egress_conn.HEAD_LIMIT
    assert out(one_port, "tool_raw_proxy", head=head(limit, "/limit"))["status"].split()[1] == \
        "200"
    for size in (limit + 1, 100 * 1024):
        got = out(one_port, "tool_raw_proxy", head=head(size, f"/over{size}"))
        assert got["status"] == "HTTP/1.1 400 Bad Request", (size, got)
        assert f"a request head over {limit} bytes" in got["text"]
    assert [p for p in made["allowed"].seen if p.startswith(("/limit", "/over"))] == ["/limit"]


def test_one_mcp_client_at_its_session_cap_holds_at_most_half_the_proxy():
    """Each serve-mcp session is a tenant: a client holding every session it may by default,
    each at its tenant's share, leaves the other half of the host's connections to others."""
    from lcp_sandbox.fronts.mcp_limits import DEFAULT_SESSIONS_PER_CLIENT
    assert DEFAULT_SESSIONS_PER_CLIENT * egress_proxy.MAX_PER_TENANT <= egress_proxy.MAX_CONNECTIONS // 2


# ------------------------------------------------------------ without a network namespace
# A default container refuses unshare: the worker is in the host's network and reaches the
# proxy by port, held by Landlock's TCP rules (ABI 4+) and its system call filter.  Here the
# namespace is switched off for the supervisor (in CI's default-container run there is none).
@pytest.fixture(scope="module")
def no_netns():
    with Supervisor(confine=True) as s, protections_off(s, "netns"):
        yield s


def proxy_port(t: SandboxedBinding) -> int:
    return int(out(t, "tool_env")["HTTP_PROXY"].rsplit(":", 1)[1])


def closed_unanswered(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` without a byte (an end, or a reset: what it
    was sent was never read)."""
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


GET = "GET http://127.0.0.1:{port}{path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"


def test_without_a_namespace_a_policy_worker_reaches_the_allowed_server_and_nothing_else(
        no_netns, servers, open_tmp_module):
    ports, made = servers
    t = binding(no_netns, open_tmp_module, "np-one", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    allowed, other = (f"http://127.0.0.1:{ports[n]}" for n in ("allowed", "other"))
    for tool in ("tool_urllib", "tool_requests", "tool_httpx"):
        assert out(t, tool, url=allowed + "/np") == {"status": 200, "body": "allowed /np"}
        assert out(t, tool, url=other + "/np")["status"] == 403
    assert out(t, "tool_tunnel", host="127.0.0.1", port=ports["allowed"])["status"] == 200
    prot = no_netns.stats(tenant="np-one")[0]["protections"]
    assert by_port(prot) and "Landlock ABI" in prot["network"], prot["network"]
    assert f"connect to the host's proxy port {proxy_port(t)} only" in prot["network"]
    # Past the proxy: the host's loopback (TCP by Landlock's rules), IPv6, UDP, raw and
    # packet sockets, unix sockets (the filter), a server of its own (listen, bind)
    seen = list(made["other"].seen)
    got = out(t, "tool_sockets", host="127.0.0.1", port=ports["other"])
    assert got == {"tcp": "PermissionError EACCES", "tcp_fastopen": "PermissionError EACCES",
                   "tcp6": "PermissionError EACCES",
                   "udp": "PermissionError EACCES", "raw": "PermissionError EACCES",
                   "packet": "PermissionError EACCES", "unix": "PermissionError EACCES",
                   "unix_dgram_pair": "PermissionError EACCES",
                   "listen": "PermissionError EPERM", "bind": "PermissionError EACCES"}, got
    assert out(t, "tool_raw", host="127.0.0.1", port=ports["allowed"]) == "PermissionError"
    assert made["other"].seen == seen
    assert out(t, "tool_unix", path=no_netns.egress.path) == "PermissionError"


def routed(address: str) -> bool:
    """Whether this host has a route to ``address`` (a UDP connect: the route is looked
    up, nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((address, 9))
        except OSError as exc:
            if exc.errno == errno.ENETUNREACH:
                return False
            raise
    return True


def test_without_a_namespace_the_proxy_port_reaches_no_other_host(no_netns, servers,
                                                                  open_tmp_module):
    """Landlock's rules name a port, not an address: the worker's sockets are bound to
    127.0.0.1, which the kernel refuses to route anywhere but to the host itself (EINVAL,
    before any packet; ENETUNREACH where the host has no route there at all, as in a
    container with --network none), and on the host the port is the proxy's on every
    address."""
    ports, _ = servers
    t = binding(no_netns, open_tmp_module, "np-far", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    port = proxy_port(t)
    # TEST-NET-1: an address beyond this host, at the one port Landlock lets it reach
    far = "192.0.2.1"
    expected = "OSError EINVAL" if routed(far) else "OSError ENETUNREACH"
    assert out(t, "tool_far", address=far, port=port) == expected
    # nothing else may listen at that port on another address of the host for it to reach
    with socket.socket() as squatter:
        with pytest.raises(OSError) as taken:
            squatter.bind(("127.0.0.2", port))
        assert taken.value.errno == 98                               # EADDRINUSE


def test_without_a_namespace_no_other_process_can_speak_for_a_policy_worker(
        no_netns, servers, open_tmp_module):
    """All such workers reach the proxy at one port; it serves a connection only as the
    worker it handed that socket to.  A stranger (the host's own process, a tenant whose
    network is on) is closed unread; one that shares the port of a socket the worker holds
    (SO_REUSEADDR, with the worker's help) too; another policy worker is itself."""
    ports, made = servers
    a = binding(no_netns, open_tmp_module, "np-a", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    b = binding(no_netns, open_tmp_module, "np-b", {"allow": [f"127.0.0.1:{ports['other']}"]})
    port = proxy_port(a)
    assert proxy_port(b) == port
    seen = list(made["allowed"].seen)
    head = GET.format(port=ports["allowed"], path="/stranger")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as host:
        host.sendall(head.encode())
        assert closed_unanswered(host)
    on = binding(no_netns, open_tmp_module, "np-on", True)
    assert out(on, "tool_send", host="127.0.0.1", port=port, data=head)["answer"] == ""
    spare = out(a, "tool_spare_socket")
    with socket.socket() as thief:
        thief.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        thief.bind(("127.0.0.1", spare))
        thief.connect(("127.0.0.1", port))
        thief.settimeout(20)
        thief.sendall(head.encode())
        assert closed_unanswered(thief)
    got = out(b, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/as-b")
    assert got["status"] == 403
    assert made["allowed"].seen == seen
    # the sockets a worker was handed and holds are given back when it ends
    assert spare in no_netns.egress.by_port.kept
    a.restart_library("netprobe")
    assert poll(lambda: spare not in no_netns.egress.by_port.kept)


def test_without_a_namespace_what_a_tool_writes_on_its_dialer_leaves_its_sockets_coming(
        no_netns, servers, open_tmp_module):
    """Requests of its own on its dialer (the proxy's port, sockets) leave answers waiting
    there: the worker's next sockets still come, from the proxy."""
    ports, _ = servers
    t = binding(no_netns, open_tmp_module, "np-dialer",
                {"allow": [f"127.0.0.1:{ports['allowed']}"]})
    assert out(t, "tool_dialer_write", data="pspps") == 1
    for _ in range(3):
        got = out(t, "tool_urllib", url=f"http://127.0.0.1:{ports['allowed']}/dialer")
        assert got == {"status": 200, "body": "allowed /dialer"}


def test_the_by_port_listener_is_open_only_while_a_worker_sent_by_port_lives(
        servers, open_tmp_module):
    """No port of the host stays open for no worker: the listener opens with the first
    worker the host sent by port and closes with the last."""
    ports, _ = servers
    with Supervisor(confine=True) as s, protections_off(s, "netns"):
        assert s.egress.by_port.listener is None
        t = binding(s, open_tmp_module, "np-life", {"allow": [f"127.0.0.1:{ports['allowed']}"]})
        port = proxy_port(t)
        assert s.egress.by_port.listener is not None
        with socket.socket() as squatter, pytest.raises(OSError) as taken:
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            squatter.bind(("127.0.0.1", port))
            squatter.listen(1)
        assert taken.value.errno == 98                               # EADDRINUSE
        t.close()
        assert poll(lambda: s.egress.by_port.listener is None)
        # (a process the host starts at that instant holds a copy of its descriptors until
        # its exec: the port is free once that is done, not necessarily at once)
        assert poll(lambda: _bindable(port), timeout=10)


def _bindable(port: int) -> bool:
    """Whether a listener may take 127.0.0.1:``port`` (SO_REUSEADDR: only a listening
    socket there stops it)."""
    with socket.socket() as after:
        after.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            after.bind(("127.0.0.1", port))
            after.listen(1)
        except OSError:
            return False
        return True


@pytest.mark.parametrize("abi", [3, None], ids=["landlock_abi_3", "without_landlock"])
def test_without_a_namespace_nor_landlock_tcp_rules_a_policy_is_refused_naming_both(
        no_netns, open_tmp_module, abi):
    tenant = f"np-refused-{abi}"
    with (landlock_abi_at_most(no_netns, abi) if abi else protections_off(no_netns, "landlock")):
        t = binding(no_netns, open_tmp_module, tenant, {"allow": ["example.com:443"]})
        got = t.execute_tool("tool_env", {})
    assert got["success"] is False and got["status_code"] == 503, got
    assert ("network: unavailable (a network policy needs a network namespace of its own, or "
            "Landlock ABI 4's TCP rules (Linux 6.7)") in got["error"], got["error"]
    assert ("Landlock ABI 3, whose rules have no TCP ports" if abi else
            "switched off for a test") in got["error"], got["error"]
