"""A network policy as data: which hosts a confined worker may reach through the host's proxy.

    "sandbox": {"network": {"allow": [rule, ...], "deny": [rule, ...],
                            "secrets": {"NAME": ["host:port", ...]}}}   (core/secrets.py)

    rule         host            example.com (that name only, any port)
                 host:port       example.com:443
                 *.domain[:port] api.example.com, a.b.example.com (not example.com itself)
                 IP[:port]       203.0.113.7, 203.0.113.7:8080, [2001:db8::1]:443
                 CIDR[:port]     10.0.0.0/8, 10.1.0.0/16:5432, [fd00::/8]:80

A connection to (name, port), whose name resolved to ``addresses``, is admitted when:
no deny rule matches the name or any of the addresses; an allow rule matches the name (a
name rule for a name, an address rule for an address written as the name); and at least
one address is public or is matched by an allow address rule.  The proxy connects to those
addresses only (Decision.addresses), each in turn: an address that is loopback, private,
link-local (the cloud's metadata service, 169.254.169.254), multicast or otherwise reserved
is never connected to unless it is listed (``localhost`` resolving to ::1 and 127.0.0.1, with
127.0.0.1 listed, reaches 127.0.0.1 alone), and a name cannot be rebound to another address
between the check and the connection.

One spelling of a host, from the request to the socket:

    request target ──► authority_of() ──► canonical_host(): an IP address as ``ipaddress``
    writes it, or a name of letter-digit-hyphen labels (IDNA A-labels checked by ``idna``),
    in lower case, without its final dot; anything else (a control byte, NUL, space,
    percent-escape, empty label, a number the resolver would read as an address) ValueError
         ──► Policy.check() matches that string ──► the proxy resolves and connects to it

Pure: parsing and matching; backends/local/confine/egress_proxy.py runs the proxy that applies it.
"""
from __future__ import annotations

import functools
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import idna

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
_KEYS = ("allow", "deny")
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# A last label the resolver reads as a number (inet_aton: 127.1, 0x7f.1, 2130706433)
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_PORT = re.compile(r"[0-9]{1,5}")
_NAME_MAX = 253
#: A secret's name (core/secrets.py): an environment variable's
_SECRET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: (host, port) a secret may be sent to
Bound = tuple[str, int]


@dataclass(frozen=True)
class Rule:
    """One allow or deny entry, as written and as parsed."""
    text: str
    # None: any port.
    port: Optional[int]
    # A host name, lower case ("" with suffix)
    name: Optional[str] = None
    # "*.example.com": ".example.com".
    suffix: Optional[str] = None
    # An address or CIDR.
    network: Optional[Network] = None

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
    # The host as the rules matched it (canonical_host()): the one the proxy resolves
    host: str = ""
    # Admitted: those of the addresses checked that may be connected to, in their order
    addresses: tuple[Address, ...] = ()


class Policy:
    """A library's rules, parsed once (policy_of()); ``check()`` answers each connection."""

    def __init__(self, allow: tuple[Rule, ...], deny: tuple[Rule, ...]) -> None:
        self.allow, self.deny = allow, deny
        self.size = len(allow) + len(deny)
        # each secret's name: the (host, port) it may be sent to (core/secrets.py)
        self.secrets: dict[str, frozenset[Bound]] = {}

    def check(self, host: str, port: int, addresses: list[Address]) -> Decision:
        """Whether (``host``, ``port``), resolved to ``addresses``, may be reached; a host
        that is not one canonical_host() accepts is refused, whatever the rules."""
        try:
            host = canonical_host(host)
        except ValueError as exc:
            return Decision(False, "malformed host", str(exc))
        literal = _address(host)
        addresses = [_plain(a) for a in addresses]
        for rule in self.deny:
            if (literal is None and rule.matches_name(host, port)) or any(
                    rule.matches_address(a, port) for a in addresses):
                return Decision(False, f"deny {rule.text}", f"{_join(host, port)} is denied "
                                                             f"by the rule {rule.text!r}", host)
        if literal is None:
            named = next((r for r in self.allow if r.matches_name(host, port)), None)
        else:
            named = next((r for r in self.allow if r.matches_address(literal, port)), None)
        if named is None:
            return Decision(False, "no allow rule", f"no allow rule matches {_join(host, port)}",
                            host)
        reachable = tuple(a for a in addresses if a.is_global
                          or any(r.matches_address(a, port) for r in self.allow))
        if addresses and not reachable:
            said = "; ".join(f"{host} resolves to {a}, a {_kind(a)} address that no allow "
                             f"rule lists" for a in addresses)
            return Decision(False, f"unlisted {_kind(addresses[0])} address", said, host)
        return Decision(True, f"allow {named.text}", f"{_join(host, port)}: allow {named.text!r}",
                        host, reachable)


