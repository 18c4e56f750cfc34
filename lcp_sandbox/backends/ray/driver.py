"""The Ray backend: the same engine on every node of a Ray cluster.

    SandboxedBinding ── run(spec, msg, objects) ──► RaySupervisor (the driver, the caller's thread)
      slot (tenant, library, root) placed once: the live node with the fewest slots
      (under max_workers_per_node first); it stays there while that node lives
      agent.run.remote(...) ─────────────────────► NodeAgent on that node (agent.py)
      loop on the call's queue:                        local Supervisor.run(spec, msg, Relay):
         NEED_INIT ─► spec.init() here ─► agent.reply    zygote, worker, deadlines, memory,
         REQUEST   ─► HostObjects.handle() here ─► reply crashes (REQUESTs relayed, relay.py)
         done      ─► the value (decoded here) | SandboxEvent | the exception
      node lost (its agent died, or does not answer a ping while the call waits) ─► 503
      naming the node; the slot is placed again at its next call
    interrupt(tenant, thread) ─► the call that thread waits for ─► agent.interrupt(tenant, cid)
      on its node (deadline INTERRUPT_S) ─► the local Supervisor.interrupt: 499 as on one machine

    nodes.py   nodes, their agents, placements, a tenant's removal; per node a dispatcher thread:
               agent.events() (a streaming call) ─► each call's queue, events ─► on_event
    agent.py   the agent: a local Supervisor on its node
    relay.py   the REQUESTs' relay, both ends; the driver's end of a call (DriverCall)

Ray places, starts and watches the agents; each agent's local Supervisor gives
the guarantees Ray's own workers do not (per-call workspace, soft interrupt,
per-worker memory limit, crash policy).  Nothing here imports ray until the
supervisor is used (the ``ray`` extra).
"""
from __future__ import annotations

import atexit
import itertools
import logging
import os
import pickle
import threading
import time
import weakref
from typing import Any, Callable, NoReturn, Optional, Union

from ... import protocol as P
from ...core.keywords import checked_keywords
from ...core.normalize import UNAVAILABLE, failure
from ...core.outcomes import CallFailed, SandboxEvent, Unavailable
from ...core.secrets import host_secrets
from ..base import Closing, Lent, WorkerSpec, emit
from .cluster_metrics import merged
from .nodes import Node, Nodes, Placed
from .relay import (
    ABORT,
    ANSWER,
    DONE,
    INIT,
    NEED_INIT,
    RAISED,
    REQUEST,
    SANDBOX_EVENT,
    VALUE,
    DriverCall,
    RemoteConn,
    unpack_outcome,
    when_done,
)

log = logging.getLogger("lcp_sandbox")

#: A call that hears nothing from its node for this long pings the node's agent ...
HEARTBEAT_S = 10.0
#: ... which must answer within this long, else the node is lost (the call: 503).
PING_S = 10.0
#: An interrupt's deadline: the node's agent answers within this long, else it was not sent.
INTERRUPT_S = 10.0
_live: "weakref.WeakSet[RaySupervisor]" = weakref.WeakSet()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("RaySupervisor needs ray: pip install 'lcp-sandbox[ray]'") from exc
    return ray


