"""No request head names one host to the rules and another to the resolver or the socket.

Heads are generated around the spellings that can split a name in two (a NUL, which ends a
name for the C resolver and not for Python; %-escapes, spaces, brackets, userinfo, numbers
the resolver reads as addresses, non-ASCII dots), fed to the proxy's own serve() and
admission, with its resolver and its connect recorded.  A fixed seed and a few seconds.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lcp_sandbox.backends.local.confine import egress_conn, egress_proxy
from lcp_sandbox.backends.metrics import Metrics
from lcp_sandbox.core.egress_rules import canonical_host, policy_of

RULES = ["*.example.com", "example.com:443", "127.0.0.1", "[::1]", "10.0.0.0/8:80"]
POLICY = policy_of({"allow": RULES})
# What the resolver answers (by the name it reads: up to a NUL); any other name is public
NAMES = {"vm": ["127.0.0.1"], "localhost": ["127.0.0.1", "::1"], "db.example.com": ["10.1.2.3"]}
PUBLIC = "93.184.215.14"
FIXED = settings(derandomize=True, database=None, deadline=None, max_examples=1000,
                 suppress_health_check=[HealthCheck.too_slow])

PREFIXES = ["vm", "localhost", "3fff::7", "127.0.0.1", "::1", "0x7f.1", "127.1", "2130706433",
            "10.0.0.1", "evil.org", "xn--bcher-kva", "xn--abc", "db", "a", ""]
SEPARATORS = ["\x00", "%00", "%2e", " ", "\t", "\r", "\n", "@", "#", "/", "\\", "?", ":", "[",
              "]", ".", "..", "-", "_", "\u3002", "\uff0e", "\u00e9", "\x7f", "\xff", ";", ","]
SUFFIXES = [".example.com", ".example.com.", "example.com", ".EXAMPLE.com", ".example.com:443",
            ".example.com%00", ""]

hosts = st.builds(
    lambda parts, suffix: "".join(parts) + suffix,
    st.lists(st.one_of(st.sampled_from(PREFIXES), st.sampled_from(SEPARATORS),
                       st.text(alphabet="abz09-.", max_size=5)), max_size=5),
    st.sampled_from(SUFFIXES))
forms = st.sampled_from([
    "CONNECT {h}:{p} HTTP/1.1\r\nHost: {h}:{p}\r\n\r\n", "CONNECT [{h}]:{p} HTTP/1.0\r\n\r\n",
    "CONNECT {h}:{p} HTTP/1.0\r\n\r\n", "GET http://{h}:{p}/x HTTP/1.1\r\nHost: other.org\r\n\r\n",
    "GET http://{h}/x?q HTTP/1.0\r\n\r\n", "GET HTTP://{h} HTTP/1.0\r\n\r\n",
    "GET http://[{h}]:{p}/ HTTP/1.0\r\n\r\n"])


class Recorded:
    """The proxy's resolver and connect, recorded (nothing is resolved or connected)."""

    def __init__(self) -> None:
        self.resolved: list[tuple[str, int, list]] = []
        self.connected: list[tuple[list, int]] = []

    def resolve(self, host: str, port: int) -> list:
        name = host.split("\0")[0]
        try:
            found = [ipaddress.ip_address(name)]
        except ValueError:
            found = [ipaddress.ip_address(a) for a in NAMES.get(name, [PUBLIC])]
        self.resolved.append((host, port, found))
        return found

    def connect(self, addresses: list, port: int) -> socket.socket:
        self.connected.append((list(addresses), port))
        raise egress_conn.ProxyRefusal(502, "not connected (fuzz)")


# One proxy and one worker for every example (a worker's refusals are logged 20 times, then
# counted only)
PROXY = egress_proxy.EgressProxy(Metrics())
IDENT = egress_proxy.Identity("fuzz", "lib", POLICY)


def served(head: bytes) -> Recorded:
    """What the proxy resolved and connected to for ``head``, one connection."""
    seen = Recorded()
    client, server = socket.socketpair()
    with client, server, mock.patch.object(egress_proxy, "_resolve", seen.resolve), \
            mock.patch.object(egress_conn, "connect", seen.connect):
        client.sendall(head)
        client.shutdown(socket.SHUT_WR)
        egress_conn.serve(server, lambda host, port: PROXY._admit(IDENT, host, port))
    return seen


def one_name(seen: Recorded) -> None:
    """Each name resolved is spelled once (the resolver and the rules read it alike) and
    admitted by the rules as it is; each connection goes to the addresses it resolved to."""
    for host, port, _ in seen.resolved:
        assert re.fullmatch(r"[a-z0-9.:-]+", host) and canonical_host(host) == host, host
        assert POLICY.check(host, port, []).admitted, host
    assert len(seen.connected) <= len(seen.resolved) <= 1
    for (addresses, port), (host, _, found) in zip(seen.connected, seen.resolved, strict=False):
        assert addresses == found and POLICY.check(host, port, addresses).admitted


def written(host: str, form: str) -> set:
    """The hosts a request names as written (what the rules matched and was resolved must be
    one): a URL's host ends at its path, query or fragment, and may end with a port."""
    if form.startswith("GET"):
        host = re.split(r"[/?#]", host)[0]
    named = re.fullmatch(r"(.*):[0-9]+", host)
    return {spelled(h) for h in (host, named and named[1]) if h}


def spelled(host: str) -> str:
    """Lower case, one final dot dropped, an IP address as ipaddress writes it."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()[:-1] if host.endswith(".") else host.lower()


def test_no_request_matches_one_name_and_reaches_another():
    @FIXED
    @given(hosts, forms, st.sampled_from([80, 443, 8080]),
           st.sampled_from(["utf-8", "latin-1"]))
    def check(host: str, form: str, port: int, encoding: str) -> None:
        head = form.format(h=host, p=port).encode(encoding, "replace")
        seen = served(head)
        one_name(seen)
        for resolved, _, _ in seen.resolved:
            assert resolved in written(host, form), (head, resolved)

    check()


def test_no_byte_string_matches_one_name_and_reaches_another():
    @FIXED
    @given(st.one_of(st.just(b""), st.binary(max_size=40)), hosts,
           st.one_of(st.sampled_from([b" HTTP/1.0", b" HTTP/1.1\r\nHost: a"]),
                     st.binary(max_size=40)))
    def check(before: bytes, host: str, after: bytes) -> None:
        one_name(served(before + f"CONNECT {host}:443".encode("utf-8", "replace") + after
                        + b"\r\n\r\n"))

    check()


def test_the_old_splits_are_among_what_is_tried():
    """The spellings that split a name before are refused without a lookup."""
    for head in (b"CONNECT 3fff::7\x00.example.com:443 HTTP/1.1\r\nHost: a.example.com\r\n\r\n",
                 b"GET http://vm\x00.example.com:8080/ HTTP/1.1\r\nHost: vm.example.com\r\n\r\n"):
        seen = served(head)
        assert seen.resolved == [] and seen.connected == [], head
