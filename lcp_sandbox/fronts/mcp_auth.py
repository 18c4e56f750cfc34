"""Signed-in users of the MCP server: access tokens checked as an OAuth resource server.

    serve-mcp --auth-issuer URL --auth-audience AUD [--auth-jwks-url URL] ...
      start ─► AuthConfig checked (https, or http on a loopback address only)
            ─► the issuer's keys: --auth-jwks-url, else the issuer's metadata (RFC 8414
               /.well-known/oauth-authorization-server, then OIDC discovery) names jwks_uri
      request ─► JwtVerifier.verify_token (the SDK's TokenVerifier)
               ─► a token seen before and not expired: its AccessToken from the cache
               ─► else (in a thread) the header's alg on the allowlist (asymmetric only: no
                  "none", no HMAC), its kid among the issuer's keys (Keys: fetched again
                  for an unknown kid, at most once a minute), then PyJWT checks the
                  signature, iss, aud, exp and nbf (LEEWAY_S) and the tenant claim is there
               ─► an AccessToken whose subject is the tenant claim's value

Nothing here is believed from the client but what the issuer signed: the user's tenant
(mcp_users.py) is made from ``iss`` and the tenant claim of a verified token only.
"""
from __future__ import annotations

import hashlib
import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional
from urllib.parse import urlsplit

log = logging.getLogger("lcp_sandbox.mcp")

#: Asymmetric signatures only: "none" and HMAC (a key the client could know) never pass.
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512",
              "ES256", "ES384", "ES512", "EdDSA")
#: The key type each algorithm family needs (a JWK's "kty").
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}
#: Clock skew allowed on exp and nbf, seconds.
LEEWAY_S = 30
#: An unknown kid fetches the keys again at most this often (key rotation), seconds.
REFETCH_S = 60.0
#: The keys are fetched again after this long whatever the tokens say (a key removed).
KEYS_LIFESPAN_S = 300.0
#: Verified tokens remembered at most (by their hash, until they expire).
CACHE_SIZE = 4096
FETCH_TIMEOUT_S = 10.0


class AuthSetupError(ValueError):
    """A mistake in the auth flags or the issuer's metadata: the server does not start."""


class InvalidToken(Exception):
    """A token refused: the message says why (logged, never sent with the token)."""


def checked_url(url: str, what: str) -> str:
    """``url`` when it is https, or http on a loopback address (a local issuer in tests);
    AuthSetupError naming ``what`` otherwise."""
    parts = urlsplit(url)
    if parts.scheme == "https" and parts.hostname:
        return url
    if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
        return url
    raise AuthSetupError(f"{what} {url!r} must be an https URL (plain http only on a loopback "
                         f"address such as 127.0.0.1): keys or metadata fetched over plain "
                         f"http could be swapped on the way")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AuthConfig:
    """What the server checks of a token (the --auth-* flags)."""
    issuer: str
    audience: str
    jwks_url: Optional[str] = None
    required_scopes: tuple[str, ...] = ()
    tenant_claim: str = "sub"
    # The protected resource's URL in the RFC 9728 metadata (default: the bound address's).
    resource_url: Optional[str] = None

    def check(self) -> None:
        """AuthSetupError for a setting that cannot hold."""
        checked_url(self.issuer, "--auth-issuer")
        if not self.audience:
            raise AuthSetupError("--auth-issuer needs --auth-audience AUD: without it a token "
                                 "issued for any other service would be taken")
        if self.jwks_url is not None:
            checked_url(self.jwks_url, "--auth-jwks-url")
        if not self.tenant_claim:
            raise AuthSetupError("--auth-tenant-claim must name a claim (default: sub)")
        for scope in self.required_scopes:
            if not scope or any(c.isspace() for c in scope):
                raise AuthSetupError(f"--auth-required-scope {scope!r}: a scope is one word")


def fetch_json(url: str) -> dict[str, Any]:
    """The JSON object at ``url`` (PyJWKClient's fetch: no redirect followed, a timeout)."""
    from jwt import PyJWKClient
    from jwt.exceptions import PyJWKClientError
    try:
        data = PyJWKClient(url, cache_jwk_set=False, timeout=FETCH_TIMEOUT_S).fetch_data()
    except (PyJWKClientError, ValueError) as exc:
        # (ValueError: an answer that is no JSON)
        raise AuthSetupError(f"{url}: {exc}") from None
    if not isinstance(data, dict):
        raise AuthSetupError(f"{url}: not a JSON object")
    return data