class RaySupervisor(Closing):
    """A Backend that runs each (tenant, library) on one node of a Ray cluster.

    ``address``: None joins the cluster Ray finds (``RAY_ADDRESS``, or one started
    with ``ray start`` on this machine) or starts a local one; a string goes to
    ``ray.init`` as it is; if Ray is already initialized in this process, that is
    used.  ``max_workers_per_node`` and ``max_workers_per_tenant`` are each node's
    pool limits; ``idle_timeout_s``, ``confine``, ``tenants_root``, ``uid_range``,
    ``envs_dir``, ``env_wait_s`` and ``on_event`` as for ``Supervisor``, on every node
    (events carry ``"node"`` and arrive from a background thread; a library's environment
    is built on the node that runs it, in that node's store: ``envs_dir`` as that node
    sees it, None: the node's own default).  ``secrets`` and ``upstream_ca_file`` as for
    ``Supervisor``: each node's agent holds the values (sent to it by a call once it is up,
    and at ``set_secret()``) and the CAs' text (read here: no shared path needed); its
    egress proxy puts them in requests, and no worker holds them."""

    #: The network of bindings that do not choose (Backend.network): the host's.  A
    #: binding's or a library's own setting travels in its WorkerSpec's limits.
    network: Union[bool, dict] = True

    def __init__(self, address: Optional[str] = None,
                 max_workers_per_node: Optional[int] = None,
                 max_workers_per_tenant: Optional[int] = None,
                 idle_timeout_s: Optional[float] = None, confine: Union[bool, str] = False,
                 on_event: Optional[Callable[[dict], None]] = None,
                 tenants_root: Optional[str] = None,
                 uid_range: Optional[tuple[int, int]] = None,
                 envs_dir: Optional[str] = None, env_wait_s: Optional[float] = None,
                 secrets: Optional[dict[str, str]] = None,
                 upstream_ca_file: Optional[str] = None) -> None:
        checked = checked_keywords("RaySupervisor", locals())
        if upstream_ca_file is not None and not os.path.isfile(upstream_ca_file):
            raise ValueError(f"RaySupervisor: upstream_ca_file {upstream_ca_file!r} is not a file")
        self._secrets: dict[str, str] = checked.get("secrets") or {}
        # Its text: each node's agent writes it to a file of its own (no shared path needed).
        self._upstream_cas: Optional[str] = None
        if upstream_ca_file is not None:
            try:
                with open(upstream_ca_file, encoding="ascii") as f:
                    self._upstream_cas = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise ValueError(f"RaySupervisor: upstream_ca_file {upstream_ca_file!r} cannot "
                                 f"be read as PEM text ({type(exc).__name__})") from None
        self.address = address
        self.max_workers_per_node = max_workers_per_node
        self.max_workers_per_tenant = max_workers_per_tenant
        self.idle_timeout_s = idle_timeout_s
        self.confine = confine
        self.on_event = on_event
        self.tenants_root = tenants_root
        self.uid_range = uid_range
        self.envs_dir = envs_dir
        self.env_wait_s = env_wait_s
        self._ray: Any = None
        self._owns_ray = False
        self._nodes: Optional[Nodes] = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False

    def start(self) -> None:
        """Connect to Ray and start an agent on every live node now (else the first call does)."""
        self._table().refresh(force=True)

    def _table(self) -> Nodes:
        """The node table, connecting to Ray first if need be."""
        nodes = self._nodes
        if nodes is not None:
            return nodes
        with self._lock:
            if self._closed:
                raise Unavailable("The sandbox supervisor is closed.")
            if self._nodes is None:
                ray = _import_ray()
                if not ray.is_initialized():
                    ray.init(address=self.address)
                    self._owns_ray = True
                self._ray = ray
                _live.add(self)
                # After ray.init's own hook: runs before it.
                _register_atexit()
                options = {"max_workers": self.max_workers_per_node,
                           "max_workers_per_tenant": self.max_workers_per_tenant,
                           "idle_timeout_s": self.idle_timeout_s, "confine": self.confine,
                           "tenants_root": self.tenants_root, "uid_range": self.uid_range,
                           "envs_dir": self.envs_dir, "env_wait_s": self.env_wait_s}
                self._nodes = Nodes(ray, options, self._event, self._held_secrets)
            return self._nodes

    def _held_secrets(self) -> Optional[tuple[dict[str, str], Optional[str]]]:
        """What each node's agent gets by hold_secrets() (None: nothing to hold)."""
        if not self._secrets and self._upstream_cas is None:
            return None
        return dict(self._secrets), self._upstream_cas

    @property
    def secret_names(self) -> frozenset[str]:
        """(Backend) the names of the secrets it holds: the values go to each node's agent
        (its egress proxy puts them in requests), never to a worker."""
        return frozenset(self._secrets)

    def set_secret(self, name: str, value: str) -> None:
        """Hold ``value`` as the secret ``name``: on every node, each worker started from now
        on puts it in its requests (one that runs keeps the value it started with)."""
        self._secrets = {**self._secrets, **host_secrets({name: value}, "RaySupervisor.set_secret")}
        if self._nodes is not None:
            self._nodes.hold_secrets()

    def _event(self, event: dict) -> None:
        emit(self.on_event, event)

    # ------------------------------------------------------------ calling
    def run(self, spec: WorkerSpec, msg: tuple, objects: Lent, *, tool: str,
            timeout_s: Optional[float] = None) -> Any:
        """As Supervisor.run, on the node the slot of ``spec`` lives on."""
        name = spec.library.name
        if self._closed:
            raise Unavailable.not_run(name, tool, "the sandbox supervisor is closed.")
        nodes = self._table()
        node, placed = nodes.place(spec, tool)
        call = DriverCall(next(self._ids), node)
        node.calls[call.cid] = call
        try:
            args = (call.cid, spec.tenant, spec.library, spec.limits, spec.root, msg, tool,
                    timeout_s, dict(spec.secrets))
            ref = node.agent.run.remote(pickle.dumps(args, protocol=5))
            when_done(ref, call.finished)
            conn = RemoteConn(call)
            while True:
                item = call.wait(HEARTBEAT_S)
                if item is None:
                    self._ping(nodes, node, name, tool)
                    continue
                if item[0] == DONE:
                    return self._outcome(item[1], nodes, node, placed, name, tool)
                if item[1] == REQUEST:
                    self._request(call, conn, objects, item)
                elif item[1] == NEED_INIT:
                    try:
                        call.reply((INIT, spec.init()))
                    except Exception as exc:             # noqa: BLE001
                        log.exception("building the INIT of %s failed", name)
                        call.reply((ABORT, f"{type(exc).__name__}: {exc}"))
        finally:
            node.calls.pop(call.cid, None)
            # This thread stopped waiting (an exception here):
            if call.done is None:
                                          # free the node's call
                try:
                    call.reply((ABORT, "the host stopped waiting for the call"))
                except Exception:                        # noqa: BLE001
                    pass
            objects.release()

    def _request(self, call: DriverCall, conn: RemoteConn, objects: Lent, item: tuple) -> None:
        """One REQUEST of the worker, served here: decoded with this host's Decoder."""
        _, _, frame, remaining = item
        objects.conn = conn
        objects.deadline = None if remaining is None else time.monotonic() + remaining
        try:
            size, kind = P.HEADER.unpack_from(frame)
            if kind != P.REQUEST or size != len(frame) - P.HEADER.size:
                raise P.BadMessage("a relayed frame that is not one REQUEST")
            req = P.parse_from_worker(kind, memoryview(frame)[P.HEADER.size:], conn.decoder)
        except P.BadMessage as exc:
            conn.broken = conn.broken or str(exc)
            answer: tuple = (False, ["RuntimeError", ["protocol violation"]])
        else:
            answer = objects.handle(req, conn.decoder.saw_ref)
        try:
            call.reply((ANSWER, answer, conn.broken, conn.take_sends()))
        except Exception as exc:                         # noqa: BLE001 (the answer cannot cross)
            error = ["TypeError", [f"the host's answer cannot be sent: {exc}"]]
            call.reply((ANSWER, (False, error), conn.broken, []))

    def _outcome(self, result: Any, nodes: Nodes, node: Node, placed: Placed, name: str,
                 tool: str) -> Any:
        ray = self._ray
        try:
            if isinstance(result, BaseException):
                raise result
            tag, payload, calls, starts = unpack_outcome(result)
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError,
                ray.exceptions.WorkerCrashedError, ray.exceptions.LocalRayletDiedError) as exc:
            self._lost(nodes, node, name, tool, exc)
        except Exception as exc:                         # noqa: BLE001
            raise CallFailed(f"[{name}] tool '{tool}': Ray failed to run the call "
                             f"({type(exc).__name__}: {exc})"[:1000]) from None
        placed.calls, placed.starts = calls, starts
        if tag == VALUE:
            return payload
        if tag == SANDBOX_EVENT and type(payload) is dict and type(payload.get("error")) is str:
            raise SandboxEvent(payload)
        if tag == RAISED and P.is_error(payload):
            raise P.rebuild_error(*payload)
        raise CallFailed(f"[{name}] tool '{tool}': the node's agent answered something unexpected.")

    def _ping(self, nodes: Nodes, node: Node, name: str, tool: str) -> None:
        """The call heard nothing for HEARTBEAT_S: its node's agent must answer a ping within
        PING_S (a call may run long; a node that stopped answering may not hold it)."""
        try:
            self._ray.get(node.agent.ready.remote(), timeout=PING_S)
        except Exception as exc:                         # noqa: BLE001 (dead, or not answering)
            self._lost(nodes, node, name, tool, exc)

    def _lost(self, nodes: Nodes, node: Node, name: str, tool: str, exc: BaseException) -> NoReturn:
        """The call's node is lost: SandboxEvent (503, naming the node and the retry)."""
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        why = f"{type(exc).__name__}: {first_line}"[:300]
        if self._closed:
            raise Unavailable(f"[{name}] tool '{tool}' was stopped: the sandbox supervisor "
                              f"was closed while it ran.") from None
        nodes.lose(node, why)
        raise SandboxEvent(failure(
            f"[{name}] tool '{tool}' did not complete: Ray node {node.id}, where its worker "
            f"ran, was lost ({why}). The host is unaffected; retry the call: it starts a fresh "
            f"worker on a live node (module state was lost).", UNAVAILABLE)) from None

    # ------------------------------------------------------------ the rest of the Backend
    def remove_tenant(self, tenant: str, root: Optional[str] = None) -> Optional[int]:
        """As Supervisor.remove_tenant (workers, uid; with ``root``: its disk and the root
        itself), on the node(s) that hold the tenant's slots, whose placements are forgotten
        (on every live node when none holds one: a tenant an earlier server left).  The uid
        given back, or None; OSError also when a node does not confirm in time."""
        if self._closed:
            raise Unavailable("The sandbox supervisor is closed.")
        return self._table().remove_tenant(tenant, root)

    def held_tenants(self) -> list[str]:
        """The tenants holding a uid of any live node's record (of ``tenants_root``)."""
        if self._closed:
            return []
        return sorted({t for _, held in self._table().gather("held_tenants") for t in held})

    def metrics(self) -> dict[str, Any]:
        """Supervisor.metrics() of every live node made one (cluster_metrics.py): the call
        rows carry ``"node"``, ``"nodes"`` holds each node's workers by state."""
        if self._nodes is None:
            return merged([])
        return merged([(node.id, snap) for node, snap in self._nodes.gather("metrics")])

    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant, on whichever node, and forget
        the slot(s)."""
        return self._nodes.stop(tenant, library_key) if self._nodes is not None else False

    def stats(self, tenant: Optional[str] = None) -> list[dict]:
        """Supervisor.stats() of every node, each row with ``"node"`` (the Ray node id);
        ``calls`` and ``restarts`` count the slot's workers on nodes since lost, and a slot
        whose node was lost shows as stopped until its next call."""
        if self._nodes is None:
            return []
        placed = list(self._nodes.placed.values())
        rows = []
        for node, node_rows in self._nodes.gather("stats", tenant):
            mine = {(p.tenant, p.library, p.root): p for p in placed if p.node is node}
            for row in node_rows:
                p = mine.get((row["tenant"], row["library"], row["workspace_root"] or ""))
                if p is not None:
                    row["calls"] += p.carried_calls
                    row["restarts"] += p.carried_starts
                rows.append({**row, "node": node.id})
        for p in placed:
            if p.node is None and p.lost and (tenant is None or p.tenant == tenant):
                rows.append({"library": p.library, "tenant": p.tenant, "pid": None,
                             "state": "stopped", "calls": p.carried_calls,
                             "restarts": max(0, p.carried_starts - 1),
                             "last_exit": f"its node was lost ({p.lost})", "rss": 0,
                             "peak_rss": 0, "protections": {},
                             "workspace_root": p.root or None, "node": None})
        return rows

    def pool_stats(self) -> dict:
        """The pools of every node summed, per tenant, and per node (``"nodes"``)."""
        per_node = self._nodes.gather("pool_stats") if self._nodes is not None else []
        tenants: dict[str, dict] = {}
        nodes = {}
        for node, st in per_node:
            nodes[node.id] = {"slots": node.slots, "live_workers": st["live_workers"],
                              "waiting": st["waiting"]}
            for t, row in st["tenants"].items():
                acc = tenants.setdefault(t, {"live_workers": 0, "waiting": 0, "calls": 0})
                for k in acc:
                    acc[k] += row[k]
        for p in list(self._nodes.placed.values()) if self._nodes is not None else []:
            if p.carried_calls:
                acc = tenants.setdefault(p.tenant, {"live_workers": 0, "waiting": 0, "calls": 0})
                acc["calls"] += p.carried_calls
        cap = self.max_workers_per_node
        return {"max_workers": None if cap is None else cap * len(nodes),
                "max_workers_per_node": cap,
                "max_workers_per_tenant": self.max_workers_per_tenant,
                "live_workers": sum(n["live_workers"] for n in nodes.values()),
                "waiting": sum(n["waiting"] for n in nodes.values()),
                "tenants": dict(sorted(tenants.items())), "nodes": nodes}

    def close(self) -> None:
        """Stop every worker and every agent (on every node); idempotent.  Disconnects
        from Ray (stopping the local cluster) when this supervisor started it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        _live.discard(self)
        if self._nodes is not None:
            self._nodes.close()
        if self._owns_ray:
            self._ray.shutdown()

    def interrupt(self, tenant: str, thread_id: int) -> bool:
        """As Supervisor.interrupt, on the node running the call that host thread
        ``thread_id`` waits for: that node's agent interrupts it (its local Supervisor's
        interrupt, which checks ``tenant``).  False when the thread waits for no call, the
        call still waits for its worker, or the node does not answer within INTERRUPT_S."""
        nodes = self._nodes
        if nodes is None or self._closed:
            return False
        for node in nodes.live():
            for call in list(node.calls.values()):
                if call.thread == thread_id and call.done is None:
                    return self._interrupt_on(node, tenant, call.cid)
        return False

    def _interrupt_on(self, node: Node, tenant: str, cid: int) -> bool:
        try:
            return bool(self._ray.get(node.agent.interrupt.remote(tenant, cid),
                                      timeout=INTERRUPT_S))
        except Exception as exc:                         # noqa: BLE001 (lost, or too slow)
            log.warning("Ray node %s did not interrupt call %d of tenant %r: %s", node.id, cid,
                        tenant, exc)
            return False


_atexit_registered = False


def _register_atexit() -> None:
    global _atexit_registered
    if not _atexit_registered:
        _atexit_registered = True
        atexit.register(_close_all)


def _close_all() -> None:
    for sup in list(_live):
        try:
            sup.close()
        except Exception:                                # noqa: BLE001
            pass
