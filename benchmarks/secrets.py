"""SECRETS: what putting a secret in a request costs, same run.

    an HTTPS server in a process of its own on the host's loopback, with a CA made here; three
    confined workers of one library, allowed that server:
        direct       the host's network (no policy): TLS from the tool to the server
        tunnel       a policy, no secret: the proxy's CONNECT tunnel, TLS end to end
        intercepted  a policy binding a secret to the server: TLS from the tool to the
                     proxy, the header's placeholder swapped, the proxy's own TLS upstream
    rounds, the kinds in a fresh random order in each:
        kept-alive   ``gets`` GETs on one connection (http.client, the key in a header), each
                     timed in the tool: what a request costs once its connection is open
        new          ``gets`` GETs, each on a new connection (TLS handshake included)
        bulk         a body of bulk_mb (50 MB) read whole, GB/s

Run alone:  python -m benchmarks.secrets [rounds] [gets]
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import random
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from lcp_sandbox import SandboxedBinding, Supervisor

from .harness import paired_ratio, percentile, summarize

LIB = '''
import http.client
import os
import ssl
import time


def _context(cadata: str) -> ssl.SSLContext:
    return ssl.create_default_context(cadata=cadata) if cadata else ssl.create_default_context()


def _connect(port: int, context: ssl.SSLContext, timeout: float):
    """An HTTPS connection to 127.0.0.1:port, through HTTPS_PROXY where one is set."""
    proxy = os.environ.get("HTTPS_PROXY", "")
    if not proxy:
        return http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
    host, _, proxy_port = proxy.rsplit("/", 1)[-1].rpartition(":")
    conn = http.client.HTTPSConnection(host, int(proxy_port), context=context, timeout=timeout)
    conn.set_tunnel("127.0.0.1", port)
    return conn


def tool_gets(port: int, n: int, cadata: str = "", kept: bool = True) -> dict:
    """n GETs with the key in a header, on one kept-alive connection or each on a new one:
    their durations in ns.

    Args:
        port (int): the server's port on 127.0.0.1
        n (int): how many
        cadata (str): the server's CA, where the tool checks it itself
        kept (bool): one connection for all
    """
    context, took, conn = _context(cadata), [], None
    headers = {"X-Api-Key": os.environ.get("BENCH_KEY", "none")}
    for _ in range(n):
        t0 = time.perf_counter_ns()
        if conn is None:
            conn = _connect(port, context, 20)
        conn.request("GET", "/small", headers=headers)
        conn.getresponse().read()
        took.append(time.perf_counter_ns() - t0)
        if not kept:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return {"success": True, "output": took}


def tool_bulk(port: int, mb: int, cadata: str = "") -> dict:
    """One GET of an mb-MB body read into one buffer: its bytes and duration in ns.

    Args:
        port (int): the server's port on 127.0.0.1
        mb (int): the body's size
        cadata (str): the server's CA, where the tool checks it itself
    """
    view = memoryview(bytearray(1 << 20))
    got = 0
    t0 = time.perf_counter_ns()
    conn = _connect(port, _context(cadata), 60)
    conn.request("GET", f"/bulk/{mb}", headers={"X-Api-Key": os.environ.get("BENCH_KEY", "")})
    r = conn.getresponse()
    while n := r.readinto(view):
        got += n
    conn.close()
    return {"success": True, "output": {"bytes": got, "ns": time.perf_counter_ns() - t0}}
'''
SERVER = '''
import http.server, ssl, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_GET(self):
        if "/bulk/" in self.path:
            mb = int(self.path.rsplit("/", 1)[1])
            chunk = bytes(1 << 20)
            self.send_response(200); self.send_header("Content-Length", str(mb << 20))
            self.end_headers()
            for _ in range(mb):
                self.wfile.write(chunk)
            return
        self.send_response(200); self.send_header("Content-Length", "12"); self.end_headers()
        self.wfile.write(b"hello world!")
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
tls.load_cert_chain(sys.argv[1])
s.socket = tls.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
'''
KINDS = ("direct", "tunnel", "intercepted")
BULK_ROUNDS = 3


def _certificates(folder: str) -> tuple[str, str]:
    """A CA and a certificate for 127.0.0.1 it signed: (the CA's PEM, the server's file)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")])
    valid = (now - datetime.timedelta(hours=1), now + datetime.timedelta(days=1))
    ca = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid[0]).not_valid_after(valid[1])
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
          .sign(ca_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0]).not_valid_after(valid[1])
            .add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(ca_key, hashes.SHA256()))
    server = os.path.join(folder, "server.pem")
    with open(server, "wb") as f:
        f.write(leaf.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()))
    return ca.public_bytes(serialization.Encoding.PEM).decode(), server


def _bindings(sup: Supervisor, tmp: str, lib: str, port: int) -> dict:
    allow = [f"127.0.0.1:{port}"]
    networks = {"direct": True, "tunnel": {"allow": allow},
                "intercepted": {"allow": allow, "secrets": {"BENCH_KEY": allow}}}
    made = {}
    for kind, net in networks.items():
        ws = os.path.join(tmp, kind)
        os.makedirs(ws)
        made[kind] = SandboxedBinding(
            tools_folders=[lib], supervisor=sup, tenant=kind, workspace=ws, workspace_root=ws,
            host_tool_configs={"bench_secrets": {"sandbox": {"network": net}}})
    return made


