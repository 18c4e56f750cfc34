"""What keeps one MCP client from taking the server: caps and rates, per session.

    new session (initialize)   the SDK's manager      over --max-sessions ─► 503 + Retry-After
                               ClientSessions.admit() over --max-sessions-per-client (per
                                                       client_of: the signed-in user, else
                                                       the bearer token, else the address)
                                                       ─► 429 + Retry-After
    tools/call                 TokenBucket.take()     over --rate-limit   ─► 429 + Retry-After
                               (per session; one for   (or a JSON-RPC error with the delay)
                               all of a user's)
                               calls semaphore         over --max-calls-per-session: waits its
                                                       turn; other sessions are not slowed

Pure bookkeeping on the event loop's thread: no locks, the clock is passed in.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
from dataclasses import dataclass
from typing import Any, Optional

#: Live sessions one client (its bearer token, else its address) may hold by default.
DEFAULT_SESSIONS_PER_CLIENT = 16


def default_max_sessions() -> int:
    """Sessions cost worker processes (a few MB each, one per library a session uses):
    one session per 32 MiB of the machine's memory, at least 16, at most 4,096."""
    import psutil
    return max(16, min(4096, psutil.virtual_memory().total // (32 << 20)))


@dataclass
class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up; a call takes one."""
    rate: float
    burst: float
    tokens: float = -1.0
    stamp: float = 0.0

    def take(self, now: float) -> Optional[float]:
        """None when a token was taken, else the seconds until one will be there."""
        # A new bucket starts full.
        if self.tokens < 0:
            self.tokens, self.stamp = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return None
        return (1.0 - self.tokens) / self.rate


def retry_after(seconds: float) -> str:
    """A Retry-After header value: whole seconds, at least 1."""
    return str(max(1, math.ceil(seconds)))


#: The JSON-RPC error code of a tools/call over its session's rate (HTTP: with a 429).
RATE_LIMITED = -32029


def rate_error(rate: float, wait: float) -> dict[str, Any]:
    """The JSON-RPC error of a tools/call over ``rate``, ``wait`` seconds from a token."""
    after = retry_after(wait)
    return {"code": RATE_LIMITED, "message": f"Rate limit of {rate:g} tool calls a second: "
                                             f"retry after {after} s",
            "data": {"retryAfter": float(after)}}


def client_of(peer: Optional[str], token: Optional[bytes], salt: bytes,
              user: Optional[str] = None) -> str:
    """The client a request counts for (its key in ClientSessions).

    Signed in (--auth-issuer), ``user``: the user's tenant name (mcp_users.py, a keyed hash
    of the verified token's issuer and tenant claim), whatever token or address it uses.
    With a bearer token, the token: a keyed hash of it (``salt``, the server's own random
    bytes), so no structure holds the token nor a hash that could be tried offline.
    Without, the peer's address as uvicorn gave it: forwarded headers have rewritten it
    only when the operator named trusted proxies (--forwarded-allow-ips).  Addresses one
    machine can take at will count as one client: every loopback address (127.0.0.0/8,
    ::1, ::ffff:127.x) is "loopback", an IPv6 address counts by its /64 (one host's
    SLAAC and privacy addresses), an IPv4-mapped one as its IPv4 address."""
    if user is not None:
        return "user " + user
    if token is not None:
        return "token " + hmac.new(salt, token, hashlib.sha256).hexdigest()[:32]
    if not peer:
        return "address unknown"
    try:
        ip = ipaddress.ip_address(peer.strip("[]"))
    except ValueError:
        # (a trusted proxy's forwarded value that is no address: itself, bounded)
        return "address " + peer[:64]
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return "loopback"
    if isinstance(ip, ipaddress.IPv6Address):
        return f"address {ipaddress.IPv6Network((ip, 64), strict=False)}"
    return f"address {ip}"


class ClientSessions:
    """The live sessions of each client, at most ``cap`` each.

    A request that may open a session takes a place first (admit), so a burst of opening
    requests cannot pass the cap together; its answer keeps the place for the session it
    made, or gives it back (opened).  The MCP server tells when a session starts (its
    initialize) and ends (DELETE, idle timeout, the server's end): started(), ended()."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        # Client -> places taken.
        self.held: dict[str, int] = {}
        # Session id -> its client.
        self._owner: dict[str, str] = {}
        # Sessions started and not ended.
        self._live: set[str] = set()

    def admit(self, client: str) -> bool:
        """Take a place for a new session of ``client``; False when it holds ``cap``."""
        if self.held.get(client, 0) >= self.cap:
            return False
        self.held[client] = self.held.get(client, 0) + 1
        return True

    def opened(self, client: str, sid: Optional[str]) -> None:
        """The answer to ``client``'s opening request: the session ``sid`` it made (a live
        one keeps the place), or None (the place is given back)."""
        if sid is not None and sid in self._live and sid not in self._owner:
            self._owner[sid] = client
            return
        self._give_back(client)

    def started(self, sid: str) -> None:
        self._live.add(sid)

    def ended(self, sid: str) -> None:
        self._live.discard(sid)
        client = self._owner.pop(sid, None)
        if client is not None:
            self._give_back(client)

    def _give_back(self, client: str) -> None:
        left = self.held.get(client, 0) - 1
        if left > 0:
            self.held[client] = left
        else:
            self.held.pop(client, None)


def too_many_sessions(cap: int, idle_s: float) -> dict[str, Any]:
    """The JSON-RPC error of a new session refused at the client's cap (HTTP: 429)."""
    return {"code": TOO_MANY_SESSIONS,
            "message": f"Too many sessions: this client already holds {cap} live sessions, the "
                       f"most one client may hold (--max-sessions-per-client). End one (HTTP "
                       f"DELETE with its mcp-session-id), or wait until one has been idle for "
                       f"{idle_s:g} s (--session-idle-timeout)."}


#: The JSON-RPC error code of a new session over its client's cap (with HTTP 429).
TOO_MANY_SESSIONS = -32030
