"""Secrets on the way out: the proxy terminates TLS for the hosts a worker's secrets are
bound to, and puts each secret's value where the worker put its placeholder.

    worker: CONNECT api.example.com:443 ──► proxy (egress_conn.serve): admitted, connected;
                                            a host one of the worker's secrets is bound to?
        no  ──► an end-to-end tunnel, never opened (egress_conn.relay)
        yes ──► intercept(): TLS to the server first, verified (the system's trust store or
                the supervisor's upstream_ca_file; ALPN http/1.1 only); then "200", and TLS
                with the worker under a leaf certificate for that host, signed by the
                supervisor's own CA (Authority: the worker trusts it through SSL_CERT_FILE
                and REQUESTS_CA_BUNDLE, a bundle of the system's CAs and that one)
                worker ══TLS══► each request head, parsed (h11), its placeholders swapped
                                (core/secrets.Swap: bound to this host, else 403, counted,
                                logged by the secret's name) ══TLS══► server
                worker ◄══TLS══ the server's bytes, as they come ◄══TLS══ server
                (both ends in memory, relayed in large pieces: egress_tls.py)

A plain-HTTP request's head is swapped the same way (egress_conn.request_of), and a
CONNECT head that carries a placeholder is refused.  Bodies are passed on as they are, never
swapped: a server may echo a body back.  A redirect goes back to the tool, which follows it
itself (a new request, checked again): the proxy never follows one with a secret.

The CA's private key is made in this process and never leaves it; each leaf's key is one
made for the proxy's leaves, written for an instant to the proxy's own folder (mode 0700:
``ssl`` loads a certificate chain from a file only) and removed at once.
"""
from __future__ import annotations

import collections
import datetime
import ipaddress
import logging
import os
import socket
import ssl
import tempfile
import threading
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

import h11

from ....core.egress_rules import Policy
from ....core.secrets import (
    Headers,
    SecretMisuse,
    Swap,
    host_secrets,
    new_placeholder,
    settled,
)
from .egress_conn import HEAD_LIMIT, HEAD_TIMEOUT_S, ProxyRefusal, response
from .egress_tls import TlsEnd, relay

log = logging.getLogger("lcp_sandbox.egress")

#: Leaf certificates kept ready, by host (the least recently used goes first)
LEAVES = 1024
#: Days a leaf certificate is good for (made again when it is older than half of that)
LEAF_DAYS = 7
CA_DAYS = 3650
_MISSING = ("secrets bound to a host need the 'cryptography' package, which makes the "
            "proxy's certificates: pip install 'lcp-sandbox[secrets]'")


