"""Who an HTTP session's tenant is: a hash of its session id, or its signed-in user.

    TenantNames (a random key per server)
      session(sid)          ─► "mcp-s<hmac(sid)>"        a session of its own (no sign-in)
      user(issuer, value)   ─► "mcp-u<hmac(iss, claim)>" every session of one signed-in user
    The workspace of tenant "mcp-X" is <workspace-root>/X.  Neither name holds the session id
    nor the user's claim: a folder's path in a tool's command line (visible to other tenants
    where /proc is) tells nothing that reaches a session, nor who the user is.

    Users: the signed-in users' tenants, each shared by the user's MCP sessions; one with no
    session since --tenant-idle-timeout is handed back to be removed (idle()).

    Policy (--auth-policy FILE): the tools each user may see and call, from the token's
    claims: {"rules": [{"claim": "groups", "value": "eng", "allow": ["lib", "lib.tool"]}]}.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional


class TenantNames:
    """Tenant names that are one-way, keyed hashes (the key: random bytes of this server)."""

    def __init__(self, key: Optional[bytes] = None) -> None:
        self._key = key or os.urandom(32)

    def _hash(self, *parts: str) -> str:
        text = json.dumps(parts).encode()
        return hmac.new(self._key, text, hashlib.sha256).hexdigest()[:40]

    def session(self, sid: str) -> str:
        """The tenant of an anonymous MCP session."""
        return "mcp-s" + self._hash("session", sid)

    def user(self, issuer: str, value: str) -> str:
        """The tenant of a signed-in user: the token's issuer and tenant claim."""
        return "mcp-u" + self._hash("user", issuer, value)


def signed_in(scope: Any) -> Any:
    """The verified AccessToken the guard put in a request's scope (the SDK's
    AuthenticatedUser), or None."""
    user = scope.get("user") if isinstance(scope, dict) else None
    return getattr(user, "access_token", None)


def user_tenant(names: TenantNames, access: Any) -> str:
    """The tenant of a verified token: its ``iss`` and tenant claim (the subject)."""
    issuer = str((access.claims or {}).get("iss", ""))
    return names.user(issuer, str(access.subject))


class Users:
    """The signed-in users' tenants: each one's session (shared), its live MCP sessions,
    and since when it has had none.  Used on the event loop's thread only."""

    def __init__(self, idle_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s, self._clock = idle_s, clock
        self.sessions: dict[str, Any] = {}
        self._live: dict[str, set[str]] = {}
        self._since: dict[str, float] = {}

    def joined(self, tenant: str, sid: str) -> None:
        self._live.setdefault(tenant, set()).add(sid)
        self._since.pop(tenant, None)

    def left(self, tenant: str, sid: str) -> None:
        live = self._live.get(tenant, set())
        live.discard(sid)
        if not live:
            self._live.pop(tenant, None)
            self._since[tenant] = self._clock()

    def idle(self) -> list[Any]:
        """The sessions of the users with none live for idle_s, forgotten here."""
        now = self._clock()
        gone = [t for t, since in self._since.items() if now - since >= self.idle_s]
        for tenant in gone:
            del self._since[tenant]
        return [s for s in (self.sessions.pop(t, None) for t in gone) if s is not None]

    def all(self) -> list[Any]:
        """Every user's session, forgotten here (the server ends)."""
        out = list(self.sessions.values())
        self.sessions.clear()
        self._live.clear()
        self._since.clear()
        return out


# ---------------------------------------------------------------- tools per role
class PolicyError(ValueError):
    """A policy file that cannot be used: the server does not start."""


@dataclass(frozen=True)
class Rule:
    claim: str
    value: str
    allow: frozenset


_RULE_KEYS = {"claim", "value", "allow"}


def read_policy(path: str) -> list[Rule]:
    """The rules of an --auth-policy file (strict JSON: a key twice is refused)."""
    from ..core import strict_json
    try:
        with open(path, encoding="utf-8") as f:
            data = strict_json.load(f)
    except OSError as exc:
        raise PolicyError(exc.strerror or str(exc)) from None
    except ValueError as exc:
        raise PolicyError(str(exc)) from None
    if not isinstance(data, dict) or set(data) != {"rules"}:
        keys = sorted(data) if isinstance(data, dict) else type(data).__name__
        raise PolicyError(f'must be an object with the one key "rules" (found {keys})')
    if not isinstance(data["rules"], list):
        raise PolicyError('"rules" must be a list of rules')
    return [_rule(i, r) for i, r in enumerate(data["rules"])]


def _rule(i: int, raw: Any) -> Rule:
    where = f"rules[{i}]"
    if not isinstance(raw, dict):
        raise PolicyError(f"{where} must be an object")
    if set(raw) != _RULE_KEYS:
        unknown, missing = sorted(set(raw) - _RULE_KEYS), sorted(_RULE_KEYS - set(raw))
        raise PolicyError(f"{where}: unknown keys {unknown}, missing keys {missing} (a rule "
                          f'has "claim", "value" and "allow")')
    for key in ("claim", "value"):
        if not isinstance(raw[key], str) or not raw[key]:
            raise PolicyError(f"{where}.{key} must be a non-empty string")
    allow = raw["allow"]
    if not isinstance(allow, list) or not all(isinstance(a, str) and _name_ok(a) for a in allow):
        raise PolicyError(f'{where}.allow must be a list of "library" or "library.tool" names')
    return Rule(raw["claim"], raw["value"], frozenset(allow))


def _name_ok(name: str) -> bool:
    parts = name.split(".")
    return 1 <= len(parts) <= 2 and all(p and p.strip() == p and " " not in p for p in parts)


def _matches(rule: Rule, claims: dict) -> bool:
    have = claims.get(rule.claim)
    # OAuth's scope (and Entra ID's scp) is one string of space-separated scopes.
    if rule.claim in ("scope", "scp") and isinstance(have, str):
        have = have.split()
    if isinstance(have, list):
        return rule.value in have
    return isinstance(have, str) and have == rule.value


def allowed(rules: list[Rule], claims: dict) -> frozenset:
    """The names (libraries and library.tool) the rules matching ``claims`` allow."""
    out: set[str] = set()
    for rule in rules:
        if _matches(rule, claims):
            out |= rule.allow
    return frozenset(out)


def permits(names: frozenset, library: str, tool: str) -> bool:
    return library in names or f"{library}.{tool}" in names


NOT_ALLOWED = "Tool {name!r} is not allowed for this user (--auth-policy)."
