"""``lcp-sandbox serve-mcp``: the command line of the MCP server (mcp_server.py).

Parsing and checks only; the ``mcp`` SDK is imported when the command runs, so
``lcp-sandbox --help`` works without the ``mcp`` extra.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from typing import Any, Optional, Union

from ..core.egress_rules import policy_of
from ..core.limits import Limits, check_together
from ..core.policy import DEFAULT_RUN_AS, DEFAULT_UID_RANGE, uid_range_setting
from .mcp_config import ConfigError, check_configs, read_configs

log = logging.getLogger("lcp_sandbox.mcp")

TOKEN_ENV = "LCP_SANDBOX_MCP_TOKEN"

DESCRIPTION = """\
Serve the tools of FOLDER(s) to MCP clients, each library in isolated worker processes.
stdio (default): one session, workspace --workspace (default: the current folder); only MCP
messages are written to stdout. http: Streamable HTTP at /mcp; every MCP session is a tenant
of its own, with its own workers and its own workspace <workspace-root>/<a hash of its id> (and,
run as root, its own uid), all stopped and removed when the session ends; with --auth-issuer,
every signed-in user is one tenant for all their sessions. Host and Origin are checked on every
request; on any address but loopback a bearer token is required (--token-file, the environment
variable LCP_SANDBOX_MCP_TOKEN, or --auth-issuer)."""


def add_parser(sub: Any, parents: list) -> None:
    """Add ``serve-mcp`` to the ``lcp-sandbox`` subcommands."""
    p = sub.add_parser("serve-mcp",
                       help="serve the tools to MCP clients (stdio or Streamable HTTP)",
                       description=DESCRIPTION, parents=parents)
    p.add_argument("folders", nargs="+", metavar="FOLDER", help="folder of tool libraries")
    p.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                   help="stdio: one client starts the server and talks to it over its stdin and "
                        "stdout; http: Streamable HTTP at /mcp, every session a tenant "
                        "(default: stdio)")
    p.add_argument("--host", default="127.0.0.1",
                   help="http: address to bind (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000,
                   help="http: port; 0: any free port (default: 8000)")
    p.add_argument("--workspace", metavar="DIR",
                   help="stdio: the tools' workspace (default: the current folder)")
    p.add_argument("--workspace-root", metavar="DIR", default="mcp-workspaces",
                   help="http: each tenant's workspace is DIR/<a keyed hash of its session "
                        "id, or of its signed-in user> "
                        "(default: ./mcp-workspaces)")
    p.add_argument("--uid-range", nargs=2, type=int, metavar=("FIRST", "COUNT"), default=None,
                   help="http, run as root: each session's workers run as a uid of the "
                        "session's own from FIRST to FIRST+COUNT-1, given back when the session "
                        "ends (default: %d %d)" % DEFAULT_UID_RANGE)
    p.add_argument("--config", metavar="FILE",
                   help="JSON file with the host_tool_configs "
                        "({\"host_tool_configs\": {...}} or the dict itself), checked when "
                        "the server starts: a mistake in it is exit status 2")
    confine = p.add_mutually_exclusive_group()
    confine.add_argument("--confine", dest="confine", action="store_const", const=True,
                         default=None, help="confine the workers (see the docs' security page); "
                         "the default over http, where every session is a tenant")
    confine.add_argument("--no-confine", dest="confine", action="store_const", const=False,
                         help="run the sessions' workers unconfined (the default over stdio, "
                              "one local client)")
    confine.add_argument("--confine-best-effort", dest="confine", action="store_const",
                         const="best-effort", help="confine with what this host has (stats() "
                         "and a warning say what is missing) instead of refusing with 503")
    p.add_argument("--network-allow", action="append", default=[], metavar="RULE",
                   help="let confined workers reach only the hosts these rules admit, through "
                        "the engine's egress proxy (repeatable; host, host:port, *.domain, an "
                        "address or CIDR, each with an optional :port)")
    p.add_argument("--network-deny", action="append", default=[], metavar="RULE",
                   help="with --network-allow: hosts refused even when a rule allows them")
    p.add_argument("--secret", action="append", default=[], metavar="NAME=env:VAR",
                   help="a secret the egress proxy puts in the requests to the hosts a "
                        "library's policy binds NAME to (--config: \"secrets\"); its value from "
                        "the environment (NAME=env:VAR) or a file (NAME=file:PATH), never the "
                        "command line (repeatable)")
    p.add_argument("--upstream-ca-file", metavar="FILE", default=None,
                   help="the CAs the egress proxy checks the servers of secrets' hosts against "
                        "(default: the system's trust store)")
    p.add_argument("--no-network", action="store_true",
                   help="no network at all for the workers (their own network namespace)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="timeout of a tool call in seconds; 0: none (default: 60)")
    p.add_argument("--memory-mb", type=float, default=None, metavar="N",
                   help="memory limit of each worker (default: none)")
    p.add_argument("--auto-confirm", choices=("allow", "reject"), default=None,
                   help="the answer to a tool's confirmation request when the client cannot be "
                        "asked (no elicitation capability) (default: reject)")
    p.add_argument("--token-file", metavar="FILE",
                   help=f"http: clients must send 'Authorization: Bearer <the file's content>' "
                        f"(or set {TOKEN_ENV}); required unless bound to loopback")
    p.add_argument("--allowed-host", action="append", default=[], metavar="HOST:PORT",
                   help="http: another Host header to accept (repeatable)")
    p.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                   help="http: an Origin to accept, e.g. http://localhost:6274 (repeatable)")
    p.add_argument("--forwarded-allow-ips", metavar="IPS", default=None,
                   help="http: the reverse proxies (a comma list of addresses and CIDR "
                        "networks) whose X-Forwarded-For header names the client; without it "
                        "the header is ignored and the client is the connecting address")
    p.add_argument("--ray", metavar="ADDRESS", default=None,
                   help="run the sessions' workers on the nodes of a Ray cluster: its address "
                        "(host:port, ray://host:port) or auto (the cluster Ray finds); "
                        "workspaces and tool folders must be on storage every node mounts at "
                        "the same path (the ray extra; docs: ray.md)")
    _add_load_options(p)
    _add_auth_options(p)
    p.set_defaults(fn=cmd_serve_mcp)


def _add_auth_options(p: argparse.ArgumentParser) -> None:
    """Signed-in users (http): access tokens checked as an OAuth resource server."""
    g = p.add_argument_group("signing users in (http; docs/mcp.md, Signing users in)")
    g.add_argument("--auth-issuer", metavar="URL", default=None,
                   help="check every request's bearer token as a JWT this issuer signed (https, "
                   "or http on loopback); each user is one tenant, whatever sessions they open")
    g.add_argument("--auth-audience", metavar="AUD", default=None,
                   help="the audience ('aud') tokens must be issued for (required with "
                   "--auth-issuer)")
    g.add_argument("--auth-jwks-url", metavar="URL", default=None,
                   help="the issuer's keys (default: the jwks_uri of its metadata, RFC 8414 or "
                   "OIDC discovery)")
    g.add_argument("--auth-required-scope", metavar="S", action="append", default=[],
                   help="a scope every token must hold, else 403 (repeatable)")
    g.add_argument("--auth-tenant-claim", metavar="CLAIM", default=None,
                   help="the claim naming the user, with the issuer (default: sub)")
    g.add_argument("--auth-resource-url", metavar="URL", default=None,
                   help="this server's URL as clients reach it, named in the protected-resource "
                   "metadata (default: the bound address's /mcp)")
    g.add_argument("--auth-policy", metavar="FILE", default=None,
                   help="JSON rules of the tools each user may see and call, by the token's "
                   "claims (default-deny with the file)")
    g.add_argument("--tenant-idle-timeout", type=_positive_float, default=None, metavar="S",
                   help="a signed-in user with no session for this long has their tenant "
                   "removed: workers, uid, disk and workspace (default: 3600)")
    g.add_argument("--keep-workspaces", action="store_true",
                   help="http: a tenant removed keeps its workspace folder on disk")


def _add_load_options(p: argparse.ArgumentParser) -> None:
    """What keeps one client from taking the server (every session costs processes)."""
    from .mcp_limits import DEFAULT_SESSIONS_PER_CLIENT, default_max_sessions
    g = p.add_argument_group("load (http; --rate-limit over stdio too)")
    g.add_argument("--max-sessions", type=_positive_int, default=default_max_sessions(),
                   metavar="N", help="live sessions at most; past it a new session gets 503 "
                   "with Retry-After and nothing is started (default: one per 32 MiB of this "
                   "machine's memory, 16 to 4,096: %(default)s here)")
    g.add_argument("--max-sessions-per-client", type=_positive_int,
                   default=DEFAULT_SESSIONS_PER_CLIENT, metavar="N",
                   help="live sessions at most per client: per bearer token when the server "
                   "has one (every holder of it is one client), else per client address (all "
                   "loopback addresses one, an IPv6 address by its /64, X-Forwarded-For only "
                   "from --forwarded-allow-ips); past it a new session gets 429 with "
                   "Retry-After (default: "
                   f"{DEFAULT_SESSIONS_PER_CLIENT})")
    g.add_argument("--session-idle-timeout", type=_positive_float, default=1800.0, metavar="S",
                   help="a session with no request for this long ends, as on DELETE: its "
                   "workers stop, its workspace, disk and uid are removed (default: 1800)")
    g.add_argument("--max-workers", type=_positive_int, default=None, metavar="N",
                   help="worker processes at most, all sessions together (default: no cap)")
    g.add_argument("--max-workers-per-session", type=_positive_int, default=None, metavar="N",
                   help="worker processes at most per session (default: no cap)")
    g.add_argument("--max-calls-per-session", type=_positive_int, default=8, metavar="N",
                   help="tool calls of one session running at once; more wait their turn, "
                   "other sessions are not slowed (default: 8)")
    g.add_argument("--rate-limit", type=_positive_float, default=None, metavar="R",
                   help="tools/call per second per session (a burst of 2 s worth); over it: "
                   "HTTP 429 with Retry-After (stdio: a JSON-RPC error with data.retryAfter)")
    g.add_argument("--max-connections", type=_positive_int, default=1024, metavar="N",
                   help="HTTP connections at once; more get 503 at once (default: 1024)")
    g.add_argument("--metrics", action="store_true",
                   help="serve GET /metrics (Prometheus text; behind the bearer token when one "
                   "is set)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1 or more")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be more than 0")
    return value


class _Usage(Exception):
    """A mistake in the command: one line on stderr, exit status 2 (as cli.UsageError)."""


def _usage(message: str) -> Exception:
    return _Usage(message)


def _configs(path: Optional[str]) -> dict:
    if not path:
        return {}
    try:
        return read_configs(path)
    except ConfigError as exc:
        raise _usage(f"--config {path!r}: {exc}") from None


def _check_configs(args: argparse.Namespace, configs: dict, folders: list[str],
                   confine: Union[bool, str], network: Union[bool, dict]) -> None:
    """--config checked as every session's binding would check it, over the sessions' own
    settings (mcp_config.py): before anything is served; its warnings logged once."""
    try:
        base = check_together(Limits(timeout_s=args.timeout or None, memory_mb=args.memory_mb,
                                     confine=confine, network=network))
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    try:
        warnings = check_configs(configs, folders, base)
    except ConfigError as exc:
        raise _usage(f"--config {args.config!r}: {exc}") from None
    for warning in warnings:
        log.warning("--config %r: %s", args.config, warning)


def _token(path: Optional[str]) -> Optional[str]:
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise _usage(f"--token-file {path!r}: {exc.strerror or exc}") from None
        if not token:
            raise _usage(f"--token-file {path!r} is empty")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def cmd_serve_mcp(args: argparse.Namespace) -> int:
    """``lcp-sandbox serve-mcp``: run the MCP server until the client or a signal stops it;
    2 for a mistake in the command."""
    try:
        return _serve(args)
    except _Usage as exc:
        print(f"lcp-sandbox serve-mcp: {exc}", file=sys.stderr)
        return 2
    except ConnectionError as exc:
        if args.ray is None:
            raise
        # The Ray cluster could not be joined (mcp_ray.ray_supervisor): said, nothing served.
        print(f"lcp-sandbox serve-mcp: {exc}", file=sys.stderr)
        return 1


def _secrets(args: argparse.Namespace, configs: dict) -> dict[str, str]:
    """--secret's values (exit 2 naming a secret that cannot be read, never its value, or
    one a library's policy in --config binds that no --secret gives)."""
    from .mcp_secrets import secret_values, unheld
    if args.upstream_ca_file is not None and not os.path.isfile(args.upstream_ca_file):
        raise _usage(f"--upstream-ca-file {args.upstream_ca_file!r} is not a file")
    try:
        values = secret_values(args.secret)
        unheld(configs, values)
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    return values


