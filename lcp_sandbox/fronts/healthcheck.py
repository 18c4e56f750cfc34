"""The container's health check: GET /healthz of the server that is its PID 1, on the address
and port that server's own command line gives it.

    python -m lcp_sandbox.fronts.healthcheck [PID]     exit 0: 200 "ok"; 1: anything else

The image's HEALTHCHECK runs this, so a container started with another ``--port`` or
``--host`` is asked where it serves, not where the image's default command would: the
command line is read from the kernel (/proc/PID/cmdline) and parsed by serve-mcp's own
parser, the one that server used.
"""
from __future__ import annotations

import sys
import urllib.request
from pathlib import Path
from typing import Optional

from .cli import build_parser
from .mcp_transports import HEALTH_PATH

TIMEOUT_S = 2.0
_ANY = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def served_url(pid: int) -> str:
    """Where the serve-mcp process ``pid`` answers its probe (ValueError saying why not)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
    try:
        at = argv.index("serve-mcp")
    except ValueError:
        raise ValueError(f"process {pid} is not lcp-sandbox serve-mcp: {argv[:4]}") from None
    try:
        args = build_parser().parse_args(argv[at:])
    except SystemExit:
        raise ValueError(f"process {pid}'s command does not parse: {argv[at:]}") from None
    if args.transport != "http":
        raise ValueError(f"process {pid} serves over {args.transport}, not http")
    if args.port == 0:
        raise ValueError(f"process {pid} serves on a port the kernel chose (--port 0): "
                         f"give it a port for the health check to ask")
    host = _ANY.get(args.host, args.host)
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{args.port}{HEALTH_PATH}"


def main(argv: Optional[list[str]] = None) -> int:
    """0 if the server answers its probe with 200 ``ok``; 1 (and why, on stderr) if not."""
    args = sys.argv[1:] if argv is None else argv
    pid = int(args[0]) if args else 1
    url = f"process {pid}"
    try:
        url = served_url(pid)
        # no proxy from the environment: the server is on this machine
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(url, timeout=TIMEOUT_S) as answer:
            body = answer.read(64)
        if answer.status != 200 or body.strip() != b"ok":
            raise ValueError(f"answered {answer.status} {body[:32]!r}")
    except (OSError, ValueError) as exc:
        print(f"unhealthy: {url}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
