"""A small OAuth issuer for tests: its own RSA and EC keys (``cryptography``), its JWKS and
metadata served over HTTP on 127.0.0.1, and tokens it signs, good and bad.

    issuer = Issuer(); issuer.start()        http://127.0.0.1:<port>
      /.well-known/openid-configuration       {"issuer", "jwks_uri"} (OIDC discovery)
      /.well-known/oauth-authorization-server the same (RFC 8414), when ``rfc8414``
      /jwks                                   the keys named in ``issuer.published``
    issuer.token(sub="alice", groups=[...])  an RS256 token (kid "rsa1") for AUDIENCE
    issuer.fetches                           how many times /jwks was read
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

AUDIENCE = "lcp-tools"


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _public_jwk(kid: str, key: Any, alg: Optional[str]) -> dict:
    algo = {rsa.RSAPrivateKey: jwt.algorithms.RSAAlgorithm,
            ec.EllipticCurvePrivateKey: jwt.algorithms.ECAlgorithm,
            ed25519.Ed25519PrivateKey: jwt.algorithms.OKPAlgorithm}
    kind = next(a for t, a in algo.items() if isinstance(key, t))
    jwk = json.loads(kind.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "use": "sig"})
    if alg:
        jwk["alg"] = alg
    return jwk


class Issuer:
    """Keys by kid (private), the kids published in the JWKS, an HTTP server of both."""

    def __init__(self, rfc8414: bool = False) -> None:
        self.keys: dict[str, tuple[Any, str]] = {
            "rsa1": (rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256"),
            "ec1": (ec.generate_private_key(ec.SECP256R1()), "ES256"),
        }
        self.published = ["rsa1", "ec1"]
        self.rfc8414 = rfc8414
        self.fetches = 0
        self.metadata_issuer: Optional[str] = None
        self._server: Optional[ThreadingHTTPServer] = None

    # ---------------------------------------------------------------- serving
    def start(self) -> "Issuer":
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = issuer._answer(self.path)
                self.send_response(200 if body is not None else 404)
                data = json.dumps(body or {}).encode()
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def jwks_url(self) -> str:
        return self.url + "/jwks"

    def jwks(self) -> dict:
        return {"keys": [_public_jwk(kid, self.keys[kid][0], self.keys[kid][1])
                         for kid in self.published]}

    def _answer(self, path: str) -> Optional[dict]:
        meta = {"issuer": self.metadata_issuer or self.url, "jwks_uri": self.jwks_url}
        if path == "/jwks":
            self.fetches += 1
            return self.jwks()
        if path == "/.well-known/openid-configuration" and not self.rfc8414:
            return meta
        if path == "/.well-known/oauth-authorization-server" and self.rfc8414:
            return meta
        return None

    # ---------------------------------------------------------------- tokens
    def add_key(self, kid: str, kind: str = "rsa") -> None:
        if kind == "rsa":
            self.keys[kid] = (rsa.generate_private_key(public_exponent=65537, key_size=2048),
                              "PS256")
        elif kind == "ed":
            self.keys[kid] = (ed25519.Ed25519PrivateKey.generate(), "EdDSA")
        else:
            self.keys[kid] = (ec.generate_private_key(ec.SECP384R1()), "ES384")

    def claims(self, sub: str = "alice", **extra: Any) -> dict:
        now = int(time.time())
        out = {"iss": self.url, "aud": AUDIENCE, "sub": sub, "iat": now, "exp": now + 600}
        out.update(extra)
        return {k: v for k, v in out.items() if v is not None}

    def token(self, sub: str = "alice", kid: str = "rsa1", alg: Optional[str] = None,
              **extra: Any) -> str:
        key, default_alg = self.keys[kid]
        return jwt.encode(self.claims(sub, **extra), key, algorithm=alg or default_alg,
                          headers={"kid": kid})

    def public_pem(self, kid: str = "rsa1") -> bytes:
        return self.keys[kid][0].public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def unsigned(self, **claims: Any) -> str:
        """An ``alg: none`` token (no signature)."""
        head = b64(json.dumps({"alg": "none", "typ": "JWT", "kid": "rsa1"}).encode())
        return f"{head}.{b64(json.dumps(self.claims(**claims)).encode())}."

    def hs256_with_public_key(self, kid: str = "rsa1", **claims: Any) -> str:
        """HS256 whose secret is the issuer's public key (the classic key-confusion attack)."""
        head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": kid}).encode())
        body = b64(json.dumps(self.claims(**claims)).encode())
        mac = hmac.new(self.public_pem(kid), f"{head}.{body}".encode(), hashlib.sha256)
        return f"{head}.{body}.{b64(mac.digest())}"

    def tampered(self, token: str, **changes: Any) -> str:
        """``token`` with its payload changed and its signature kept."""
        head, body, sig = token.split(".")
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        payload.update(changes)
        return f"{head}.{b64(json.dumps(payload).encode())}.{sig}"
