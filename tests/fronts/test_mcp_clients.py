"""``serve-mcp --transport http``: who a client is, for --max-sessions-per-client.

A client is its bearer token when the server has one, else its peer's address: every
loopback address one client, X-Forwarded-For ignored unless --forwarded-allow-ips names the
proxy that writes it.  Real servers on 127.0.0.1 (a free port each), raw HTTP (httpx2) from
127.0.0.1 and from other loopback addresses; an attacker varies its headers and its source
address to open more sessions than its cap.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import pytest
from conftest import FIXTURES, poll, stop_server

pytest.importorskip("mcp")

import httpx2  # noqa: E402

from lcp_sandbox.fronts import mcp_cli  # noqa: E402
from lcp_sandbox.fronts.mcp_limits import client_of  # noqa: E402

LIBS = FIXTURES / "mcp_load_libs"
SERVE = [sys.executable, "-m", "lcp_sandbox.fronts.cli", "serve-mcp"]
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "clients-test", "version": "1"}}}
# uvicorn reads this when proxy headers are on: set to trust everyone, it must change nothing.
ENV = {**{k: v for k, v in os.environ.items() if k != "LCP_SANDBOX_MCP_TOKEN"},
       "FORWARDED_ALLOW_IPS": "*"}


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: list


@contextmanager
def serving(tmp_path: Path, *args: str, token: Optional[str] = None) -> Iterator[Server]:
    extra = list(args)
    if token:
        (tmp_path / "token").write_text(token)
        extra += ["--token-file", str(tmp_path / "token")]
    proc = subprocess.Popen([*SERVE, str(LIBS), "--transport", "http", "--port", "0",
                             "--workspace-root", str(tmp_path / "sessions"), "-v", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "serving http" in line:
                ready.set()
        ready.set()
    threading.Thread(target=pump, daemon=True).start()
    try:
        assert ready.wait(60) and proc.poll() is None, "".join(lines)
        url = next(m.group(1) for line in lines if (m := re.search(r"serving (http://\S+)", line)))
        yield Server(url, proc, lines)
    finally:
        stop_server(proc)


@contextmanager
def from_address(address: str) -> Iterator[httpx2.Client]:
    """An HTTP client whose connections come from ``address`` (a loopback one here)."""
    with httpx2.Client(timeout=30, transport=httpx2.HTTPTransport(local_address=address)) as c:
        yield c


def opening(c: httpx2.Client, srv: Server, headers: Optional[dict] = None) -> httpx2.Response:
    """An initialize: the request that opens a session."""
    return c.post(srv.url, headers={**ACCEPT, **(headers or {})}, json=INIT)


def opened(r: httpx2.Response) -> bool:
    """Whether ``r`` opened a session (200 and its id), or was refused at the client's cap."""
    if r.status_code == 200 and r.headers.get("mcp-session-id"):
        return True
    assert r.status_code == 429, (r.status_code, r.text)
    assert "mcp-session-id" not in r.headers and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == -32030
    return False


def ending(c: httpx2.Client, srv: Server, r: httpx2.Response, headers: Optional[dict] = None):
    return c.delete(srv.url, headers={**ACCEPT, **(headers or {}),
                                      "mcp-session-id": r.headers["mcp-session-id"]})


SPOOFS = [{"X-Forwarded-For": "203.0.113.1"}, {"X-Forwarded-For": "198.51.100.2, 203.0.113.2"},
          {"X-Forwarded-For": "2001:db8::3"}, {"Forwarded": "for=203.0.113.4"},
          {"X-Real-IP": "203.0.113.5"}]


# ---------------------------------------------------------------- the attack
def test_forwarded_headers_and_other_loopback_addresses_are_the_same_client(tmp_path):
    """--max-sessions-per-client 2, no token, no --forwarded-allow-ips (and uvicorn's own
    FORWARDED_ALLOW_IPS=* in the environment): sessions opened with made-up forwarded
    headers, or from 127.0.0.2-4 and ::1, all count for the one loopback client."""
    with serving(tmp_path, "--max-sessions-per-client", "2") as srv, \
            httpx2.Client(timeout=30) as c:
        held = [opening(c, srv) for _ in range(2)]
        assert all(opened(r) for r in held)
        assert not any(opened(opening(c, srv, h)) for h in SPOOFS)
        for address in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
            with from_address(address) as other:
                assert not opened(opening(other, srv))
                assert not opened(opening(other, srv, SPOOFS[0]))
        # One place given back is the loopback client's, whichever address takes it.
        assert ending(c, srv, held[0]).status_code in (200, 204)
        with from_address("127.0.0.3") as other:
            assert poll(lambda: opened(opening(other, srv)))
        assert not opened(opening(c, srv))


