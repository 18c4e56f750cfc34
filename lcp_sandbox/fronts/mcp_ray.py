"""``serve-mcp --ray ADDRESS``: the sessions' tenants on the nodes of a Ray cluster.

    command line ─► refusal(args): ray not importable, or a flag the Ray backend cannot
                    honour (--max-workers) ─► exit 2, naming it
    transport    ─► ray_supervisor(options): RaySupervisor(ADDRESS, tenants_root =
                    --workspace-root, per-node pools, --secret's values and
                    --upstream-ca-file's CAs for every node's egress proxy), connected and
                    an agent started on every node before the server says it serves
    McpFront     ─► the same calls on either engine (ServerBackend): run, stop, stats,
                    metrics, remove_tenant; held_tenants() for the start's sweep

Each node's own Supervisor confines, limits and recovers as on one machine; workspaces and
tool folders must be on storage every node mounts at the same path (docs/ray.md).
"""
from __future__ import annotations

import argparse
from typing import Any, Optional, Union

from ..backends.local import Supervisor
from ..backends.ray.driver import RaySupervisor

#: The engine a front serves on: this machine's, or a Ray cluster's.
ServerBackend = Union[Supervisor, RaySupervisor]

EXTRA = "pip install 'lcp-sandbox[ray]'"

#: Flags the Ray backend cannot honour, and why.
_NOT_ON_RAY = {
    "max_workers": "it caps this machine's pool; over Ray, each node has its own pool "
                   "(--max-workers-per-session still caps a session's workers)",
}


def refusal(args: argparse.Namespace) -> Optional[str]:
    """Why ``--ray`` cannot serve this command, or None."""
    try:
        import ray  # noqa: F401  (the import ray_supervisor's RaySupervisor makes)
    except ImportError as exc:
        return f"--ray needs the 'ray' package, the ray extra: {EXTRA} ({exc})"
    for name, why in _NOT_ON_RAY.items():
        if getattr(args, name):
            flag = "--" + name.replace("_", "-")
            return f"{flag} cannot be honoured with --ray: {why}; drop it or serve without --ray"
    return None


def ray_supervisor(options: Any, http: bool) -> RaySupervisor:
    """(``options``: mcp_server.ServeOptions, not imported: it imports this module) The
    RaySupervisor of ``options.ray`` ("auto": the cluster Ray finds), connected, with
    an agent on every live node; ConnectionError naming the address when it cannot be."""
    address = options.ray
    sup = RaySupervisor(address=address, confine=options.confine,
                        max_workers_per_tenant=options.max_workers_per_session,
                        tenants_root=options.workspace_root if http else None,
                        uid_range=options.uid_range, secrets=options.secrets or None,
                        upstream_ca_file=options.upstream_ca_file)
    try:
        sup.start()
    except Exception as exc:                         # noqa: BLE001 (said, then the exit)
        sup.close()
        raise ConnectionError(f"--ray {address}: the Ray cluster could not be joined "
                              f"({type(exc).__name__}: {exc})"[:1000]) from None
    return sup


def held_tenants(backend: ServerBackend) -> list[str]:
    """The tenants holding a uid of the backend's record (all nodes' over Ray)."""
    if isinstance(backend, RaySupervisor):
        return backend.held_tenants()
    return backend.uids.tenants()