def policy_of(value: Any) -> Policy:
    """The policy of a ``"network"`` setting that is a dict (ValueError/TypeError naming the
    entry that is wrong)."""
    if not isinstance(value, dict):
        raise TypeError(f"'network' must be true, false or a dict of rules "
                        f"({{\"allow\": [...], \"deny\": [...]}}), not {value!r}")
    unknown = [k for k in value if k not in (*_KEYS, "secrets")]
    if unknown:
        raise ValueError(f"'network' has {unknown[0]!r}: its keys are 'allow', 'deny' and "
                         f"'secrets'")
    lists = {}
    for key in _KEYS:
        entries = value.get(key, [])
        if not isinstance(entries, (list, tuple)) or not all(isinstance(e, str) for e in entries):
            raise TypeError(f"'network' {key!r} must be a list of rules (strings), not "
                            f"{entries!r}")
        lists[key] = tuple(rule_of(e, key) for e in entries)
    policy = Policy(lists["allow"], lists["deny"])
    policy.secrets = bindings_of(value.get("secrets"), policy)
    return policy


def secret_name(name: Any, where: str) -> str:
    """A secret's name checked: an environment variable's (ValueError/TypeError naming
    ``where``)."""
    if not isinstance(name, str):
        raise TypeError(f"{where}: a secret's name is a string, not {name!r}")
    if not _SECRET_NAME.fullmatch(name):
        raise ValueError(f"{where}: the secret name {name[:80]!r} is not an environment "
                         f"variable's name (letters, digits, _; at most 64)")
    return name