def metadata_urls(issuer: str) -> list[str]:
    """Where the issuer's metadata may be: RFC 8414's (the well-known part before the
    issuer's path), then OIDC discovery's (after it)."""
    parts = urlsplit(issuer)
    path = parts.path.rstrip("/")
    base = f"{parts.scheme}://{parts.netloc}"
    return [f"{base}/.well-known/oauth-authorization-server{path}",
            f"{base}{path}/.well-known/openid-configuration"]


def discover_jwks(issuer: str, fetch: Callable[[str], dict] = fetch_json) -> str:
    """The issuer's jwks_uri, from the first of its metadata documents that answers; the
    document must name this very issuer (RFC 8414 section 3.3)."""
    problems = []
    for url in metadata_urls(issuer):
        try:
            doc = fetch(url)
        except AuthSetupError as exc:
            problems.append(str(exc))
            continue
        if doc.get("issuer") != issuer:
            raise AuthSetupError(f"the metadata at {url} names the issuer "
                                 f"{doc.get('issuer')!r}, not {issuer!r}")
        jwks = doc.get("jwks_uri")
        if not isinstance(jwks, str):
            raise AuthSetupError(f"the metadata at {url} names no jwks_uri: give --auth-jwks-url")
        return checked_url(jwks, f"the jwks_uri of {url}")
    raise AuthSetupError("could not read the issuer's metadata (give --auth-jwks-url, or check "
                         "--auth-issuer): " + "; ".join(problems))