def _network(args: argparse.Namespace, confine: object) -> "bool | dict[str, list[str]]":
    """The sessions' network setting from --no-network and --network-allow/--network-deny."""
    if args.network_deny and not args.network_allow:
        raise _usage("--network-deny needs --network-allow (with no allow rule, give "
                     "--no-network)")
    if args.no_network and args.network_allow:
        raise _usage("--no-network and --network-allow contradict each other")
    if not args.network_allow:
        return not args.no_network
    if not confine:
        raise _usage("--network-allow holds only confined workers: serve over http, or add "
                     "--confine")
    policy = {"allow": args.network_allow, "deny": args.network_deny}
    try:
        policy_of(policy)
    except ValueError as exc:
        raise _usage(str(exc)) from None
    return policy


def forwarded_allow_ips(text: Optional[str]) -> Optional[str]:
    """--forwarded-allow-ips checked: addresses and networks only, in one spelling for
    uvicorn.  uvicorn would take anything else as a literal that matches no peer (a typo
    trusts nothing, silently), and "*" as trusting every peer, which then takes the
    leftmost X-Forwarded-For entry: the one the client writes itself."""
    if text is None:
        return None
    out = []
    for item in (i.strip() for i in text.split(",")):
        if item == "*":
            raise _usage(f"--forwarded-allow-ips {text!r}: '*' would let every client name "
                         f"itself any address; give the proxies' addresses or networks "
                         f"(e.g. 10.0.0.0/8)")
        try:
            out.append(str(ipaddress.ip_network(item) if "/" in item
                           else ipaddress.ip_address(item)))
        except ValueError as exc:
            raise _usage(f"--forwarded-allow-ips {text!r}: {item!r} is not an IP address or "
                         f"network ({exc}); give a comma list such as "
                         f"127.0.0.1,10.0.0.0/8") from None
    return ",".join(out)


