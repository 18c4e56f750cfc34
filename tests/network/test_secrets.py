"""Secrets the worker never holds: the host's egress proxy puts a secret's value in the
requests of a worker whose policy binds it to their host; the worker holds a placeholder.
A local HTTPS server with a CA of the test's own stands for the API; every server records
what reached it, and none of them echoes a key back."""
from __future__ import annotations

import datetime
import http.server
import ipaddress
import json
import logging
import os
import re
import ssl
import subprocess
import sys
import threading
import uuid

import psutil
import pytest
from conftest import FIXTURES

from lcp_sandbox import SandboxedBinding, Supervisor
from lcp_sandbox.core.secrets import (
    PLACEHOLDER_PREFIX,
    SecretMisuse,
    Swap,
    host_secrets,
    new_placeholder,
)

LIBS = FIXTURES / "secret_libs"
VALUE = "sk-live-" + uuid.uuid4().hex           # never in a worker, a log or a result


class Recorder(http.server.BaseHTTPRequestHandler):
    """Records the key it got (header, query, body) and answers whether it was the value;
    keeps connections alive (HTTP/1.1)."""
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        if self.path.startswith("/big/"):
            size = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            for _ in range(size >> 20):
                self.wfile.write(bytes(1 << 20))
            self.wfile.write(bytes(size % (1 << 20)))
            return
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", self.server.redirect_to)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        seen = " ".join([self.headers.get("X-Api-Key") or "", self.path, body])
        self.server.seen.append(seen)
        answer = json.dumps({"server": self.server.name, "value": self.server.value in seen,
                             "placeholder": PLACEHOLDER_PREFIX in seen}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    do_GET = do_POST = _answer                      # noqa: N815 (the base class's names)

    def log_message(self, *args):
        pass


def make_ca(tmp):
    """A CA of the test's own and a server certificate for 127.0.0.1 it signed: (CA file,
    server cert+key file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test upstream CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(hours=1))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    ca_file, server_file = tmp / "ca.pem", tmp / "server.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    server_file.write_bytes(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))
    return str(ca_file), str(server_file)


def serve(name: str, tls: ssl.SSLContext = None):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.name, server.seen, server.value, server.redirect_to = name, [], VALUE, ""
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The API (HTTPS, bound), another HTTPS host and a plain-HTTP host (not bound)."""
    ca_file, server_file = make_ca(tmp_path_factory.mktemp("ca"))
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(server_file)
    made = {"api": serve("api", tls), "other": serve("other", tls), "plain": serve("plain")}
    made["api"].redirect_to = f"http://127.0.0.1:{made['plain'].server_address[1]}/landed"
    yield ca_file, made
    for server in made.values():
        server.shutdown()
        server.server_close()


def port(world, name: str) -> int:
    return world[1][name].server_address[1]


def url(world, name: str, path: str = "/") -> str:
    scheme = "http" if name == "plain" else "https"
    return f"{scheme}://127.0.0.1:{port(world, name)}{path}"


def policy(world, bound: str = "api") -> dict:
    return {"allow": [f"127.0.0.1:{port(world, n)}" for n in ("api", "other", "plain")],
            "secrets": {"API_KEY": [f"127.0.0.1:{port(world, bound)}"]}}


@pytest.fixture(scope="module")
def sup(world):
    with Supervisor(confine=True, secrets={"API_KEY": VALUE}, upstream_ca_file=world[0]) as s:
        yield s


def binding(sup, root, tenant: str, network, **configs) -> SandboxedBinding:
    ws = root / tenant
    ws.mkdir(exist_ok=True)
    return SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant=tenant,
                            workspace=str(ws), workspace_root=str(ws),
                            host_tool_configs={"secretprobe": {"sandbox": {"network": network},
                                                               **configs}})


def out(t: SandboxedBinding, tool: str, **params):
    got = t.execute_tool(tool, params)
    assert got["success"], got
    assert VALUE not in json.dumps(got)
    return got["output"]


@pytest.fixture(scope="module")
def api(sup, world, open_tmp_module):
    return binding(sup, open_tmp_module, "api-user", policy(world), key={"secret": "API_KEY"})


def answer(got: dict) -> dict:
    assert got["status"] == 200, got
    return json.loads(got["body"])


@pytest.mark.parametrize("client", ["requests", "httpx", "urllib"])
@pytest.mark.parametrize("where", ["header", "query"])
def test_the_bound_host_gets_the_value_and_the_worker_holds_a_placeholder(api, world, client,
                                                                         where):
    held = out(api, "tool_placeholder")
    assert held.startswith(PLACEHOLDER_PREFIX) and VALUE not in held
    got = answer(out(api, "tool_call", url=url(world, "api", "/v1"), client=client, where=where))
    assert got == {"server": "api", "value": True, "placeholder": False}


