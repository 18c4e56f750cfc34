"""Secrets the worker never holds: names, bindings to hosts, placeholders and their swap.

    host:   Supervisor(secrets={"NAME": "value"}), SandboxedBinding(secrets=...)
    policy: "sandbox": {"network": {"allow": [...], "secrets": {"NAME": ["host:port", ...]}}}
    worker: NAME=<placeholder> in its environment; a host_tool_configs value
            {"secret": "NAME"} arrives as the same placeholder string
    proxy:  a request head to a host NAME is bound to: the placeholder in a header value or
            in the target's query becomes the value (Swap.head()); the placeholder in any
            head to another host: refused (SecretMisuse), counted and logged by NAME

A placeholder is random, per worker, and means nothing outside the proxy that made it: a
tool that sends it anywhere sends noise.  Bodies are never swapped (a server may echo a body
back, and the value would reach the worker).

Pure: checking and swapping (a policy's bindings are parsed with its rules, in
core/egress_rules.py); backends/local/confine/egress_secrets.py terminates TLS for
the bound hosts and applies Swap to each request.
"""
from __future__ import annotations

import re
import secrets as _random
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from .egress_rules import Bound, secret_name

#: A value that could end a header line, or hold a NUL, would change what is sent
_UNSAFE = re.compile(r"[\x00-\x1f\x7f]")
VALUE_MAX = 16 * 1024
#: A request head's headers, as sent: (name, value)
Headers = list[tuple[bytes, bytes]]
PLACEHOLDER_PREFIX = "lcp-secret-"


class SecretMisuse(Exception):
    """A request head carries a placeholder to a host its secret is not bound to: the
    secret's ``name`` (never its value) and the sentence the tool reads."""

    def __init__(self, name: str, why: str) -> None:
        super().__init__(why)
        self.name = name


def host_secrets(values: Any, where: str) -> dict[str, str]:
    """The host's secrets (``secrets=``) checked: names as secret_name(), values non-empty
    strings of at most VALUE_MAX characters with no control character.  The error never
    quotes a value."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise TypeError(f"{where} is a dict of secret names to values, not a "
                        f"{type(values).__name__}")
    checked = {}
    for name, value in values.items():
        secret_name(name, where)
        if not isinstance(value, str) or not value:
            raise TypeError(f"{where}: the secret {name} must be a non-empty string")
        if len(value) > VALUE_MAX or _UNSAFE.search(value):
            raise ValueError(f"{where}: the secret {name} has a control character or is over "
                             f"{VALUE_MAX} characters: it could not go in a header as it is")
        checked[name] = value
    return checked


#: Where a host gives a secret's value, as a settings error says it
GIVE_IT = "give it in Supervisor(secrets=...) or SandboxedBinding(secrets=...)"


def settled(network: Any, configs: Any, held: Iterable[str], library: str,
            give_it: str = GIVE_IT) -> None:
    """ValueError naming what is wrong with a library's secrets: one its policy
    (``network``) binds that the host holds no value of (``held``: the names it has; the
    error says ``give_it``), or one its host_tool_configs entry (``configs``) refers to that
    the policy does not bind."""
    bound = set(network.get("secrets") or {}) if isinstance(network, dict) else set()
    unbound = sorted(used_in(configs) - bound)
    if unbound:
        raise ValueError(f"host_tool_configs[{library!r}] refers to the secret {unbound[0]}, "
                         f"which its network policy binds to no host (add it to "
                         f"\"network\": {{\"secrets\": {{...}}}})")
    missing = sorted(bound - set(held))
    if missing:
        raise ValueError(f"the network policy of {library} binds the secret {missing[0]}, "
                         f"which the host holds no value of: {give_it}")


def used_in(configs: Any) -> set[str]:
    """The secret names a library's host_tool_configs refer to ({"secret": "NAME"})."""
    found: set[str] = set()
    if is_reference(configs):
        found.add(configs["secret"])
    elif isinstance(configs, dict):
        for value in configs.values():
            found |= used_in(value)
    elif isinstance(configs, (list, tuple)):
        for value in configs:
            found |= used_in(value)
    return found


