"""A network policy as data: which hosts a confined worker may reach through the host's proxy.

    "sandbox": {"network": {"allow": [rule, ...], "deny": [rule, ...]}}

    rule         host            example.com (that name only, any port)
                 host:port       example.com:443
                 *.domain[:port] api.example.com, a.b.example.com (not example.com itself)
                 IP[:port]       203.0.113.7, 203.0.113.7:8080, [2001:db8::1]:443
                 CIDR[:port]     10.0.0.0/8, 10.1.0.0/16:5432, [fd00::/8]:80

A connection to (name, port), whose name resolved to ``addresses``, is admitted when:
no deny rule matches the name or any of the addresses; an allow rule matches the name (a
name rule for a name, an address rule for an address written as the name); and each
address is public or is matched by an allow address rule.  So a name that resolves to
loopback, a private, link-local (the cloud's metadata service, 169.254.169.254), multicast
or otherwise reserved address is refused unless that address is listed, and the proxy
connects only to addresses it checked: a name cannot be rebound to another address between
the check and the connection.

Pure: parsing and matching; backends/local/egress.py runs the proxy that applies it.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any, Optional, Union

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
_KEYS = ("allow", "deny")


@dataclass(frozen=True)
class Rule:
    """One allow or deny entry, as written and as parsed."""
    text: str
    port: Optional[int]                   # None: any port
    name: Optional[str] = None            # a host name, lower case ("" with suffix)
    suffix: Optional[str] = None          # "*.example.com": ".example.com"
    network: Optional[Network] = None     # an address or CIDR

    def matches_name(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.suffix is not None:
            return host.endswith(self.suffix)
        return self.name == host

    def matches_address(self, address: Address, port: int) -> bool:
        return (self.network is not None and (self.port is None or self.port == port)
                and address.version == self.network.version and address in self.network)


@dataclass(frozen=True)
class Decision:
    """The proxy's answer for one connection: admitted or not; ``rule``, the rule that
    decided or the reason there was none (few distinct values: what metrics() counts by);
    ``why``, the sentence the tool reads, naming the destination."""
    admitted: bool
    rule: str
    why: str


class Policy:
    """A library's rules, parsed once (policy_of()); ``check()`` answers each connection."""

    def __init__(self, allow: tuple[Rule, ...], deny: tuple[Rule, ...]) -> None:
        self.allow, self.deny = allow, deny
        self.size = len(allow) + len(deny)

    def check(self, host: str, port: int, addresses: list[Address]) -> Decision:
        """Whether (``host``, ``port``), resolved to ``addresses``, may be reached."""
        host = host.lower().rstrip(".")
        literal = _address(host)
        addresses = [_plain(a) for a in addresses]
        for rule in self.deny:
            if (literal is None and rule.matches_name(host, port)) or any(
                    rule.matches_address(a, port) for a in addresses):
                return Decision(False, f"deny {rule.text}", f"{_join(host, port)} is denied "
                                                             f"by the rule {rule.text!r}")
        if literal is None:
            named = next((r for r in self.allow if r.matches_name(host, port)), None)
        else:
            named = next((r for r in self.allow if r.matches_address(literal, port)), None)
        if named is None:
            return Decision(False, "no allow rule", f"no allow rule matches {_join(host, port)}")
        for address in addresses:
            if not address.is_global and not any(r.matches_address(address, port)
                                                 for r in self.allow):
                kind = _kind(address)
                return Decision(False, f"unlisted {kind} address",
                                f"{host} resolves to {address}, a {kind} address that no "
                                f"allow rule lists")
        return Decision(True, f"allow {named.text}", f"{_join(host, port)}: allow {named.text!r}")


def policy_of(value: Any) -> Policy:
    """The policy of a ``"network"`` setting that is a dict (ValueError/TypeError naming the
    entry that is wrong)."""
    if not isinstance(value, dict):
        raise TypeError(f"'network' must be true, false or a dict of rules "
                        f"({{\"allow\": [...], \"deny\": [...]}}), not {value!r}")
    unknown = [k for k in value if k not in _KEYS]
    if unknown:
        raise ValueError(f"'network' has {unknown[0]!r}: its keys are 'allow' and 'deny'")
    lists = {}
    for key in _KEYS:
        entries = value.get(key, [])
        if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
            raise TypeError(f"'network' {key!r} must be a list of rules (strings), not "
                            f"{entries!r}")
        lists[key] = tuple(rule_of(e, key) for e in entries)
    return Policy(lists["allow"], lists["deny"])


def rule_of(text: str, key: str = "allow") -> Rule:
    """One rule parsed (ValueError naming it when it cannot be)."""
    host, port = _split_port(text.strip(), key)
    try:
        net = ipaddress.ip_network(host, strict=False)
    except ValueError:
        net = None
    if net is not None:
        return Rule(text, port, network=net)
    name = host.lower().rstrip(".")
    wild = name.startswith("*.")
    label = name[2:] if wild else name
    if not label or not all(_good_label(p) for p in label.split(".")):
        raise ValueError(f"'network' {key} rule {text!r} is not a host, *.domain, address or "
                         f"CIDR, with an optional :port")
    return Rule(text, port, suffix="." + label) if wild else Rule(text, port, name=label)


def _split_port(text: str, key: str) -> tuple[str, Optional[int]]:
    """("host or address", port or None) of a rule; IPv6 goes in brackets with a port."""
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"'network' {key} rule {text!r}: '[address]:port' is unclosed")
        return host, _port(rest[1:], text, key) if rest else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, _port(port, text, key)
    return text, None


def _port(text: str, rule: str, key: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError(f"'network' {key} rule {rule!r}: the port {text!r} is not 1-65535")
    return int(text)


def _good_label(label: str) -> bool:
    return 0 < len(label) < 64 and all(c.isalnum() or c in "-_" for c in label)


def _address(host: str) -> Optional[Address]:
    try:
        return _plain(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def _plain(address: Address) -> Address:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it reaches."""
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def _kind(address: Address) -> str:
    for kind, test in (("loopback", address.is_loopback),
                       ("link-local", address.is_link_local),
                       ("private", address.is_private), ("multicast", address.is_multicast)):
        if test:
            return kind
    return "reserved"


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