def test_a_body_larger_than_the_proxy_s_buffers_comes_back_whole(api, world):
    """More than one read of the proxy's (TLS decrypts a record at a time, and what a full
    buffer leaves decrypted wakes no poll)."""
    size = 16 * 1024 * 1024 + 12345
    assert out(api, "tool_size", url=url(world, "api", f"/big/{size}")) == {
        "status": 200, "bytes": size}


def test_a_config_reference_is_the_same_placeholder(api, world):
    assert out(api, "tool_placeholder", source="config") == out(api, "tool_placeholder")
    got = answer(out(api, "tool_call", url=url(world, "api"), source="config"))
    assert got["value"] is True


def test_a_body_is_never_swapped(api, world):
    got = answer(out(api, "tool_call", url=url(world, "api", "/echo"), where="body"))
    assert got == {"server": "api", "value": False, "placeholder": True}


def test_another_host_never_gets_the_value(api, world, caplog):
    """Over HTTPS to a host the secret is not bound to, the tunnel is not opened: the
    server gets the meaningless placeholder.  Over plain HTTP the proxy sees it and refuses
    (403), counts and logs the secret's name, never its value."""
    got = answer(out(api, "tool_call", url=url(world, "other"), verify=False))
    assert got == {"server": "other", "value": False, "placeholder": True}
    seen = list(world[1]["plain"].seen)
    with caplog.at_level(logging.WARNING, logger="lcp_sandbox.egress"):
        refused = out(api, "tool_call", url=url(world, "plain", "/leak"), client="urllib")
    assert refused["status"] == 403 and "API_KEY" in refused["body"], refused
    assert world[1]["plain"].seen == seen
    assert any("API_KEY" in r.getMessage() for r in caplog.records)
    assert not any(VALUE in r.getMessage() for r in caplog.records)


def test_each_request_of_a_kept_alive_connection_is_swapped(api, world):
    """The proxy reads request after request on one connection to a bound host."""
    got = out(api, "tool_session", first=url(world, "api", "/a"), second=url(world, "api", "/b"))
    assert [json.loads(g["body"])["value"] for g in got] == [True, True]


def test_a_kept_alive_session_to_another_host_gets_no_value(api, world):
    first, second = out(api, "tool_session", first=url(world, "api", "/one"),
                        second=url(world, "other", "/two"), verify_second=False)
    assert json.loads(first["body"])["value"] is True
    assert json.loads(second["body"]) == {"server": "other", "value": False, "placeholder": True}


def test_a_redirect_is_followed_by_the_tool_and_the_secret_stays_behind(api, world):
    seen = list(world[1]["plain"].seen)
    got = out(api, "tool_call", url=url(world, "api", "/redirect"), client="httpx")
    assert got["status"] == 403 and "API_KEY" in got["body"], got
    assert world[1]["plain"].seen == seen


def test_each_worker_has_its_own_placeholder_and_another_s_means_nothing(sup, api, world,
                                                                         open_tmp_module):
    other = binding(sup, open_tmp_module, "other-user", policy(world))
    mine, theirs = out(api, "tool_placeholder"), out(other, "tool_placeholder")
    assert mine != theirs
    # (the other tenant's worker sends this one's placeholder: not its own, not swapped)
    before = sum(1 for s in world[1]["api"].seen if mine in s)
    got = answer(out(other, "tool_call", url=url(world, "api") + "?stolen=" + mine,
                     where="query"))
    assert got["value"] is True                        # its own key, in the query too
    assert sum(1 for s in world[1]["api"].seen if mine in s) == before + 1


def test_many_tenants_at_once_each_with_a_placeholder_of_its_own(sup, world, open_tmp_module):
    """Tenants calling at the same time: each worker's placeholder is its own, and each
    request gets the value (the proxy keeps one swap per worker, never mixes them)."""
    import concurrent.futures
    tenants = [binding(sup, open_tmp_module, f"crowd-{i}", policy(world)) for i in range(4)]

    def one(t):
        held = out(t, "tool_placeholder")
        return held, [answer(out(t, "tool_call", url=url(world, "api", f"/crowd/{i}"),
                                 client=client))["value"]
                      for i, client in enumerate(("requests", "httpx", "urllib"))]
    with concurrent.futures.ThreadPoolExecutor(len(tenants)) as pool:
        got = list(pool.map(one, tenants))
    assert len({held for held, _ in got}) == len(tenants)
    assert all(values == [True, True, True] for _, values in got), got


