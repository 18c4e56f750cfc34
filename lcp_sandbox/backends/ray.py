"""The Ray backend: the same engine on every node of a Ray cluster.

    SandboxedBinding ── run(spec, msg, objects) ──► RaySupervisor (the driver, the caller's thread)
        slot (tenant, library, root) placed once: the live node with the fewest slots
        (under max_workers_per_node first); it stays there while that node lives
        agent.run.remote(...) ──────────────────────────► NodeAgent on that node (backends/ray_agent.py)
        loop on the call's queue:                             local Supervisor.run(spec, msg, Relay)
           NEED_INIT  ─► spec.init() here ─► agent.reply        zygote, worker, deadlines, memory, crashes
           REQUEST    ─► HostObjects.handle() here ─► reply     (REQUESTs relayed, ray_relay.py)
           done       ─► the value (decoded here) | SandboxEvent | the exception
        node lost (its agent died) ─► 503; the slot is placed again at its next call

    one dispatcher thread per node: agent.events() (a streaming call) ─► each call's queue,
    lifecycle events ─► on_event (with "node")

Ray places, starts and watches the agents; each agent's local Supervisor gives
the guarantees Ray's own workers do not (per-call workspace, soft interrupt,
per-worker memory limit, crash policy).  Nothing here imports ray until the
supervisor is used (the ``ray`` extra).
"""
from __future__ import annotations

import atexit
import itertools
import logging
import pickle
import queue
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

from .. import protocol as P
from ..core.normalize import UNAVAILABLE, failure
from ..host.objects import HostObjects
from ..host.outcomes import CallFailed, SandboxEvent, Unavailable
from .base import WorkerSpec
from .ray_relay import (ABORT, ANSWER, EVENT, INIT, NEED_INIT, RAISED, REQUEST, SANDBOX_EVENT, VALUE, RemoteConn,
                        unpack_outcome)

log = logging.getLogger("lcp_sandbox")
events_log = logging.getLogger("lcp_sandbox.events")

_DONE = "done"
_live: "weakref.WeakSet[RaySupervisor]" = weakref.WeakSet()
_NODE_REFRESH_S = 10.0          # new nodes are looked for at most this often (when placing a slot)
_AGENT_START_S = 120.0          # an agent that is not up by then: its node is not used


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError("RaySupervisor needs ray: pip install 'lcp-sandbox[ray]'") from exc
    return ray


def _when_done(ref: Any, callback: Callable[[Any], None]) -> None:
    """``callback(value or exception)`` once ``ref`` is ready.  Ray's ObjectRef._on_completed
    (what Ray Serve uses) wakes the waiting thread once, as ray.get does; ``future()``
    is the public way, a little slower."""
    on_completed = getattr(ref, "_on_completed", None)
    if on_completed is not None:
        on_completed(callback)
        return

    def done(f: Any) -> None:
        exc = f.exception()
        callback(exc if exc is not None else f.result())
    ref.future().add_done_callback(done)


class _Node:
    """One node and its agent, as the driver knows them."""

    def __init__(self, node_id: str, agent: Any) -> None:
        self.id = node_id
        self.agent = agent
        self.alive = True
        self.slots = 0                   # slots placed here by this supervisor
        self.calls: dict[int, _Call] = {}
        self.dispatcher: Optional[threading.Thread] = None


@dataclass
class _Placed:
    """Where a slot lives, and what it did on nodes since lost."""
    tenant: str
    library: str
    root: str
    node: Optional[_Node]
    calls: int = 0                       # last known on its current node
    starts: int = 0
    carried_calls: int = 0               # on nodes that were lost
    carried_starts: int = 0
    lost: Optional[str] = None           # how its last node was lost