def _uid_range(given: Optional[list]) -> Optional[tuple[int, int]]:
    if given is None:
        return None
    try:
        return uid_range_setting(tuple(given))
    except (TypeError, ValueError) as exc:
        raise _usage(f"--uid-range: {exc}") from None


def _check_reach(args: argparse.Namespace, folders: list[str]) -> None:
    """A root server whose workers run as other uids and can make no mount namespace (a
    container's default): a tools folder, the environment or the interpreter they could
    not reach is said now, naming the folder in the way, not at each session's first call."""
    from ..backends.local.confine.handover import reach_refusal
    uid = ((_uid_range(args.uid_range) or DEFAULT_UID_RANGE)[0] if args.transport == "http"
           else DEFAULT_RUN_AS[0])
    for folder in folders:
        why = reach_refusal(uid, uid, [folder])
        if why:
            raise _usage(f"the confined workers could not reach their tools: {why}")


_AUTH_ONLY = ("auth_audience", "auth_jwks_url", "auth_required_scope", "auth_tenant_claim",
              "auth_resource_url", "auth_policy", "tenant_idle_timeout")


def _auth(args: argparse.Namespace, token: Optional[str]) -> tuple[Any, Any]:
    """(AuthConfig, JwtVerifier) of the --auth-* flags, or (None, None); a combination
    that cannot hold is a usage error naming it."""
    if args.auth_issuer is None:
        given = [a for a in _AUTH_ONLY if getattr(args, a)]
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise _usage(f"{flag} needs --auth-issuer URL (tokens are checked only then)")
        return None, None
    if args.transport != "http":
        raise _usage("--auth-issuer needs --transport http (over stdio there is no token)")
    if token is not None:
        raise _usage(f"--auth-issuer and a static bearer token (--token-file or {TOKEN_ENV}) "
                     f"exclude each other: give one")
    from .mcp_auth import AuthConfig, AuthSetupError, make_verifier
    config = AuthConfig(issuer=args.auth_issuer, audience=args.auth_audience or "",
                        jwks_url=args.auth_jwks_url,
                        required_scopes=tuple(args.auth_required_scope),
                        tenant_claim=args.auth_tenant_claim or "sub",
                        resource_url=args.auth_resource_url)
    if config.resource_url is None and args.host in ("0.0.0.0", "::", "[::]"):
        log.warning("--auth-resource-url is not given: the protected-resource metadata names "
                    "the bound address %s, which no client reaches; give the server's URL",
                    args.host)
    try:
        if config.resource_url is not None:
            from .mcp_auth import checked_url
            checked_url(config.resource_url, "--auth-resource-url")
        return config, make_verifier(config)
    except AuthSetupError as exc:
        raise _usage(str(exc)) from None