class Keys:
    """The issuer's signing keys by kid, fetched from ``url``: again after KEYS_LIFESPAN_S,
    and for a kid not among them at most once every REFETCH_S (so a flood of made-up kids
    costs the issuer one request a minute).  ``clock``: monotonic seconds."""

    def __init__(self, url: str, fetch: Callable[[str], dict] = fetch_json,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.url, self._fetch, self._clock = url, fetch, clock
        self._lock = threading.Lock()
        self._by_kid: dict[Optional[str], SigningKey] = {}
        self._fetched: Optional[float] = None
        # Called with the kids of each new set (the verifier forgets tokens of others).
        self.on_change: Callable[[set], None] = lambda kids: None

    def key(self, kid: Optional[str]) -> Optional[SigningKey]:
        """The key ``kid`` (None: the set's only key), or None."""
        with self._lock:
            now = self._clock()
            if self._fetched is None or now - self._fetched >= KEYS_LIFESPAN_S:
                self._load(now)
            found = self._find(kid)
            if found is None and self._fetched is not None and now - self._fetched >= REFETCH_S:
                self._load(now)
                found = self._find(kid)
            return found

    def fresh(self) -> bool:
        """Whether the keys held are within their lifespan (a cached token may be served)."""
        fetched = self._fetched
        return fetched is not None and self._clock() - fetched < KEYS_LIFESPAN_S

    def _find(self, kid: Optional[str]) -> Optional[SigningKey]:
        if kid is None:
            keys = list(self._by_kid.values())
            return keys[0] if len(keys) == 1 else None
        return self._by_kid.get(kid)

    def _load(self, now: float) -> None:
        """Fetch the set; a failed fetch keeps the keys held (and waits REFETCH_S)."""
        self._fetched = now
        try:
            data = self._fetch(self.url)
        except AuthSetupError as exc:
            log.warning("the issuer's keys at %s could not be read: %s", self.url, exc)
            return
        entries = data.get("keys") if isinstance(data, dict) else None
        found = [k for k in map(_jwk, entries if isinstance(entries, list) else []) if k]
        self._by_kid = {k.jwk.key_id: k for k in found}
        self.on_change(set(self._by_kid))


@dataclass(frozen=True)
class SigningKey:
    """One of the issuer's keys: PyJWT's, and the "alg" the issuer declared for it."""
    jwk: Any
    alg: Optional[str]


def _jwk(entry: Any) -> Optional[SigningKey]:
    """A signing key of a JWKS, or None for an entry that is none (an encryption key, an
    unknown type)."""
    from jwt import PyJWK
    from jwt.exceptions import InvalidKeyError, PyJWKError
    if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
        return None
    try:
        key = PyJWK(entry)
    except (PyJWKError, InvalidKeyError):
        return None
    alg = entry.get("alg")
    return SigningKey(key, alg if isinstance(alg, str) else None)


def _scopes(claims: dict) -> list[str]:
    """The token's scopes: ``scope`` (space-separated) or ``scp`` (a string or a list)."""
    raw = claims.get("scope", claims.get("scp", ""))
    if isinstance(raw, str):
        return raw.split()
    if isinstance(raw, list):
        return [s for s in raw if isinstance(s, str)]
    return []


class JwtVerifier:
    """The MCP SDK's TokenVerifier over ``config`` and ``keys``; verified tokens are kept by
    their hash until they expire (or their key leaves the set), so a warm request costs
    a dictionary look-up.  ``clock``: wall seconds (exp)."""

    def __init__(self, config: AuthConfig, keys: Keys,
                 clock: Callable[[], float] = time.time) -> None:
        self.config, self.keys, self._clock = config, keys, clock
        self._cache: dict[bytes, tuple[Any, float, Optional[str]]] = {}
        keys.on_change = self._forget_others

    def cached(self, token: str) -> Any:
        """The AccessToken of a token verified before and not expired, or None (also once
        the keys are due to be read again: its key may have left the set)."""
        hit = self._cache.get(hashlib.sha256(token.encode()).digest())
        if hit is not None and self._clock() < hit[1] and self.keys.fresh():
            return hit[0]
        return None

    async def verify_token(self, token: str) -> Any:
        """(TokenVerifier) The AccessToken, or None for a token refused (logged why)."""
        hit = self.cached(token)
        if hit is not None:
            return hit
        import anyio
        try:
            return await anyio.to_thread.run_sync(self.verify, token)
        except InvalidToken as exc:
            log.info("bearer token refused: %s", exc)
            return None

    def verify(self, token: str) -> Any:
        """The AccessToken of ``token`` (blocking: may fetch keys); InvalidToken why not."""
        import jwt
        from mcp.server.auth.provider import AccessToken
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise InvalidToken(f"not a JWT: {exc}") from None
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in ALGORITHMS:
            raise InvalidToken(f"algorithm {alg!r} is not allowed (only {', '.join(ALGORITHMS)})")
        if kid is not None and not isinstance(kid, str):
            raise InvalidToken("its kid is not a string")
        key = self.keys.key(kid)
        if key is None:
            raise InvalidToken(f"no key {kid!r} among the issuer's keys")
        claims = self._decode(jwt, token, key, alg)
        value = claims.get(self.config.tenant_claim)
        if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
            raise InvalidToken(f"it has no {self.config.tenant_claim!r} claim to name its user")
        client = claims.get("azp") or claims.get("client_id") or ""
        access = AccessToken(token=token, client_id=str(client), scopes=_scopes(claims),
                             expires_at=int(claims["exp"]), subject=str(value), claims=claims)
        self._remember(token, access, float(claims["exp"]), kid)
        return access

    def _decode(self, jwt: Any, token: str, key: SigningKey, alg: str) -> dict:
        # A key is used only for its own type and the alg its issuer declared.
        if _KEY_TYPES[alg[:2]] != key.jwk.key_type or (key.alg or alg) != alg:
            raise InvalidToken(f"key {key.jwk.key_id!r} is not a key for {alg}")
        try:
            return jwt.decode(token, key.jwk.key, algorithms=[alg], audience=self.config.audience,
                              issuer=self.config.issuer, leeway=LEEWAY_S,
                              options={"require": ["exp", "iss", "aud"]})
        except jwt.PyJWTError as exc:
            raise InvalidToken(str(exc) or type(exc).__name__) from None

    def _remember(self, token: str, access: Any, exp: float, kid: Optional[str]) -> None:
        if len(self._cache) >= CACHE_SIZE:
            now = self._clock()
            self._cache = {k: v for k, v in self._cache.items() if v[1] > now}
            if len(self._cache) >= CACHE_SIZE:
                self._cache.clear()
        self._cache[hashlib.sha256(token.encode()).digest()] = (access, exp, kid)

    def _forget_others(self, kids: set) -> None:
        """A new key set: tokens signed by a key that left it are verified no more."""
        self._cache = {k: v for k, v in self._cache.items() if v[2] is None or v[2] in kids}


def make_verifier(config: AuthConfig) -> JwtVerifier:
    """The verifier of ``config``: its keys' URL found now (AuthSetupError if it cannot be),
    the keys fetched once (a warning if that fails: they are fetched again later)."""
    config.check()
    url = config.jwks_url or discover_jwks(config.issuer)
    keys = Keys(url)
    keys.key(None)
    return JwtVerifier(config, keys)