class Authority:
    """One per supervisor: its CA, the leaf certificates it signs, the TLS settings of
    both sides, and the bundle the workers trust."""

    def __init__(self, folder: str, upstream_ca_file: Optional[str] = None) -> None:
        """``folder``: the proxy's own (0700); ``upstream_ca_file``: the CAs the servers
        are checked against (None: the system's).  RuntimeError without ``cryptography``."""
        try:
            from cryptography.hazmat.primitives.asymmetric import ec
        except ImportError:
            raise RuntimeError(_MISSING) from None
        self._folder = folder
        self._ec = ec
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        self._leaf_key = ec.generate_private_key(ec.SECP256R1())
        self.ca_pem = _certificate(self._ca_key, self._ca_key, "lcp-sandbox egress CA",
                                   CA_DAYS, ca=True)
        self._leaves: collections.OrderedDict[str, tuple[ssl.SSLContext, datetime.datetime]] \
            = collections.OrderedDict()
        self._lock = threading.Lock()
        self.upstream = ssl.create_default_context(cafile=upstream_ca_file)
        self.upstream.set_alpn_protocols(["http/1.1"])
        self.bundle = _system_bundle() + self.ca_pem.decode("ascii")

    def server_context(self, host: str) -> ssl.SSLContext:
        """The TLS settings the proxy speaks to a worker with, as ``host``."""
        now = datetime.datetime.now(datetime.timezone.utc)
        with self._lock:
            got = self._leaves.get(host)
            if got is not None and now - got[1] < datetime.timedelta(days=LEAF_DAYS / 2):
                self._leaves.move_to_end(host)
                return got[0]
        context = self._leaf_context(host)
        with self._lock:
            self._leaves[host] = (context, now)
            while len(self._leaves) > LEAVES:
                self._leaves.popitem(last=False)
        return context

    def _leaf_context(self, host: str) -> ssl.SSLContext:
        from cryptography.hazmat.primitives import serialization
        pem = _certificate(self._leaf_key, self._ca_key, host, LEAF_DAYS, ca=False,
                           issuer=self.ca_pem)
        key = self._leaf_key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption())
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.set_alpn_protocols(["http/1.1"])
        fd, path = tempfile.mkstemp(dir=self._folder, suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(pem + key)
            context.load_cert_chain(path)
        finally:
            os.unlink(path)
        return context


def _certificate(key: Any, signer: Any, name: str, days: int, ca: bool,
                 issuer: Optional[bytes] = None) -> bytes:
    """A certificate (PEM) of ``key`` for ``name``, signed by ``signer``: the CA's own
    (``ca``), or a server's leaf for the host ``name`` (in subjectAltName)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64])])
    issuer_name = subject if issuer is None else x509.load_pem_x509_certificate(issuer).subject
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(hours=1))
               .not_valid_after(now + datetime.timedelta(days=days)))
    if ca:
        builder = (builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
                   .add_extension(x509.KeyUsage(False, False, False, False, False, True, True,
                                                False, False), True))
    else:
        try:
            alt: Any = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            alt = x509.DNSName(name)
        builder = (builder.add_extension(x509.SubjectAlternativeName([alt]), False)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), True)
                   .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                                  False))
    cert = builder.sign(signer, hashes.SHA256())
    return cert.public_bytes(serialization.Encoding.PEM)


def _system_bundle() -> str:
    """The system's trusted CAs, as PEM ("" where none is found: the workers then trust
    the proxy's CA alone, and a tunnel's TLS to another host fails its check)."""
    paths = ssl.get_default_verify_paths()
    candidates = [paths.cafile, paths.openssl_cafile]
    try:
        import certifi
        candidates.append(certifi.where())
    except ImportError:
        pass
    for path in candidates:
        if path and os.path.isfile(path):
            with open(path, encoding="ascii", errors="replace") as f:
                text = f.read()
            return text if text.endswith("\n") else text + "\n"
    log.warning("egress proxy: no system CA bundle was found; workers with secrets trust "
                "the proxy's CA only")
    return ""


@dataclass
class WorkerSecrets:
    """One worker's secrets as the proxy holds them: the swap, the supervisor's
    Authority, and ``misused``, told of each refusal (to count and log it)."""
    swap: Swap
    authority: Authority
    misused: Callable[[SecretMisuse, str, int], None]

    def intercepts(self, host: str, port: int) -> bool:
        """Whether a tunnel to (``host``, ``port``) is opened: a secret is bound to it."""
        return (host, port) in self.swap.hosts

    def refuse(self, exc: SecretMisuse, host: str, port: int) -> ProxyRefusal:
        """``exc`` counted and logged (by the secret's name): the 403 to answer."""
        self.misused(exc, host, port)
        return ProxyRefusal(403, str(exc))

    def intercept(self, client: socket.socket, upstream: socket.socket, host: str,
                  port: int, rest: bytes) -> None:
        """A CONNECT to a bound host: TLS to the server (verified), then to the worker, then
        each request swapped on its way (the caller closes both sockets)."""
        if rest:
            client.sendall(response(400, "lcp-sandbox egress proxy: bytes came after a "
                                         "CONNECT head before its answer"))
            return
        server = TlsEnd(upstream, self.authority.upstream, server_side=False,
                        server_hostname=host)
        try:
            server.handshake(HEAD_TIMEOUT_S)
        except (OSError, ssl.SSLError) as exc:
            client.sendall(response(502, f"lcp-sandbox egress proxy: TLS to {host}:{port} "
                                         f"failed its check: {exc}"))
            return
        worker = TlsEnd(client, self.authority.server_context(host), server_side=True)
        try:
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            worker.handshake(HEAD_TIMEOUT_S)
        except (OSError, ssl.SSLError) as exc:
            log.info("egress proxy: a worker's TLS to the proxy as %s failed: %s", host, exc)
            return
        try:
            relay(worker, server, _Requests(self, host, port).feed)
        except ProxyRefusal as exc:
            if worker.write(response(exc.status, str(exc))):
                worker.flush()


class Keeper:
    """The host's secrets, as its egress proxy holds them (one per supervisor): the values
    (Supervisor's ``secrets``, ``set_secret()``), the CAs of the servers they go to, and the
    Authority, made by the first worker that has a secret."""

    def __init__(self, metrics: Any, folder: Callable[[], str]) -> None:
        self.values: dict[str, str] = {}
        self.upstream_ca_file: Optional[str] = None
        self._metrics = metrics
        # (the proxy's own folder, once it started)
        self._folder = folder
        self._authority: Optional[Authority] = None
        self._lock = threading.Lock()

    def hold(self, values: dict[str, str], upstream_ca_file: Optional[str]) -> None:
        """The supervisor's settings (``values`` checked by core/secrets.host_secrets()):
        ValueError for an ``upstream_ca_file`` that is no file."""
        if upstream_ca_file is not None and not os.path.isfile(upstream_ca_file):
            raise ValueError(f"Supervisor: upstream_ca_file {upstream_ca_file!r} is not a file")
        self.values, self.upstream_ca_file = values, upstream_ca_file

    def set(self, name: str, value: str) -> None:
        """``value`` as the secret ``name`` for the workers started from now on."""
        self.values = {**self.values, **host_secrets({name: value}, "Supervisor.set_secret")}

    def of(self, own: Mapping[str, str], policy: Policy, configs: dict[str, Any]
           ) -> tuple[Optional[WorkerSecrets], dict[str, str]]:
        """The secrets of a worker whose policy is ``policy`` (its bindings; the values the
        host holds, ``own`` (its binding's) over the supervisor's) with fresh placeholders;
        OSError naming a secret that has no value, or a reference in its ``configs`` to
        one its policy does not bind."""
        try:
            settled({"secrets": policy.secrets}, configs, {*self.values, *own}, "the library")
        except ValueError as exc:
            raise OSError(str(exc)) from None
        if not policy.secrets:
            return None, {}
        values = {**self.values, **own}
        placeholders = {name: new_placeholder() for name in policy.secrets}
        swap = Swap((placeholders[n], n, values[n], hosts) for n, hosts in policy.secrets.items())
        return WorkerSecrets(swap, self._authority_of(), self._misused), placeholders

    def _authority_of(self) -> Authority:
        """The supervisor's CA (made now, the first time: OSError without
        ``cryptography``)."""
        with self._lock:
            if self._authority is None:
                try:
                    self._authority = Authority(self._folder(), self.upstream_ca_file)
                except RuntimeError as exc:
                    raise OSError(str(exc)) from None
            return self._authority

    def _misused(self, exc: SecretMisuse, host: str, port: int) -> None:
        """A placeholder sent where its secret is not bound: counted, logged by name."""
        self._metrics.egress(False, f"secret {exc.name} to an unbound host")
        log.warning("egress refused: the placeholder of the secret %s was sent to %s port "
                    "%d, a host it is not bound to", exc.name, host, port)


class _Requests:
    """The worker's side of an intercepted connection: request after request, each head
    parsed (h11) and swapped, each body passed on as it came (chunked again if it was)."""

    def __init__(self, secrets: WorkerSecrets, host: str, port: int) -> None:
        self._secrets, self._host, self._port = secrets, host, port
        self._parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
        self._chunked = False
        # after an Upgrade: the rest is passed on unread (the same server, its own protocol)
        self._raw = False

    def feed(self, data: bytes) -> bytes:
        """What goes to the server for ``data`` from the worker (ProxyRefusal: refused)."""
        if self._raw:
            return data
        self._parser.receive_data(data)
        out: list[bytes] = []
        while True:
            try:
                event = self._parser.next_event()
            except h11.RemoteProtocolError as exc:
                raise ProxyRefusal(400, f"not an HTTP/1 request: {exc}") from None
            if event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return b"".join(out)
            if isinstance(event, h11.Request):
                out.append(self._head(event))
            elif isinstance(event, h11.Data):
                data = bytes(event.data)
                out.append(b"%x\r\n%s\r\n" % (len(data), data) if self._chunked else data)
            elif isinstance(event, h11.EndOfMessage):
                if self._chunked:
                    out.append(b"0\r\n" + b"".join(n + b": " + v + b"\r\n"
                                                   for n, v in event.headers.raw_items())
                               + b"\r\n")
                rest, _ = self._parser.trailing_data
                self._parser = h11.Connection(h11.SERVER, max_incomplete_event_size=HEAD_LIMIT)
                if rest:
                    # (b"" would tell h11 the connection ended)
                    self._parser.receive_data(rest)
            else:
                # PAUSED: an Upgrade (or CONNECT) asked of the server itself
                self._raw = True
                out.append(self._parser.trailing_data[0])
                return b"".join(out)

    def _head(self, event: h11.Request) -> bytes:
        headers: Headers = [(n, v) for n, v in event.headers.raw_items()]
        target = bytes(event.target)
        try:
            swapped = self._secrets.swap.head(self._host, self._port, target, headers)
        except SecretMisuse as exc:
            raise self._secrets.refuse(exc, self._host, self._port) from None
        if swapped is not None:
            target, headers = swapped
        self._chunked = any(n.lower() == b"transfer-encoding" and b"chunked" in v.lower()
                            for n, v in headers)
        lines = [b"%s %s HTTP/%s" % (bytes(event.method), target, bytes(event.http_version))]
        lines += [n + b": " + v for n, v in headers]
        return b"\r\n".join([*lines, b"", b""])