def test_over_ipv6_loopback_too(tmp_path):
    """Bound to ::1 (which uvicorn trusts by default as a proxy), a forwarded header
    makes no other client either."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError as exc:
        pytest.skip(f"no IPv6 loopback on this host: {exc}")
    with serving(tmp_path, "--host", "::1", "--max-sessions-per-client", "1") as srv, \
            httpx2.Client(timeout=30) as c:
        assert opened(opening(c, srv))
        assert not opened(opening(c, srv, SPOOFS[2]))


# ---------------------------------------------------------------- a trusted proxy
def test_with_forwarded_allow_ips_the_proxy_s_header_names_the_client(tmp_path):
    """--forwarded-allow-ips 127.0.0.1: what that proxy appends to X-Forwarded-For is the
    client (an entry the client wrote before it is not); another peer's header is ignored;
    an IPv6 client counts by its /64, a loopback one as loopback."""
    args = ("--max-sessions-per-client", "1", "--forwarded-allow-ips", "127.0.0.1")
    with serving(tmp_path, *args) as srv, httpx2.Client(timeout=30) as proxy:
        def through(forwarded: str) -> bool:
            return opened(opening(proxy, srv, {"X-Forwarded-For": forwarded}))
        assert through("203.0.113.1")
        assert not through("203.0.113.1")
        assert not through("198.51.100.9, 203.0.113.1")      # a client's own entry, leftmost
        assert through("203.0.113.2")
        assert through("2001:db8::1")
        assert not through("2001:db8::ffff")                # the same /64
        assert through("2001:db8:0:1::1")
        # Not the proxy: its header is ignored, it is the loopback client.
        with from_address("127.0.0.2") as other:
            assert opened(opening(other, srv, {"X-Forwarded-For": "203.0.113.3"}))
            assert not opened(opening(other, srv, {"X-Forwarded-For": "203.0.113.4"}))
        assert not through("127.0.0.9")                     # loopback, behind the proxy too
        assert not through("::ffff:127.0.0.1")
        assert not opened(opening(proxy, srv))              # the proxy itself: loopback


@pytest.mark.parametrize("value, said", [
    ("*", "'*' would let every client name itself any address"),
    ("", "'' is not an IP address or network"),
    ("127.0.0.1,", "'' is not an IP address or network"),
    ("10.0.0.1/8", "'10.0.0.1/8' is not an IP address or network (10.0.0.1/8 has host bits set)"),
    ("proxy.example", "'proxy.example' is not an IP address or network"),
    ("[::1]", "'[::1]' is not an IP address or network"),
    ("unix:/run/proxy.sock", "'unix:/run/proxy.sock' is not an IP address or network"),
])
def test_a_wrong_forwarded_allow_ips_stops_the_server_before_it_serves(tmp_path, value, said):
    p = subprocess.run([*SERVE, str(LIBS), "--transport", "http", "--port", "0",
                        "--workspace-root", str(tmp_path / "s"), "--forwarded-allow-ips", value],
                       capture_output=True, text=True, timeout=60, env=ENV)
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith(f"lcp-sandbox serve-mcp: --forwarded-allow-ips {value!r}: ")
    assert said in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not (tmp_path / "s").exists()


def test_forwarded_allow_ips_is_given_to_uvicorn_in_one_spelling():
    assert mcp_cli.forwarded_allow_ips(None) is None
    assert mcp_cli.forwarded_allow_ips(" 127.0.0.1, 10.0.0.0/8,::1 ,fd00::/8") == \
        "127.0.0.1,10.0.0.0/8,::1,fd00::/8"


# ---------------------------------------------------------------- a bearer token
def test_with_a_token_every_holder_of_it_is_one_client_whatever_its_address(tmp_path):
    """The token is the client: from other addresses and with forwarded headers, its
    holders share its cap; a wrong token takes no place (401).  Neither the server's log
    nor /metrics holds the token."""
    token = "t0ken-of-the-clients-test"
    auth = {"Authorization": f"Bearer {token}"}
    with serving(tmp_path, "--max-sessions-per-client", "2", "--metrics", token=token) as srv, \
            httpx2.Client(timeout=30) as c:
        held = [opening(c, srv, auth) for _ in range(2)]
        assert all(opened(r) for r in held)
        for address in ("127.0.0.2", "127.0.0.3"):
            with from_address(address) as other:
                assert not opened(opening(other, srv, auth))
                assert not opened(opening(other, srv, {**auth, **SPOOFS[0]}))
                r = opening(other, srv, {"Authorization": "Bearer another-token"})
                assert r.status_code == 401
        assert ending(c, srv, held[0], auth).status_code in (200, 204)
        with from_address("127.0.0.4") as other:
            assert poll(lambda: opened(opening(other, srv, auth)))
        metrics = c.get(srv.url.rsplit("/", 1)[0] + "/metrics", headers=auth).text
        assert 'reason="client_sessions"' in metrics
    said = "".join(srv.log) + metrics
    assert token not in said and hashlib.sha256(token.encode()).hexdigest() not in said


def test_a_token_s_client_is_a_keyed_hash_of_it_and_two_tokens_are_two_clients():
    """Two clients with different tokens are two clients, the same token one; what names
    it holds neither the token nor its plain hash, and another server's key differs."""
    salt, other_salt = os.urandom(16), os.urandom(16)
    a, b = b"first-token", b"second-token"
    assert client_of("127.0.0.1", a, salt) == client_of("203.0.113.7", a, salt)
    assert client_of("127.0.0.1", a, salt) != client_of("127.0.0.1", b, salt)
    assert client_of("127.0.0.1", a, salt) != client_of("127.0.0.1", a, other_salt)
    for token in (a, b):
        key = client_of(None, token, salt)
        assert token.decode() not in key and hashlib.sha256(token).hexdigest()[:32] not in key


@pytest.mark.parametrize("peer, client", [
    ("127.0.0.1", "loopback"), ("127.0.0.2", "loopback"), ("127.255.255.254", "loopback"),
    ("::1", "loopback"), ("::ffff:127.0.0.3", "loopback"), ("[::1]", "loopback"),
    ("203.0.113.1", "address 203.0.113.1"), ("::ffff:203.0.113.1", "address 203.0.113.1"),
    ("2001:db8::1", "address 2001:db8::/64"), ("2001:db8::abcd:1", "address 2001:db8::/64"),
    ("2001:db8:0:1::1", "address 2001:db8:0:1::/64"), (None, "address unknown"),
])
def test_addresses_one_machine_can_take_at_will_are_one_client(peer, client):
    assert client_of(peer, None, b"salt") == client