def holds(pid: int, needle: bytes) -> bool:
    """Whether the process's environment, arguments or readable memory hold ``needle`` (as
    root; the test skips where another uid's /proc/<pid>/environ and mem are closed)."""
    try:
        if needle in open(f"/proc/{pid}/environ", "rb").read():
            return True
    except PermissionError:
        pytest.skip("reading another uid's /proc/<pid>/environ and mem needs CAP_SYS_PTRACE, "
                    "which this host kind (Docker's default capabilities) does not give")
    if needle.decode() in " ".join(psutil.Process(pid).cmdline()):
        return True
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", 0) as mem:
        for line in maps:
            span, perms = line.split()[:2]
            if "r" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            try:
                mem.seek(start)
                if needle in mem.read(end - start):
                    return True
            except (OSError, ValueError, OverflowError):
                continue
    return False


def test_nothing_of_the_value_is_in_a_worker(api, world):
    """As root: the worker's environment, arguments and memory hold no byte of it."""
    out(api, "tool_call", url=url(world, "api"))
    pid = next(s["pid"] for s in api.stats() if s["library"] == "secretprobe")
    assert psutil.pid_exists(pid) and not holds(pid, VALUE.encode())


def test_a_secret_changed_on_the_host_reaches_the_next_worker(world, open_tmp_module):
    new = "sk-rotated-" + uuid.uuid4().hex
    with Supervisor(confine=True, secrets={"API_KEY": "sk-old"}, upstream_ca_file=world[0]) as s:
        t = binding(s, open_tmp_module, "rotating", policy(world))
        assert answer(out(t, "tool_call", url=url(world, "api")))["value"] is False
        s.set_secret("API_KEY", VALUE)
        assert answer(out(t, "tool_call", url=url(world, "api")))["value"] is False
        t.restart_library("secretprobe")
        assert answer(out(t, "tool_call", url=url(world, "api")))["value"] is True
        with pytest.raises(ValueError):
            s.set_secret("API_KEY", new + "\r\nX-Injected: 1")


def test_settings_that_would_send_a_secret_wrong_are_refused_naming_it(sup, world, open_tmp):
    allow = [f"127.0.0.1:{port(world, 'api')}"]
    cases = [({"allow": allow, "secrets": {"API_KEY": ["127.0.0.1:1"]}}, {},
              "no allow rule admits"),
             ({"allow": allow, "secrets": {"API_KEY": []}}, {}, "bound to no host"),
             ({"allow": allow, "secrets": {"NOT_HELD": allow}}, {}, "holds no value"),
             ({"allow": allow}, {"key": {"secret": "API_KEY"}}, "binds to no host")]
    for network, configs, said in cases:
        t = binding(sup, open_tmp, f"wrong-{uuid.uuid4().hex[:6]}", network, **configs)
        got = t.execute_tool("tool_placeholder", {})
        assert got["status_code"] == 500 and said in got["error"], (network, got)
    for bad in ({"BAD-NAME": "x"}, {"K": ""}, {"K": "a\nb"}, {"K": 7}, ["K"]):
        with pytest.raises((TypeError, ValueError)):
            host_secrets(bad, "secrets")
        with pytest.raises((TypeError, ValueError)):
            Supervisor(secrets=bad)


def test_the_swap_of_a_head():
    """Swap in a header value and in the query only; a placeholder anywhere else, or for a
    host its secret is not bound to, is refused."""
    swap = Swap([("lcp-secret-aa", "K", "v1", frozenset({("api.example", 443)}))])
    assert swap.head("api.example", 443, b"/p?k=lcp-secret-aa",
                     [(b"Authorization", b"Bearer lcp-secret-aa")]) == (
        b"/p?k=v1", [(b"Authorization", b"Bearer v1")])
    assert swap.head("api.example", 443, b"/p", [(b"A", b"b")]) is None
    for host, target, headers in (("other.example", b"/", [(b"X", b"lcp-secret-aa")]),
                                  ("other.example", b"/?k=lcp-secret-aa", []),
                                  ("api.example", b"/lcp-secret-aa", []),
                                  ("api.example", b"/", [(b"lcp-secret-aa", b"x")])):
        with pytest.raises(SecretMisuse) as refused:
            swap.head(host, 443, target, headers)
        assert refused.value.name == "K" and "v1" not in str(refused.value)
    assert re.fullmatch(r"lcp-secret-[0-9a-f]{32}", new_placeholder())


