"""The Ray cluster as the driver sees it (the Ray backend): nodes, their agents, placements.

    refresh()  live nodes (ray.nodes()) without an agent get one, pinned there
               (NodeAffinitySchedulingStrategy, soft=False); the host's secrets, if it
               holds any, reach it by a call of its own before it takes a call (never in
               its creation arguments, which the cluster's GCS keeps); each agent's events
               stream gets a dispatcher thread: call items to their call's queue,
               lifecycle events to on_event
    place()    a slot (tenant, library, root) goes to the live node that holds the
               tenant's other slots, else to the one with the fewest slots (those under
               max_workers_per_node first), and stays there: a tenant lives on one node
    remove_tenant()  the tenant's slots forgotten, its workers, uid, disk and root removed
               by the local Supervisor of the node(s) that held them (of every live node
               when none did: a tenant an earlier server left)
    lose()     a node's agent is gone: its slots are placed again at their next call,
               what they did there (calls, worker starts) carried over; the node is not
               used again unless no other is left
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...core.outcomes import Unavailable
from ..base import WorkerSpec
from .relay import EVENT

log = logging.getLogger("lcp_sandbox")

# New nodes are looked for at most this often (when a slot is placed)
_REFRESH_S = 10.0
# An agent not up by then: its node is not used.
_AGENT_START_S = 120.0
#: The deadline of the driver's other calls to agents (stats, stop, remove_tenant...): a
#: node that does not answer by then is left out, or named in the error.
CONTROL_S = 60.0


class Node:
    """One node and its agent."""

    def __init__(self, node_id: str, agent: Any) -> None:
        self.id = node_id
        self.agent = agent
        self.alive = True
        # Slots placed here.
        self.slots = 0
        # Call id -> the driver's end of a call in flight here.
        self.calls: dict = {}
        self.dispatcher: Optional[threading.Thread] = None


@dataclass
class Placed:
    """Where a slot lives, and what it did on nodes since lost."""
    tenant: str
    library: str
    root: str
    node: Optional[Node]
    # Last known, on its current node.
    calls: int = 0
    starts: int = 0
    # On nodes that were lost.
    carried_calls: int = 0
    carried_starts: int = 0
    # How its last node was lost.
    lost: Optional[str] = None


class Nodes:
    """The node table of one RaySupervisor (thread-safe).  ``options`` are the agents'
    Supervisor settings; ``max_per_node`` steers placement."""

    def __init__(self, ray: Any, options: dict, on_event: Callable[[dict], None],
                 secrets: Callable[[], Optional[tuple]] = lambda: None) -> None:
        self.ray = ray
        self.options = options
        # () -> None, or what an agent's hold_secrets() takes: (values, the CAs' PEM text)
        self.secrets = secrets
        self.max_per_node: Optional[int] = options.get("max_workers")
        self.on_event = on_event
        self.placed: dict[tuple, Placed] = {}
        self._nodes: dict[str, Node] = {}
        self._lost: set[str] = set()
        # Placements and the node table.
        self._lock = threading.Lock()
        # Finding nodes, starting agents.
        self._agents_lock = threading.Lock()
        self._refreshed = 0.0
        self.closed = False

    def live(self) -> list[Node]:
        with self._lock:
            return [n for n in self._nodes.values() if n.alive]

    def refresh(self, force: bool = False) -> None:
        """Start agents on live nodes that have none (at most every few seconds unless forced)."""
        ray = self.ray
        with self._agents_lock:
            if self.closed:
                raise Unavailable("The sandbox supervisor is closed.")
            now = time.monotonic()
            if not force and now - self._refreshed < _REFRESH_S:
                return
            self._refreshed = now
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            from .agent import NodeAgent
            live = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
            fresh = [nid for nid in live if nid not in self._nodes and nid not in self._lost]
            if not fresh and not self.live():
                # lost nodes, as a last resort
                fresh = [nid for nid in live if nid not in self._nodes]
            # @ray.remote made NodeAgent an actor class (mypy sees the class it decorates)
            actor_class: Any = NodeAgent
            started = [(nid, actor_class.options(
                            scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False))
                        .remote(self.options)) for nid in fresh]
            for nid, agent in started:
                try:
                    got = ray.get(agent.ready.remote(), timeout=_AGENT_START_S)
                    held = self.secrets()
                    if held is not None:
                        ray.get(agent.hold_secrets.remote(*held), timeout=CONTROL_S)
                except Exception as exc:       # noqa: BLE001 (the node went away meanwhile)
                    log.warning("no sandbox agent could start on Ray node %s: %s", nid, exc)
                    ray.kill(agent, no_restart=True)
                    self._lost.add(nid)
                    continue
                node = Node(got, agent)
                node.dispatcher = threading.Thread(target=self._dispatch, args=(node,), daemon=True,
                                                   name=f"lcp-sandbox-ray-{got[:8]}")
                with self._lock:
                    self._nodes[got] = node
                    self._lost.discard(got)
                node.dispatcher.start()

    def hold_secrets(self) -> None:
        """Every live agent holds the host's secrets as they are now (after a change); under
        the lock that starts agents, so none starts with the values of before.  A node whose
        agent did not take them is lost (its slots go to a node that did): none of its
        workers would start with the values of before."""
        held = self.secrets()
        with self._agents_lock:
            took = {id(node) for node, _ in self.gather("hold_secrets", *(held or ({}, None)))}
            for node in self.live():
                if id(node) not in took:
                    self.lose(node, "its agent did not take the host's changed secrets")

    def _dispatch(self, node: Node) -> None:
        """What the node's agent streams: to each call's queue, lifecycle events to on_event."""
        ray = self.ray
        try:
            for ref in node.agent.events.options(num_returns="streaming").remote():
                item = ray.get(ref)
                if item[1] == EVENT:
                    self.on_event(item[2])
                    continue
                call = node.calls.get(item[0])
                if call is not None:
                    call.q.put(item)
        except Exception as exc:                         # noqa: BLE001 (the agent is gone)
            if not self.closed:
                log.warning("the sandbox agent of Ray node %s stopped streaming: %s", node.id, exc)

    def place(self, spec: WorkerSpec, tool: str) -> tuple[Node, Placed]:
        """The node of ``spec``'s slot, placing it now if it has none (or lost it)."""
        with self._lock:
            placed = self.placed.get(spec.key)
            if placed is not None and placed.node is not None and placed.node.alive:
                return placed.node, placed
        self.refresh(force=not self.live())
        with self._lock:
            placed = self.placed.get(spec.key)
            if placed is not None and placed.node is not None and placed.node.alive:
                return placed.node, placed
            live = [n for n in self._nodes.values() if n.alive]
            if not live:
                raise Unavailable.not_run(spec.library.name, tool,
                                          "no live Ray node has a sandbox agent.")
            cap = self.max_per_node
            # The tenant's node first: its disk is mounted there, its uid given there.
            home = {id(p.node) for p in self.placed.values()
                    if p.tenant == spec.tenant and p.node is not None and p.node.alive}
            node = min(live, key=lambda n: (id(n) not in home, cap is not None and n.slots >= cap,
                                            n.slots))
            if placed is None:
                placed = Placed(spec.tenant, spec.library.name, spec.root, node)
                self.placed[spec.key] = placed
            placed.node = node
            node.slots += 1
            return node, placed

    def lose(self, node: Node, why: str) -> None:
        """``node``'s agent is gone: its slots are placed again at their next call."""
        with self._lock:
            if not node.alive:
                return
            node.alive = False
            self._lost.add(node.id)
            self._nodes.pop(node.id, None)
            for placed in self.placed.values():
                if placed.node is node:
                    placed.node = None
                    placed.carried_calls += placed.calls
                    placed.carried_starts += placed.starts
                    placed.calls = placed.starts = 0
                    placed.lost = why
        log.error("Ray node %s (its sandbox agent) was lost: %s", node.id, why)
        try:
            self.ray.kill(node.agent, no_restart=True)
        except Exception:                                # noqa: BLE001
            pass

    def gather(self, method: str, *args: Any) -> list:
        """(node, answer) of every live agent; a node that does not answer is left out."""
        refs = [(n, getattr(n.agent, method).remote(*args)) for n in self.live()]
        out = []
        deadline = time.monotonic() + CONTROL_S
        for node, ref in refs:
            try:
                out.append((node, self.ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))))
            except Exception as exc:                     # noqa: BLE001
                log.warning("Ray node %s did not answer %s: %s", node.id, method, exc)
        return out

    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant, on whichever node; forget the
        slot(s)."""
        with self._lock:
            keys = [k for k in self.placed if k[0] == tenant and k[1] == library_key]
            nodes = {}
            for k in keys:
                placed = self.placed.pop(k)
                if placed.node is not None:
                    placed.node.slots -= 1
                    if placed.node.alive:
                        nodes[placed.node.id] = placed.node
        for node in nodes.values():
            try:
                self.ray.get(node.agent.stop.remote(tenant, library_key), timeout=CONTROL_S)
            except Exception as exc:                     # noqa: BLE001
                log.warning("Ray node %s did not stop %s: %s", node.id, library_key, exc)
        return bool(keys)

    def remove_tenant(self, tenant: str, root: Optional[str]) -> Optional[int]:
        """Forget ``tenant``'s slots; its node's Supervisor.remove_tenant(tenant, root) (every
        live node's, one after another, when none holds a slot of it).  The uid given back, or
        None; the first OSError or ValueError a node raised, once every node was asked."""
        with self._lock:
            holders: dict[str, Node] = {}
            for key in [k for k in self.placed if k[0] == tenant]:
                placed = self.placed.pop(key)
                if placed.node is not None:
                    placed.node.slots -= 1
                    if placed.node.alive:
                        holders[placed.node.id] = placed.node
        if not holders and not self.live():
            self.refresh(force=True)
        uid, failed = None, None
        for node in list(holders.values()) or self.live():
            try:
                uid = self._remove_on(node, tenant, root) or uid
            except (OSError, ValueError) as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return uid

    def _remove_on(self, node: Node, tenant: str, root: Optional[str]) -> Optional[int]:
        ray = self.ray
        try:
            return ray.get(node.agent.remove_tenant.remote(tenant, root), timeout=CONTROL_S)
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None)
            if isinstance(cause, (OSError, ValueError)):
                raise cause from None
            raise OSError(f"tenant {tenant!r}: Ray node {node.id} failed to remove it "
                          f"({type(exc).__name__})") from None
        except Exception as exc:                         # noqa: BLE001 (lost, or too slow)
            why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
            if isinstance(exc, ray.exceptions.RayActorError):
                self.lose(node, why)
            raise OSError(f"tenant {tenant!r}: Ray node {node.id} did not confirm its removal "
                          f"within {CONTROL_S:g} s ({why}); what it held there may remain"
                          ) from None

    def close(self) -> None:
        """Close every agent (its workers and zygote), deliver its last events, end it, and
        return once Ray says it is dead."""
        ray = self.ray
        with self._agents_lock:
            self.closed = True
        nodes = self.live()
        for ref in [n.agent.close.remote() for n in nodes]:
            try:
                ray.get(ref, timeout=60)
            except Exception:                            # noqa: BLE001
                pass
        for node in nodes:
            if node.dispatcher is not None:
                # The stream ends after the agent's last events.
                node.dispatcher.join(10)
            ray.kill(node.agent, no_restart=True)
        for node in nodes:
            for _ in range(10):
                try:
                    ray.get(node.agent.ready.remote(), timeout=10)
                except ray.exceptions.RayActorError:
                    break
                except Exception:                        # noqa: BLE001
                    continue