def measure(rounds: int = 8, gets: int = 200, seed: int = 1, bulk_mb: int = 50) -> dict:
    tmp = tempfile.mkdtemp(prefix="lcp-bench-secrets-")
    os.chmod(tmp, 0o711)
    cadata, server_pem = _certificates(tmp)
    ca_file = os.path.join(tmp, "ca.pem")
    with open(ca_file, "w") as f:
        f.write(cadata)
    server = subprocess.Popen([sys.executable, "-c", SERVER, server_pem], stdout=subprocess.PIPE,
                              text=True)
    try:
        port = int(server.stdout.readline())
        lib = os.path.join(tmp, "lib")
        os.makedirs(lib)
        os.chmod(lib, 0o755)
        with open(os.path.join(lib, "bench_secrets.py"), "w") as f:
            f.write(LIB)
        with Supervisor(confine=True, secrets={"BENCH_KEY": "bench-" + os.urandom(8).hex()},
                        upstream_ca_file=ca_file) as sup:
            made = _bindings(sup, tmp, lib, port)
            # (the intercepted worker trusts the proxy's CA: SSL_CERT_FILE)
            ca = {k: "" if k == "intercepted" else cadata for k in KINDS}
            for kind in KINDS:
                got = made[kind].execute_tool("tool_gets", {"port": port, "n": 3,
                                                            "cadata": ca[kind]})
                assert got["success"], got
            rng = random.Random(seed)
            rows = {}
            for mode in ("kept", "new"):
                rows[mode] = _rounds(made, ca, port, rounds, gets, rng, mode == "kept")
            bulk = _bulk(made, ca, port, bulk_mb, rng)
            network = made["intercepted"].stats()[0]["protections"]["network"]
        return {"rows": rows, "rounds": rounds, "gets": gets, "bulk": bulk, "network": network}
    finally:
        server.kill()
        server.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def _rounds(made: dict, ca: dict, port: int, rounds: int, gets: int, rng: random.Random,
            kept: bool) -> dict:
    took: dict = {k: [] for k in KINDS}
    p50: dict = {k: {} for k in KINDS}
    for r in range(rounds):
        for kind in rng.sample(KINDS, len(KINDS)):
            got = made[kind].execute_tool("tool_gets", {"port": port, "n": gets,
                                                        "cadata": ca[kind], "kept": kept})
            assert got["success"], got
            xs = sorted(got["output"])
            took[kind] += xs
            p50[kind][r] = percentile(xs, 50)
    summary = {k: summarize(v, 1e3) for k, v in took.items()}
    return {"us": summary,
            "added_us": summary["intercepted"]["p50"] - summary["tunnel"]["p50"],
            "ratio_paired": paired_ratio(p50["intercepted"], p50["tunnel"])}


def _bulk(made: dict, ca: dict, port: int, mb: int, rng: random.Random) -> dict:
    rates: dict = {k: [] for k in KINDS}
    for _ in range(BULK_ROUNDS):
        for kind in rng.sample(KINDS, len(KINDS)):
            got = made[kind].execute_tool("tool_bulk", {"port": port, "mb": mb,
                                                        "cadata": ca[kind]})
            assert got["success"] and got["output"]["bytes"] == mb << 20, got
            rates[kind].append(got["output"]["bytes"] / got["output"]["ns"])
    gbps = {k: sorted(v)[len(v) // 2] for k, v in rates.items()}
    return {"mb": mb, "rounds": BULK_ROUNDS, "gb_per_s": gbps,
            "ratio": gbps["intercepted"] / gbps["direct"],
            "ratio_tunnel": gbps["intercepted"] / gbps["tunnel"]}


def render(res: dict) -> str:
    out = ["SECRETS  HTTPS GETs on loopback, the key in a header (us)          p50      p99",
           f"  ({res['rounds']} rounds interleaved, {res['gets']} GETs per kind and round, "
           f"timed in the tool)"]
    for mode, label in (("kept", "one kept-alive connection"), ("new", "a new connection each")):
        rows = res["rows"][mode]
        for kind in KINDS:
            row = rows["us"][kind]
            out.append(f"  {label + ', ' + kind:<58} {row['p50']:8.1f} {row['p99']:8.1f}")
        paired = rows["ratio_paired"]
        out.append(f"    interception adds {rows['added_us']:.0f} us a request at p50 "
                   f"(intercepted / tunnel {'' if paired is None else f'{paired:.2f}x'})")
    bulk = res["bulk"]
    g = bulk["gb_per_s"]
    out += [f"  a {bulk['mb']} MB body, GB/s: direct {g['direct']:.2f}, tunnel {g['tunnel']:.2f}, "
            f"intercepted {g['intercepted']:.2f} ({bulk['ratio']:.2f}x direct, "
            f"{bulk['ratio_tunnel']:.2f}x the tunnel; median of {bulk['rounds']} rounds)",
            f"  in force: {res['network']}"]
    return "\n".join(out)


def run(ctx: Any, prog: Any) -> None:
    ctx.result["secrets"] = measure(max(4, ctx.cfg.cold_reps // 2), ctx.cfg.egress_gets,
                                    ctx.cfg.seed, min(50, ctx.cfg.egress_bulk_mb))
    prog.step("secrets", "done", 0)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print(render(measure(n, int(sys.argv[2]) if len(sys.argv) > 2 else 200)))
