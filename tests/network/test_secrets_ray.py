"""Secrets over Ray: the front holds them, each node's agent gets them for its egress proxy,
and the workers on every node hold placeholders (the session's local Ray cluster, its head
and its node; the servers, the CA and the probe library are test_secrets.py's).  Workers
are known by what the host sees: the pid and node of RaySupervisor.stats()."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import uuid

import psutil
import pytest
from test_secrets import (
    LIBS,
    VALUE,
    answer,
    binding,
    holds,
    out,
    policy,
    serve_args,
    url,
    value_through,
    world,  # noqa: F401 (the fixture)
)

from lcp_sandbox import SandboxedBinding
from lcp_sandbox.core.secrets import PLACEHOLDER_PREFIX

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(importlib.util.find_spec("ray") is None,
                                 reason="the ray extra is not installed")]


def test_each_node_s_proxy_swaps_and_no_worker_on_any_node_holds_the_value(
        ray_cluster, world, open_tmp_module):  # noqa: F811
    """RaySupervisor(secrets, upstream_ca_file) (the CAs' text goes to the nodes, no shared
    path): a tenant on each node gets the host's value to the bound host and holds a
    placeholder; a binding's own secret goes over the host's; set_secret() reaches the next
    worker on every node; another host gets only the placeholder; no worker's environment
    or memory, on either node, holds the value."""
    from lcp_sandbox import RaySupervisor
    old = "sk-old-" + uuid.uuid4().hex
    sup = RaySupervisor(confine=True, secrets={"API_KEY": old}, upstream_ca_file=world[0])
    try:
        sup.start()
        assert sup.secret_names == {"API_KEY"}
        tenants = [binding(sup, open_tmp_module, f"ray-secret-{i}", policy(world))
                   for i in range(2)]
        for t in tenants:
            held = out(t, "tool_placeholder")
            assert held.startswith(PLACEHOLDER_PREFIX) and old not in held
            got = answer(out(t, "tool_call", url=url(world, "api"), client="httpx"))
            # Swapped (no placeholder reached the server), with the value of then.
            assert got == {"server": "api", "value": False, "placeholder": False}
        rows = {t.tenant: next(s for s in t.stats() if s["library"] == "secretprobe")
                for t in tenants}
        assert len({r["node"] for r in rows.values()}) == 2, rows
        ws = open_tmp_module / "ray-secret-own"
        ws.mkdir()
        own = SandboxedBinding(tools_folders=[LIBS], supervisor=sup, tenant="ray-secret-own",
                               workspace=str(ws), workspace_root=str(ws),
                               secrets={"API_KEY": VALUE}, host_tool_configs={
                                   "secretprobe": {"sandbox": {"network": policy(world)}}})
        assert answer(out(own, "tool_call", url=url(world, "api")))["value"] is True
        sup.set_secret("API_KEY", VALUE)
        for t in tenants:
            t.restart_library("secretprobe")
            assert answer(out(t, "tool_call", url=url(world, "api")))["value"] is True
            got = answer(out(t, "tool_call", url=url(world, "other"), verify=False))
            assert got == {"server": "other", "value": False, "placeholder": True}
        pids = [next(s["pid"] for s in t.stats() if s["library"] == "secretprobe")
                for t in tenants]
        assert all(psutil.pid_exists(p) for p in pids)
        assert not any(holds(p, VALUE.encode()) for p in pids)
    finally:
        sup.close()


def test_serve_mcp_on_ray_takes_the_value_and_the_cas(ray_cluster, world, open_tmp):  # noqa: F811
    """serve-mcp --ray with --secret NAME=env:VAR and --upstream-ca-file: an MCP client's call
    runs on a node of the cluster and its request gets the value at the bound host; the
    result holds no byte of it.  A --secret that cannot be read is exit 2, naming it."""
    args = [*serve_args(world, open_tmp), "--ray", ray_cluster.address]
    value_through(world, [*args, "--secret", "API_KEY=env:THE_KEY"],
                  {**os.environ, "THE_KEY": VALUE})
    unknown = subprocess.run([*args, "--secret", "API_KEY=env:NOT_SET_ANYWHERE"],
                             capture_output=True, text=True, timeout=120)
    assert unknown.returncode == 2 and "API_KEY" in unknown.stderr, unknown.stderr


def test_a_node_that_does_not_take_a_changed_secret_is_lost(ray_cluster):
    """set_secret() sends the new value to every node's agent; a node whose agent does not
    take it (here: its agent killed) is lost at once, so that no worker there starts with
    the value of before; the other node keeps serving.  The values are never among the
    agents' creation settings (which the cluster's GCS keeps)."""
    import ray

    from lcp_sandbox import RaySupervisor
    sup = RaySupervisor(secrets={"API_KEY": "sk-before"})
    try:
        sup.start()
        nodes = sup._nodes.live()
        assert len(nodes) == 2 and "sk-before" not in repr(sup._nodes.options)
        gone, kept = nodes
        ray.kill(gone.agent, no_restart=True)
        sup.set_secret("API_KEY", VALUE)
        assert not gone.alive and sup._nodes.live() == [kept]
        assert VALUE not in repr(sup._nodes.options)
    finally:
        sup.close()