SERVE = [sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp"]


def serve_args(world, folder) -> list:
    """serve-mcp on stdio over the probe library, confined, whose --config policy binds
    API_KEY to the API's host and gives it to the tool as its config key (no --secret)."""
    config = folder / "config.json"
    config.write_text(json.dumps({"secretprobe": {"sandbox": {"network": policy(world)},
                                                  "key": {"secret": "API_KEY"}}}))
    workspace = folder / "ws"
    workspace.mkdir()
    return [*SERVE, str(LIBS), "--workspace", str(workspace), "--confine", "--config",
            str(config), "--upstream-ca-file", world[0]]


def value_through(world, argv: list, env: dict) -> None:
    """An MCP client's tools/call of tool_call (its key from its config) through the server
    ``argv`` starts (``env``: its environment): the API got the value, the result holds none
    of it."""
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env)

    async def body():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as s:
                await s.initialize()
                return await s.call_tool("tool_call", {"url": url(world, "api"),
                                                       "source": "config"})
    got = anyio.run(body)
    assert not got.is_error, got
    assert VALUE not in json.dumps(got.structured_content)
    assert json.loads(got.structured_content["output"]["body"])["value"] is True


def test_serve_mcp_takes_the_value_from_its_environment_and_refuses_an_unheld_one(world,
                                                                                   open_tmp):
    """serve-mcp --secret NAME=env:VAR with a policy of --config: an MCP client's call gets
    the value to the bound host; a policy binding a secret no --secret gives is exit 2."""
    args = serve_args(world, open_tmp)
    unheld = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert unheld.returncode == 2 and "API_KEY" in unheld.stderr, unheld.stderr
    value_through(world, [*args, "--secret", "API_KEY=env:THE_KEY"],
                  {**os.environ, "THE_KEY": VALUE})


def _intercepted(world):
    """An intercepted connection's relay (egress_tls) between the API server and a socket
    pair, its worker's end driven by hand: (the tool's socket, its TLS over memory, its
    incoming BIO, its outgoing BIO, the proxy's thread).  The TLS handshake is the caller's."""
    import socket

    from lcp_sandbox.backends.local.confine.egress_tls import TlsEnd, relay
    ca_file, _ = world
    proxy_side, tool_side = socket.socketpair()
    upstream = socket.create_connection(("127.0.0.1", port(world, "api")), timeout=10)
    leaf = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    leaf.load_cert_chain(os.path.join(os.path.dirname(ca_file), "server.pem"))

    def proxy() -> None:
        try:
            server = TlsEnd(upstream, ssl.create_default_context(cafile=ca_file),
                            server_side=False, server_hostname="127.0.0.1")
            server.handshake(10)
            worker = TlsEnd(proxy_side, leaf, server_side=True)
            worker.handshake(10)
            relay(worker, server, lambda data: data)
        finally:
            upstream.close()
            proxy_side.close()
    thread = threading.Thread(target=proxy, daemon=True)
    thread.start()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context(cafile=ca_file).wrap_bio(incoming, outgoing,
                                                              server_hostname="127.0.0.1")
    tool_side.settimeout(5)
    while True:
        try:
            tls.do_handshake()
            return tool_side, tls, incoming, outgoing, thread
        except ssl.SSLWantReadError:
            tool_side.sendall(outgoing.read())
            incoming.write(tool_side.recv(65536))


def test_a_request_that_came_with_the_handshake_s_last_bytes_is_answered(world):
    """A worker's client sends its TLS Finished and its first request in one write: the
    proxy's handshake reads both, and the request, already in hand, is relayed at once (it
    waited for bytes that never came until the worker's timeout)."""
    made = world[1]
    tool_side, tls, incoming, outgoing, _ = _intercepted(world)
    tls.write(b"GET /first HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    tool_side.sendall(outgoing.read())                  # Finished and the request, at once
    answer = b""
    while b"\r\n\r\n" not in answer:
        incoming.write(tool_side.recv(65536))           # (socket.timeout: never answered)
        try:
            answer += tls.read(65536)
        except ssl.SSLWantReadError:
            pass
    assert answer.startswith(b"HTTP/1.1 200"), answer
    assert made["api"].seen[-1].split()[-1] == "/first"
    tool_side.close()


def test_a_forged_record_from_the_worker_ends_its_connection_and_nothing_goes_on(world):
    """A hostile worker, its handshake done, sends a record it did not encrypt (a request's
    bytes in an application-data header): the proxy's TLS refuses it, the connection ends
    at once (the proxy's thread too) and the server gets nothing of it."""
    made = world[1]
    tool_side, tls, _, outgoing, thread = _intercepted(world)
    tool_side.sendall(outgoing.read())                  # its Finished
    seen = len(made["api"].seen)
    forged = b"GET /forged HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" + bytes(64)
    tool_side.sendall(b"\x17\x03\x03" + len(forged).to_bytes(2, "big") + forged)
    thread.join(10)
    assert not thread.is_alive()                        # the relay ended, its sockets closed
    rest = b""
    while chunk := tool_side.recv(65536):               # (socket.timeout: left open)
        rest += chunk
    assert len(made["api"].seen) == seen and b"/forged" not in b" ".join(
        x.encode() for x in made["api"].seen)
    tool_side.close()