class _Call:
    """The driver's end of one call in flight: what the node sends about it lands in ``q``."""
    __slots__ = ("cid", "node", "q", "done")

    def __init__(self, cid: int, node: _Node) -> None:
        self.cid, self.node = cid, node
        self.q: queue.SimpleQueue = queue.SimpleQueue()
        self.done: Optional[tuple] = None

    def finished(self, result: Any) -> None:
        """The agent's answer (bytes), or the exception Ray raised for it."""
        self.q.put((_DONE, result))

    def reply(self, message: tuple) -> None:
        self.node.agent.reply.remote(self.cid, message)

    def wait(self, timeout: Optional[float]) -> Optional[tuple]:
        if self.done is not None:
            return self.done
        try:
            item = self.q.get(timeout=timeout)
        except queue.Empty:
            return None
        if item[0] == _DONE:
            self.done = item
        return item


class RaySupervisor:
    """A Backend that runs each (tenant, library) on one node of a Ray cluster.

    ``address``: None joins the cluster Ray finds (``RAY_ADDRESS``, or one started
    with ``ray start`` on this machine) or starts a local one; a string goes to
    ``ray.init`` as it is; if Ray is already initialized in this process, that is
    used.  ``max_workers_per_node`` and ``max_workers_per_tenant`` are each node's
    pool limits; ``idle_timeout_s``, ``confine`` and ``on_event`` as for
    ``Supervisor`` (events carry ``"node"`` and arrive from a background thread)."""

    def __init__(self, address: Optional[str] = None, max_workers_per_node: Optional[int] = None,
                 max_workers_per_tenant: Optional[int] = None, idle_timeout_s: Optional[float] = None,
                 confine: bool = False, on_event: Optional[Callable[[dict], None]] = None) -> None:
        self.address = address
        self.max_workers_per_node = max_workers_per_node
        self.max_workers_per_tenant = max_workers_per_tenant
        self.idle_timeout_s = idle_timeout_s
        self.confine = confine
        self.on_event = on_event
        self._ray: Any = None
        self._owns_ray = False
        self._nodes: dict[str, _Node] = {}
        self._lost_nodes: set[str] = set()
        self._placed: dict[tuple, _Placed] = {}
        self._lock = threading.Lock()           # placements and the node table
        self._nodes_lock = threading.Lock()     # connecting, finding nodes, starting agents
        self._refreshed = 0.0
        self._ids = itertools.count(1)
        self._closed = False

    # ------------------------------------------------------------ nodes and agents
    def start(self) -> None:
        """Connect to Ray and start an agent on every live node now (else the first call does)."""
        self._refresh(force=True)

    def _connect(self) -> Any:
        if self._ray is None:
            ray = _import_ray()
            if not ray.is_initialized():
                ray.init(address=self.address)
                self._owns_ray = True
            self._ray = ray
            _live.add(self)
            _register_atexit()                # after ray.init's own hook: runs before it
        return self._ray

    def _refresh(self, force: bool = False) -> None:
        """Start agents on live nodes that have none (at most every few seconds unless forced)."""
        with self._nodes_lock:
            if self._closed:
                raise Unavailable("The sandbox supervisor is closed.")
            ray = self._connect()
            now = time.monotonic()
            if not force and now - self._refreshed < _NODE_REFRESH_S:
                return
            self._refreshed = now
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
            from .ray_agent import NodeAgent
            live = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
            fresh = [nid for nid in live if nid not in self._nodes and nid not in self._lost_nodes]
            if not fresh and not any(n.alive for n in self._nodes.values()):
                fresh = [nid for nid in live if nid not in self._nodes]      # lost nodes, as a last resort
            options = {"max_workers": self.max_workers_per_node, "max_workers_per_tenant": self.max_workers_per_tenant,
                       "idle_timeout_s": self.idle_timeout_s, "confine": self.confine}
            started = [(nid, NodeAgent.options(scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
                        .remote(options)) for nid in fresh]
            for nid, agent in started:
                try:
                    got = ray.get(agent.ready.remote(), timeout=_AGENT_START_S)
                except Exception as exc:                 # noqa: BLE001 (the node went away meanwhile)
                    log.warning("no sandbox agent could start on Ray node %s: %s", nid, exc)
                    ray.kill(agent, no_restart=True)
                    self._lost_nodes.add(nid)
                    continue
                node = _Node(got, agent)
                node.dispatcher = threading.Thread(target=self._dispatch, args=(node,), daemon=True,
                                                   name=f"lcp-sandbox-ray-{got[:8]}")
                with self._lock:
                    self._nodes[got] = node
                    self._lost_nodes.discard(got)
                node.dispatcher.start()

    def _dispatch(self, node: _Node) -> None:
        """What the node's agent streams: to each call's queue, lifecycle events to on_event."""
        ray = self._ray
        try:
            for ref in node.agent.events.options(num_returns="streaming").remote():
                item = ray.get(ref)
                if item[1] == EVENT:
                    self._event(item[2])
                    continue
                call = node.calls.get(item[0])
                if call is not None:
                    call.q.put(item)
        except Exception as exc:                         # noqa: BLE001 (the agent is gone)
            if not self._closed:
                log.warning("the sandbox agent of Ray node %s stopped streaming: %s", node.id, exc)

    def _event(self, event: dict) -> None:
        events_log.info("%s", event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed")

    def _place(self, spec: WorkerSpec, tool: str) -> tuple[_Node, _Placed]:
        with self._lock:
            placed = self._placed.get(spec.key)
            if placed is not None and placed.node is not None and placed.node.alive:
                return placed.node, placed
        self._refresh(force=not any(n.alive for n in list(self._nodes.values())))
        with self._lock:
            placed = self._placed.get(spec.key)
            if placed is not None and placed.node is not None and placed.node.alive:
                return placed.node, placed
            live = [n for n in self._nodes.values() if n.alive]
            if not live:
                raise Unavailable.not_run(spec.library.name, tool, "no live Ray node has a sandbox agent.")
            cap = self.max_workers_per_node
            node = min(live, key=lambda n: (cap is not None and n.slots >= cap, n.slots))
            if placed is None:
                placed = self._placed[spec.key] = _Placed(spec.tenant, spec.library.name, spec.root, node)
            placed.node = node
            node.slots += 1
            return node, placed

    def _lose(self, node: _Node, why: str) -> None:
        """``node``'s agent is gone: its slots are placed again at their next call."""
        with self._lock:
            if not node.alive:
                return
            node.alive = False
            self._lost_nodes.add(node.id)
            self._nodes.pop(node.id, None)
            for placed in self._placed.values():
                if placed.node is node:
                    placed.node = None
                    placed.carried_calls += placed.calls
                    placed.carried_starts += placed.starts
                    placed.calls = placed.starts = 0
                    placed.lost = why
        log.error("Ray node %s (its sandbox agent) was lost: %s", node.id, why)
        try:
            self._ray.kill(node.agent, no_restart=True)
        except Exception:                                # noqa: BLE001
            pass

    # ------------------------------------------------------------ calling
    def run(self, spec: WorkerSpec, msg: tuple, objects: HostObjects, *, tool: str,
            timeout_s: Optional[float] = None) -> Any:
        """As Supervisor.run, on the node the slot of ``spec`` lives on."""
        name = spec.library.name
        if self._closed:
            raise Unavailable.not_run(name, tool, "the sandbox supervisor is closed.")
        node, placed = self._place(spec, tool)
        call = _Call(next(self._ids), node)
        node.calls[call.cid] = call
        try:
            ref = node.agent.run.remote(pickle.dumps((call.cid, spec.tenant, spec.library, spec.limits, spec.root,
                                                      msg, tool, timeout_s), protocol=5))
            _when_done(ref, call.finished)
            conn = RemoteConn(call)
            while True:
                item = call.wait(None)
                if item[0] == _DONE:
                    return self._outcome(item[1], node, placed, name, tool)
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
            objects.release()

    def _request(self, call: _Call, conn: RemoteConn, objects: HostObjects, item: tuple) -> None:
        """One REQUEST of the worker, served here: decoded with this host's Decoder."""
        _, _, frame, remaining = item
        objects.conn = conn
        objects.deadline = None if remaining is None else time.monotonic() + remaining
        try:
            size, kind = P.HEADER.unpack_from(frame)
            if kind != P.REQUEST or size != len(frame) - P.HEADER.size:
                raise P.ProtocolViolation("a relayed frame that is not one REQUEST")
            req = P.parse_from_worker(kind, memoryview(frame)[P.HEADER.size:], conn.decoder)
        except P.ProtocolViolation as exc:
            conn.broken = conn.broken or str(exc)
            answer: tuple = (False, ["RuntimeError", ["protocol violation"]])
        else:
            answer = objects.handle(req, conn.decoder.saw_ref)
        try:
            call.reply((ANSWER, answer, conn.broken, conn.take_sends()))
        except Exception as exc:                         # noqa: BLE001 (the answer cannot cross)
            call.reply((ANSWER, (False, ["TypeError", [f"the host's answer cannot be sent: {exc}"]]),
                        conn.broken, []))

    def _outcome(self, result: Any, node: _Node, placed: _Placed, name: str, tool: str) -> Any:
        ray = self._ray
        try:
            if isinstance(result, BaseException):
                raise result
            tag, payload, calls, starts = unpack_outcome(result)
        except (ray.exceptions.RayActorError, ray.exceptions.NodeDiedError, ray.exceptions.WorkerCrashedError,
                ray.exceptions.LocalRayletDiedError) as exc:
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            if self._closed:
                raise Unavailable(f"[{name}] tool '{tool}' was stopped: the sandbox supervisor was closed "
                                  f"while it ran.") from None
            self._lose(node, why)
            raise SandboxEvent(failure(
                f"[{name}] tool '{tool}' did not complete: Ray node {node.id}, where its worker ran, was lost "
                f"({why}). The host is unaffected; the next call starts a fresh worker on a live node (module "
                f"state was lost).", UNAVAILABLE)) from None
        except Exception as exc:                         # noqa: BLE001
            raise CallFailed(f"[{name}] tool '{tool}': Ray failed to run the call ({type(exc).__name__}: "
                             f"{exc})"[:1000]) from None
        placed.calls, placed.starts = calls, starts
        if tag == VALUE:
            return payload
        if tag == SANDBOX_EVENT and type(payload) is dict and type(payload.get("error")) is str:
            raise SandboxEvent(payload)
        if tag == RAISED and P.is_error(payload):
            raise P.rebuild_error(*payload)
        raise CallFailed(f"[{name}] tool '{tool}': the node's agent answered something unexpected.")

    # ------------------------------------------------------------ the rest of the Backend
    def _live_nodes(self) -> list[_Node]:
        with self._lock:
            return [n for n in self._nodes.values() if n.alive]

    def _gather(self, method: str, *args: Any) -> list:
        """(node, answer) of every live agent; a node that does not answer is left out."""
        if self._ray is None:
            return []
        refs = [(n, getattr(n.agent, method).remote(*args)) for n in self._live_nodes()]
        out = []
        for node, ref in refs:
            try:
                out.append((node, self._ray.get(ref, timeout=60)))
            except Exception as exc:                     # noqa: BLE001
                log.warning("Ray node %s did not answer %s: %s", node.id, method, exc)
        return out

    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant, on whichever node, and forget the slot(s)."""
        with self._lock:
            keys = [k for k in self._placed if k[0] == tenant and k[1] == library_key]
            nodes = {}
            for k in keys:
                placed = self._placed.pop(k)
                if placed.node is not None:
                    placed.node.slots -= 1
                    if placed.node.alive:
                        nodes[placed.node.id] = placed.node
        for node in nodes.values():
            try:
                self._ray.get(node.agent.stop.remote(tenant, library_key), timeout=60)
            except Exception as exc:                     # noqa: BLE001
                log.warning("Ray node %s did not stop %s: %s", node.id, library_key, exc)
        return bool(keys)

    def stats(self, tenant: Optional[str] = None) -> list[dict]:
        """Supervisor.stats() of every node, each row with ``"node"`` (the Ray node id);
        ``calls`` and ``restarts`` count the slot's workers on nodes since lost, and a slot
        whose node was lost shows as stopped until its next call."""
        with self._lock:
            placed = list(self._placed.values())
        rows = []
        for node, node_rows in self._gather("stats", tenant):
            mine = {(p.tenant, p.library, p.root): p for p in placed if p.node is node}
            for row in node_rows:
                p = mine.get((row["tenant"], row["library"], row["workspace_root"] or ""))
                if p is not None:
                    row["calls"] += p.carried_calls
                    row["restarts"] += p.carried_starts
                rows.append({**row, "node": node.id})
        for p in placed:
            if p.node is None and p.lost and (tenant is None or p.tenant == tenant):
                rows.append({"library": p.library, "tenant": p.tenant, "pid": None, "state": "stopped",
                             "calls": p.carried_calls, "restarts": max(0, p.carried_starts - 1),
                             "last_exit": f"its node was lost ({p.lost})", "rss": 0, "peak_rss": 0,
                             "protections": {}, "workspace_root": p.root or None, "node": None})
        return rows

    def pool_stats(self) -> dict:
        """The pools of every node summed, per tenant, and per node (``"nodes"``)."""
        per_node = self._gather("pool_stats")
        tenants: dict[str, dict] = {}
        nodes = {}
        for node, st in per_node:
            nodes[node.id] = {"slots": node.slots, "live_workers": st["live_workers"], "waiting": st["waiting"]}
            for t, row in st["tenants"].items():
                acc = tenants.setdefault(t, {"live_workers": 0, "waiting": 0, "calls": 0})
                for k in acc:
                    acc[k] += row[k]
        with self._lock:
            for p in self._placed.values():
                if p.carried_calls:
                    tenants.setdefault(p.tenant, {"live_workers": 0, "waiting": 0, "calls": 0})["calls"] += p.carried_calls
        cap = self.max_workers_per_node
        return {"max_workers": None if cap is None else cap * len(nodes), "max_workers_per_node": cap,
                "max_workers_per_tenant": self.max_workers_per_tenant,
                "live_workers": sum(n["live_workers"] for n in nodes.values()),
                "waiting": sum(n["waiting"] for n in nodes.values()),
                "tenants": dict(sorted(tenants.items())), "nodes": nodes}

    def close(self) -> None:
        """Stop every worker and every agent (on every node); idempotent.  Disconnects
        from Ray (stopping the local cluster) when this supervisor started it."""
        with self._nodes_lock:
            if self._closed:
                return
            self._closed = True
        _live.discard(self)
        ray = self._ray
        if ray is None:
            return
        with self._lock:
            nodes = list(self._nodes.values())
        refs = [(n, n.agent.close.remote()) for n in nodes]
        for node, ref in refs:
            try:
                ray.get(ref, timeout=60)
            except Exception:                            # noqa: BLE001
                pass
        for node in nodes:
            if node.dispatcher is not None:
                node.dispatcher.join(10)               # the stream ends after the agent's last events
            ray.kill(node.agent, no_restart=True)
        for node in nodes:                              # gone before close() returns
            for _ in range(10):
                try:
                    ray.get(node.agent.ready.remote(), timeout=10)
                except ray.exceptions.RayActorError:
                    break
                except Exception:                        # noqa: BLE001
                    continue
        if self._owns_ray:
            ray.shutdown()

    def __enter__(self) -> "RaySupervisor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
