"""What keeps one MCP client from taking the server: caps and rates, per session.

    new session (initialize)   SessionCap.admit()     over --max-sessions ─► 503 + Retry-After
    tools/call                 TokenBucket.take()     over --rate-limit   ─► 429 + Retry-After
                               (per session)           (or a JSON-RPC error with the delay)
                               calls semaphore         over --max-calls-per-session: waits its
                                                       turn; other sessions are not slowed

Pure bookkeeping on the event loop's thread: no locks, the clock is passed in.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional


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
        if self.tokens < 0:                       # a new bucket starts full
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