def bindings_of(value: Any, policy: Policy) -> dict[str, frozenset[Bound]]:
    """A policy's ``"secrets"`` entry checked against its own rules: each name bound to
    at least one "host:port" that an allow rule admits by name (and no deny rule refuses).
    ValueError/TypeError naming the secret and the host."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"'network' 'secrets' is a dict of secret names to lists of "
                        f"\"host:port\", not {value!r}")
    bound = {}
    for name, hosts in value.items():
        secret_name(name, "'network' 'secrets'")
        if not isinstance(hosts, (list, tuple)) or not hosts or not all(
                isinstance(h, str) for h in hosts):
            raise ValueError(f"'network' 'secrets': the secret {name} is bound to no host: "
                             f"give a list of \"host:port\" it may be sent to")
        bound[name] = frozenset(_bound(name, text, policy) for text in hosts)
    return bound


def _bound(name: str, text: str, policy: Policy) -> Bound:
    """One "host:port" of a secret's binding, admitted by the policy's rules by name."""
    try:
        host, port = authority_of(text)
    except ValueError as exc:
        raise ValueError(f"'network' 'secrets': the secret {name} is bound to {text!r}, which "
                         f"is not host:port ({exc})") from None
    decision = policy.check(host, port, [])
    if not decision.admitted:
        raise ValueError(f"'network' 'secrets': the secret {name} is bound to {text!r}, which "
                         f"no allow rule admits ({decision.why})")
    return host, port


def rule_of(text: str, key: str = "allow") -> Rule:
    """One rule parsed (ValueError naming it when it cannot be)."""
    host, port = _split_port(text.strip(), key)
    try:
        net = ipaddress.ip_network(host, strict=False)
    except ValueError:
        net = None
    if net is not None:
        return Rule(text, port, network=net)
    wild = host.startswith("*.")
    try:
        label = canonical_host(_a_labels(host[2:] if wild else host))
    except ValueError:
        label = ""
    if not label:
        raise ValueError(f"'network' {key} rule {text!r} is not a host, *.domain, address or "
                         f"CIDR, with an optional :port")
    return Rule(text, port, suffix="." + label) if wild else Rule(text, port, name=label)


def _a_labels(name: str) -> str:
    """A rule's name with each label that is not ASCII written as its IDNA A-label (what
    clients send: bücher.example is asked for as xn--bcher-kva.example)."""
    if name.isascii():
        return name
    try:
        return ".".join(p if p.isascii() else idna.encode(p.lower()).decode("ascii")
                        for p in name.split("."))
    except idna.IDNAError as exc:
        raise ValueError(str(exc)) from None


# (each connection asks twice, with the same host: a name's labels or an address parsed once)
@functools.lru_cache(maxsize=1024)
def canonical_host(text: str) -> str:
    """The one spelling of a request's host: what the rules match, the resolver is asked
    and the proxy connects to.  An IP address as ``ipaddress`` writes it (no zone), or a name
    in lower case without its final dot, each label 1-63 letters, digits and inner hyphens
    (an ``xn--`` label a valid IDNA A-label), 253 characters at most, whose last label is
    not a number (the resolver would read ``127.1`` or ``0x7f.1`` as an address).  Anything
    else is a ValueError saying why: the resolver and the rules must never read one string
    two ways (a NUL ends a name for the C resolver, not for Python)."""
    shown = repr(text[:200])
    if not text.isascii() or not text.isprintable() or any(c in text for c in " %[]"):
        raise ValueError(f"{shown} is not a host: only ASCII letters, digits, '-', '.' (a name) "
                         f"or an IP address, with no control byte, space or %-escape")
    name = text.lower()[:-1] if text.endswith(".") else text.lower()
    labels = name.split(".")
    # Only what may be an address is parsed as one (a name costs no exception)
    if ":" in text or _NUMBER.fullmatch(labels[-1]):
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            pass
    if len(name) > _NAME_MAX or not all(_LABEL.fullmatch(p) for p in labels):
        raise ValueError(f"{shown} is not a host name: labels of 1-63 letters, digits and "
                         f"inner hyphens, {_NAME_MAX} characters at most, no empty label")
    if _NUMBER.fullmatch(labels[-1]):
        raise ValueError(f"{shown} is not a host name: it ends in a number, and is not an "
                         f"IP address written in full")
    for label in labels:
        if label.startswith("xn--") and not _a_label(label):
            raise ValueError(f"{shown} is not a host name: {label!r} is not an IDNA A-label")
    return name


def _a_label(label: str) -> bool:
    try:
        return bool(idna.encode(idna.decode(label)) == label.encode("ascii"))
    except (idna.IDNAError, UnicodeError):
        return False


def authority_of(text: str, default_port: Optional[int] = None) -> tuple[str, int]:
    """(canonical host, port) of ``host:port`` or ``[IPv6]:port``, as a request names its
    destination; the port may be left out where ``default_port`` is given.  ValueError for
    anything else (an IPv6 address goes in brackets, nothing but a port follows the host)."""
    if text.startswith("["):
        inner, sep, rest = text[1:].partition("]")
        if not sep or not _is_v6(inner):
            raise ValueError(f"{text[:200]!r}: '[' opens an IPv6 address and ']' closes it")
        host = canonical_host(inner)
    else:
        name = text.partition(":")[0]
        host, rest = canonical_host(name), text[len(name):]
    if not rest and default_port is not None:
        return host, default_port
    port = rest[1:]
    if not rest.startswith(":") or not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise ValueError(f"{text[:200]!r} is not host:port (a port of 1-65535)")
    return host, int(port)


def _is_v6(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv6Address)
    except ValueError:
        return False


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


@functools.lru_cache(maxsize=1024)
def _address(host: str) -> Optional[Address]:
    host = host.strip("[]")
    # A name (no ':', not ending in a digit) is not tried as an address: no exception to pay
    if ":" not in host and not host[-1:].isdigit():
        return None
    try:
        return _plain(ipaddress.ip_address(host))
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