def is_reference(value: Any) -> bool:
    """Whether ``value`` is a host_tool_configs reference to a secret: {"secret": "NAME"}."""
    return (isinstance(value, dict) and len(value) == 1 and "secret" in value
            and isinstance(value["secret"], str))


def with_placeholders(configs: Any, placeholders: Mapping[str, str]) -> Any:
    """``configs`` with each {"secret": "NAME"} replaced by NAME's placeholder."""
    if is_reference(configs):
        return placeholders[configs["secret"]]
    if isinstance(configs, dict):
        return {k: with_placeholders(v, placeholders) for k, v in configs.items()}
    if isinstance(configs, list):
        return [with_placeholders(v, placeholders) for v in configs]
    return configs


def new_placeholder() -> str:
    """A placeholder: random (128 bits), meaningless outside the proxy that made it."""
    return PLACEHOLDER_PREFIX + _random.token_hex(16)


@dataclass(frozen=True)
class _Held:
    name: str
    value: bytes
    hosts: frozenset[Bound]


class Swap:
    """One worker's secrets, by placeholder: what the proxy swaps in its request heads."""

    def __init__(self, held: Iterable[tuple[str, str, str, frozenset[Bound]]]) -> None:
        """``held``: (placeholder, name, value, hosts) for each secret of the worker."""
        self._by_placeholder = {p.encode(): _Held(n, v.encode(), h) for p, n, v, h in held}
        self.hosts = frozenset(h for held_ in self._by_placeholder.values()
                               for h in held_.hosts)

    def head(self, host: str, port: int, target: bytes,
             headers: Headers) -> Optional[tuple[bytes, Headers]]:
        """A request head to (``host``, ``port``) with its placeholders swapped: the new
        (target, headers), or None when it carries none.  A placeholder in the target's
        query or a header value is swapped if its secret is bound to (host, port);
        SecretMisuse if it is not, or if a placeholder stands anywhere else in the head."""
        if not self._by_placeholder or not _mentions(target, headers):
            return None
        path, mark, query = target.partition(b"?")
        self._refuse_in(host, port, path, *(name for name, _ in headers))
        query = self._swapped(host, port, query)
        headers = [(name, self._swapped(host, port, value)) for name, value in headers]
        return path + mark + query, headers

    def refuse_any(self, host: str, port: int, *parts: bytes) -> None:
        """SecretMisuse if a placeholder stands in ``parts`` (a CONNECT head: no secret
        goes in one)."""
        self._refuse_in(host, port, *parts)

    def _swapped(self, host: str, port: int, data: bytes) -> bytes:
        if PLACEHOLDER_PREFIX.encode() not in data:
            return data
        for placeholder, held in self._by_placeholder.items():
            if placeholder in data:
                if (host, port) not in held.hosts:
                    raise _misuse(held.name, host, port)
                data = data.replace(placeholder, held.value)
        return data

    def _refuse_in(self, host: str, port: int, *parts: bytes) -> None:
        for part in parts:
            for placeholder, held in self._by_placeholder.items():
                if placeholder in part:
                    raise _misuse(held.name, host, port, where=" where no secret is swapped")


def _mentions(target: bytes, headers: Headers) -> bool:
    prefix = PLACEHOLDER_PREFIX.encode()
    return prefix in target or any(prefix in n or prefix in v for n, v in headers)


def _misuse(name: str, host: str, port: int, where: str = "") -> SecretMisuse:
    return SecretMisuse(name, f"lcp-sandbox secrets: the placeholder of the secret {name} "
                              f"was sent to {host}:{port}{where}; the secret is bound to "
                              f"other hosts only, and the request was not forwarded")
