"""Access tokens checked as an OAuth resource server (lcp_sandbox/fronts/mcp_auth.py), with
real parts: the tests are their own issuer (tests/support/issuer.py: RSA and EC keys made
with ``cryptography``, its JWKS and metadata served on 127.0.0.1), PyJWT verifies.

Every bad token below is one an attacker can make; each test fails with the check that
refuses it taken out (the alg allowlist, the key-type check, aud, iss, exp/nbf, the
refetch limit, forgetting the tokens of a key that left the set).
"""
from __future__ import annotations

import time

import pytest

pytest.importorskip("mcp")
pytest.importorskip("jwt")

import anyio  # noqa: E402
from support.issuer import AUDIENCE, Issuer  # noqa: E402

from lcp_sandbox.fronts import mcp_auth  # noqa: E402
from lcp_sandbox.fronts.mcp_auth import (  # noqa: E402
    AuthConfig,
    AuthSetupError,
    InvalidToken,
    JwtVerifier,
    Keys,
    discover_jwks,
)


class Clock:
    """Monotonic seconds the test moves itself."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def issuer():
    made = Issuer().start()
    yield made
    made.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def verifier_of(issuer: Issuer, clock: Clock, **config) -> JwtVerifier:
    cfg = AuthConfig(issuer=issuer.url, audience=AUDIENCE, **config)
    cfg.check()
    return JwtVerifier(cfg, Keys(discover_jwks(cfg.issuer), clock=clock))


def refused(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(InvalidToken) as caught:
        verifier.verify(token)
    return str(caught.value)


# ---------------------------------------------------------------- good tokens
def test_rsa_and_ec_tokens_name_their_user_and_scopes(issuer, clock):
    v = verifier_of(issuer, clock)
    alice = v.verify(issuer.token("alice", scope="tools.read tools.call"))
    assert (alice.subject, alice.scopes) == ("alice", ["tools.read", "tools.call"])
    assert alice.claims["iss"] == issuer.url
    bob = v.verify(issuer.token("bob", kid="ec1", scp=["a", "b"]))
    assert (bob.subject, bob.scopes) == ("bob", ["a", "b"])
    # Another claim names the user when asked.
    v2 = verifier_of(issuer, clock, tenant_claim="email")
    assert v2.verify(issuer.token("x", email="carol@example.org")).subject == "carol@example.org"
    assert "no 'email' claim" in refused(v2, issuer.token("x"))


def test_the_issuer_keys_come_from_its_metadata_rfc8414_or_oidc(issuer):
    assert discover_jwks(issuer.url) == issuer.jwks_url          # OIDC discovery
    other = Issuer(rfc8414=True).start()
    try:
        assert discover_jwks(other.url) == other.jwks_url       # RFC 8414
        # Metadata naming another issuer is not believed.
        other.metadata_issuer = "https://evil.example.org"
        with pytest.raises(AuthSetupError, match="names the issuer"):
            discover_jwks(other.url)
    finally:
        other.stop()


# ---------------------------------------------------------------- bad tokens
def test_expired_and_not_yet_valid_tokens_are_refused_beyond_the_leeway(issuer, clock):
    v = verifier_of(issuer, clock)
    now = int(time.time())
    assert "expired" in refused(v, issuer.token(exp=now - mcp_auth.LEEWAY_S - 5))
    assert "not yet valid" in refused(v, issuer.token(nbf=now + mcp_auth.LEEWAY_S + 60))
    # Within the leeway: a clock a little off is forgiven.
    assert v.verify(issuer.token(exp=now - 5)).subject == "alice"
    assert "exp" in refused(v, issuer.token(exp=None))


def test_wrong_audience_and_wrong_issuer_are_refused(issuer, clock):
    v = verifier_of(issuer, clock)
    assert "audience" in refused(v, issuer.token(aud="another-service")).lower()
    assert "issuer" in refused(v, issuer.token(iss="https://evil.example.org")).lower()


def test_alg_none_and_hs256_signed_with_the_public_key_are_refused(issuer, clock):
    v = verifier_of(issuer, clock)
    assert "'none' is not allowed" in refused(v, issuer.unsigned())
    assert "'HS256' is not allowed" in refused(v, issuer.hs256_with_public_key())


def test_a_key_is_used_only_for_its_own_type(issuer, clock):
    """An RS256 header on a token whose kid names the EC key: refused before PyJWT."""
    v = verifier_of(issuer, clock)
    token = issuer.token(kid="rsa1")
    head, body, sig = token.split(".")
    import json

    from support.issuer import b64
    swapped = b64(json.dumps({"alg": "RS256", "kid": "ec1", "typ": "JWT"}).encode())
    assert "not a key for RS256" in refused(v, f"{swapped}.{body}.{sig}")


def test_a_tampered_payload_and_an_unknown_kid_are_refused(issuer, clock):
    v = verifier_of(issuer, clock)
    good = issuer.token("alice")
    assert "signature" in refused(v, issuer.tampered(good, sub="bob")).lower()
    issuer.add_key("stranger")                         # a key the issuer never published
    assert "no key 'stranger'" in refused(v, issuer.token(kid="stranger"))


def test_unknown_kids_fetch_the_keys_again_at_most_once_a_minute(issuer, clock):
    v = verifier_of(issuer, clock)
    v.verify(issuer.token())
    fetched = issuer.fetches
    for i in range(20):
        issuer.add_key(f"made-up-{i}")
        refused(v, issuer.token(kid=f"made-up-{i}"))
    # Twenty made-up kids in the same minute: no fetch (the first was made at the start).
    assert issuer.fetches == fetched
    clock.now += mcp_auth.REFETCH_S
    refused(v, issuer.token(kid="made-up-0"))
    assert issuer.fetches == fetched + 1


def test_rotation_a_new_key_then_the_old_one_gone(issuer, clock):
    """The issuer adds a key (a token naming it fetches the keys again), then removes the
    old one: the old key's tokens, even one verified before (cached), are refused."""
    v = verifier_of(issuer, clock)
    old = issuer.token("alice")
    assert v.verify(old).subject == "alice"
    issuer.add_key("rsa2")
    issuer.published.append("rsa2")
    clock.now += mcp_auth.REFETCH_S
    new = issuer.token("alice", kid="rsa2")
    assert v.verify(new).subject == "alice"
    issuer.published.remove("rsa1")
    # The keys are read again after their lifespan (or for the next unknown kid).
    clock.now += mcp_auth.KEYS_LIFESPAN_S
    assert anyio.run(v.verify_token, old) is None
    assert "no key 'rsa1'" in refused(v, issuer.token("bob"))
    assert anyio.run(v.verify_token, new).subject == "alice"