def _policy(path: Optional[str]) -> Optional[list]:
    if path is None:
        return None
    from .mcp_users import PolicyError, read_policy
    try:
        return read_policy(path)
    except PolicyError as exc:
        raise _usage(f"--auth-policy {path!r}: {exc}") from None


def _serve(args: argparse.Namespace) -> int:
    for folder in args.folders:
        if not os.path.isdir(folder):
            why = "is not a folder" if os.path.exists(folder) else "does not exist"
            raise _usage(f"tools folder {folder!r} {why}")
    if args.ray is not None:
        from .mcp_ray import refusal
        refused = refusal(args)
        if refused is not None:
            raise _usage(refused)
    configs = _configs(args.config)
    forwarded = forwarded_allow_ips(args.forwarded_allow_ips)
    token = _token(args.token_file) if args.transport == "http" else None
    try:
        from . import mcp_server, mcp_transports
    except ImportError as exc:
        raise _usage(f"needs the official 'mcp' package (pip install 'lcp-sandbox[mcp]'): "
                     f"{exc}") from None
    policy = _policy(args.auth_policy)
    auth, verifier = _auth(args, token)
    if (args.transport == "http" and token is None and auth is None
            and not mcp_transports.is_loopback(args.host)):
        raise _usage(f"refusing to serve on {args.host!r} without a bearer token: anyone who can "
                     f"reach it could run the tools. Give --token-file FILE (or set {TOKEN_ENV}), "
                     f"or bind to 127.0.0.1.")
    confine = (args.transport == "http") if args.confine is None else args.confine
    network = _network(args, confine)
    folders = [os.path.realpath(f) for f in args.folders]
    _check_configs(args, configs, folders, confine, network)
    if confine:
        _check_reach(args, folders)
    options = mcp_server.ServeOptions(
        folders=folders, host_tool_configs=configs,
        workspace=args.workspace, workspace_root=os.path.realpath(args.workspace_root),
        confine=confine, network=network,
        timeout_s=args.timeout or None, memory_mb=args.memory_mb,
        auto_confirm=args.auto_confirm, max_sessions=args.max_sessions,
        max_sessions_per_client=args.max_sessions_per_client,
        session_idle_timeout_s=args.session_idle_timeout, uid_range=_uid_range(args.uid_range),
        max_workers=args.max_workers,
        max_workers_per_session=args.max_workers_per_session,
        max_calls_per_session=args.max_calls_per_session, rate_limit=args.rate_limit,
        metrics=args.metrics, max_connections=args.max_connections,
        signed_in=auth is not None, tenant_idle_timeout_s=args.tenant_idle_timeout or 3600.0,
        keep_workspaces=args.keep_workspaces, policy=policy, secrets=_secrets(args, configs),
        upstream_ca_file=args.upstream_ca_file, ray=args.ray)
    if args.transport == "stdio":
        return mcp_transports.serve_stdio(options)
    return mcp_transports.serve_http(options, args.host, args.port, token, tuple(args.allowed_host),
                                     tuple(args.allowed_origin), forwarded,
                                     (auth, verifier) if auth is not None else None)