def test_a_key_removed_from_the_jwks_is_refused_for_new_tokens(issuer, clock):
    v = verifier_of(issuer, clock)
    assert v.verify(issuer.token(kid="ec1")).subject == "alice"
    issuer.published.remove("ec1")
    # Held keys are read again after their lifespan: the removed one is gone then.
    clock.now += mcp_auth.KEYS_LIFESPAN_S
    assert "no key 'ec1'" in refused(v, issuer.token("mallory", kid="ec1"))


def test_a_verified_token_is_kept_until_it_expires(issuer, clock):
    """The cache is by the token's hash: a warm request verifies nothing again, and a token
    past its exp is not served from it."""
    v = verifier_of(issuer, clock)
    token = issuer.token()
    first = anyio.run(v.verify_token, token)
    assert v.cached(token) is first
    assert v.cached(issuer.tampered(token, sub="bob")) is None
    wall = [time.time() + 601.0]
    late = JwtVerifier(v.config, v.keys, clock=lambda: wall[0])
    late._cache = v._cache
    assert late.cached(token) is None


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize("config, says", [
    ({"issuer": "http://issuer.example.org", "audience": "a"}, "must be an https URL"),
    ({"issuer": "https://issuer.example.org", "audience": ""}, "needs --auth-audience"),
    ({"issuer": "https://i.example.org", "audience": "a", "jwks_url": "http://10.0.0.1/k"},
     "--auth-jwks-url"),
    ({"issuer": "https://i.example.org", "audience": "a", "required_scopes": ("a b",)},
     "one word"),
])
def test_settings_that_cannot_hold_are_refused(config, says):
    with pytest.raises(AuthSetupError, match=says):
        AuthConfig(**config).check()
    # Loopback issuers may be plain http (tests, a local issuer).
    AuthConfig(issuer="http://127.0.0.1:9/x", audience="a").check()
    AuthConfig(issuer="http://[::1]:9/x", audience="a").check()


def test_policy_rules_match_a_claims_value_or_a_member_of_it():
    from lcp_sandbox.fronts.mcp_users import Rule, allowed, permits
    rules = [Rule("groups", "eng", frozenset({"lib_a"})),
             Rule("scp", "tools.x", frozenset({"lib_b.tool_x"})),
             Rule("role", "admin", frozenset({"lib_c"}))]
    names = allowed(rules, {"groups": ["ops", "eng"], "scp": "read tools.x", "role": "admins"})
    assert names == {"lib_a", "lib_b.tool_x"}
    assert permits(names, "lib_a", "tool_any") and permits(names, "lib_b", "tool_x")
    assert not permits(names, "lib_b", "tool_y") and not permits(names, "lib_c", "tool_z")
    # A value is never matched as a substring, nor a list claim by a string's letters.
    assert allowed(rules, {"groups": "engineering", "role": ["ad", "min"]}) == frozenset()
    assert allowed(rules, {}) == frozenset()
