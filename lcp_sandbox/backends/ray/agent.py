"""The agent of one node (the Ray backend): a long-lived actor running a local Supervisor.

    driver ── agent.hold_secrets(values, CAs) once it is ready, and again at a change
    driver ── agent.run(pickle of cid, spec fields, msg, tool, timeout_s, the binding's secrets)
           ─► NodeAgent.run (an actor thread): workspace on this node? else 500;
                                               Supervisor.run(spec, msg, Relay)
           ◄─ bytes: VALUE | SANDBOX_EVENT | RAISED, calls, starts, the value as Encoder bytes
    driver ◄── events(): (cid, NEED_INIT | REQUEST | FRAME | FRAME_ERROR, ...),
                         (0, EVENT, dict) ── relays
    driver ── agent.reply(cid, message) ─► the relay of that call   (see relay.py)
    driver ── agent.interrupt(tenant, cid) ─► Supervisor.interrupt(tenant, the call's thread)

One agent per node, pinned there (NodeAffinitySchedulingStrategy, soft=False),
``num_cpus=0``, threaded: calls run in the default group's threads (one each
while in flight); ``reply``, ``stats`` and the like in a group of their own, so
they are served even when every call thread waits for the driver; the events
stream has its own thread.  The local Supervisor does everything a call needs
on this node (zygote, workers, deadlines, memory, crashes, quarantine, pool):
the agent adds the relay and the check that the workspace exists here.

Trusted code: it decodes the worker's frames with the protocol's Decoder (as the
local host does) and sends the driver protocol bytes, never objects a worker made.
"""
from __future__ import annotations

import os
import pickle
import queue
import shutil
import tempfile
import threading
from typing import Optional

import ray

from ... import protocol as P
from ...core.normalize import TOOL_FAILED, failure
from ...core.outcomes import SandboxEvent
from ...core.secrets import host_secrets
from ...protocol import error_value
from ..base import WorkerSpec
from ..local.supervisor import Supervisor
from .relay import EVENT, RAISED, SANDBOX_EVENT, VALUE, Relay, pack_outcome

#: Threads for calls in flight on one node (a call waiting for the driver holds one).
CALL_THREADS = 64


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=CALL_THREADS,
            concurrency_groups={"control": 4, "events": 1})
class NodeAgent:
    def __init__(self, options: dict) -> None:
        self.node_id = ray.get_runtime_context().get_node_id()
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._relays: dict[int, Relay] = {}
        # Call id -> the thread of this actor running it (the local Supervisor's caller).
        self._callers: dict[int, int] = {}
        self._lock = threading.Lock()
        self._closed = False
        # hold_secrets()'s file of the servers' CAs
        self._folder: Optional[str] = None
        self.sup = Supervisor(max_workers=options.get("max_workers"),
                              max_workers_per_tenant=options.get("max_workers_per_tenant"),
                              idle_timeout_s=options.get("idle_timeout_s"),
                              confine=options.get("confine", False), on_event=self._on_event,
                              **{k: options[k] for k in ("tenants_root", "uid_range",
                                                         "envs_dir", "env_wait_s")
                                 if options.get(k) is not None})
        # The zygote, before the first call needs it.
        self.sup.start()

    def _emit(self, item: tuple) -> None:
        self._outbox.put(item)

    def _on_event(self, event: dict) -> None:
        self._emit((0, EVENT, {**event, "node": self.node_id}))

    # ------------------------------------------------------------ calls
    def run(self, call: bytes) -> bytes:
        """One call on this node's worker of (tenant, library, root); how it ended.

        ``call`` is the driver's pickle of (cid, tenant, library, limits, root, msg,
        tool, timeout_s, the binding's own secrets) (host-made); the answer is
        :func:`relay.pack_outcome`'s bytes (one bytes object each way: Ray moves them
        cheapest)."""
        # The driver (the host) made these bytes: this direction is trusted, as host -> worker.
        cid, tenant, library, limits, root, msg, tool, timeout_s, secrets = pickle.loads(call)
        relay = Relay(cid, self._emit)
        spec = WorkerSpec(tenant, library, limits, root, relay.init, secrets)
        cwd = msg.cwd
        if not os.path.isdir(cwd):
            return pack_outcome(SANDBOX_EVENT, failure(
                f"[{library.name}] tool '{tool}' not run: its workspace {cwd!r} does not exist "
                f"on node {self.node_id}, where its worker runs. Workspaces must live on storage "
                f"every node shares, at the same path; the call was not run anywhere else.",
                TOOL_FAILED), *self._counts(spec))
        with self._lock:
            self._relays[cid] = relay
            self._callers[cid] = threading.get_ident()
        try:
            tag, value = VALUE, self.sup.run(spec, msg, relay, tool=tool, timeout_s=timeout_s)
        except SandboxEvent as ev:
            tag, value = SANDBOX_EVENT, ev.result
        # A module function raised (ModCall), or a relay failure.
        except Exception as exc:
            tag, value = RAISED, error_value(exc)
        finally:
            with self._lock:
                self._relays.pop(cid, None)
                self._callers.pop(cid, None)
        try:
            return pack_outcome(tag, value, *self._counts(spec))
        except P.Unsendable as exc:
            return pack_outcome(SANDBOX_EVENT, failure(
                f"[{library.name}] tool '{tool}': its result could not be relayed from node "
                f"{self.node_id} ({exc}).", TOOL_FAILED), *self._counts(spec))

    def _counts(self, spec: WorkerSpec) -> tuple:
        """(calls served, workers started) of the slot: the driver carries them over if
        this node is lost."""
        slot = self.sup._slots.get(spec.key)      # noqa: SLF001 (the agent owns this supervisor)
        return (0, 0) if slot is None else (slot.calls, slot.starts)

    @ray.method(concurrency_group="control")
    def reply(self, cid: int, message: tuple) -> None:
        """The driver's answer to what the call ``cid`` asked (see ray_relay.py)."""
        relay = self._relays.get(cid)
        if relay is not None:
            relay.inbox.put(message)

    @ray.method(concurrency_group="events")
    def events(self):
        """The stream of what calls ask the driver, and lifecycle events; ends at close()."""
        while True:
            item = self._outbox.get()
            if item is None:
                return
            yield item

    # ------------------------------------------------------------ the rest of the Backend
    @ray.method(concurrency_group="control")
    def ready(self) -> str:
        return self.node_id

    @ray.method(concurrency_group="control")
    def hold_secrets(self, values: dict, upstream_cas: Optional[str]) -> None:
        """The host's secrets (RaySupervisor's ``secrets``, ``set_secret()``) for this node's
        egress proxy, and the CAs it checks the servers of their hosts against (PEM text,
        written to a file of this agent's own; None: the node's trust store)."""
        path = None
        if upstream_cas is not None:
            self._folder = self._folder or tempfile.mkdtemp(prefix="lcp-sandbox-agent-")
            path = os.path.join(self._folder, "upstream-cas.pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(upstream_cas)
        self.sup.egress.secrets.hold(host_secrets(values, "RaySupervisor secrets"), path)

    @ray.method(concurrency_group="control")
    def interrupt(self, tenant: str, cid: int) -> bool:
        """Interrupt the call ``cid`` (of ``tenant``) as the local Supervisor does: 499, the
        worker kept.  False when it is not running here, or still waits for its worker."""
        thread = self._callers.get(cid)
        return thread is not None and self.sup.interrupt(tenant, thread)

    @ray.method(concurrency_group="control")
    def stop(self, tenant: str, library_key: str) -> bool:
        return self.sup.stop(tenant, library_key)

    @ray.method(concurrency_group="control")
    def stats(self, tenant: Optional[str] = None) -> list:
        return self.sup.stats(tenant)

    @ray.method(concurrency_group="control")
    def pool_stats(self) -> dict:
        return self.sup.pool_stats()

    @ray.method(concurrency_group="control")
    def metrics(self) -> dict:
        return self.sup.metrics()

    @ray.method(concurrency_group="control")
    def remove_tenant(self, tenant: str, root: Optional[str]) -> Optional[int]:
        """The local Supervisor's remove_tenant: workers, disk, root, uid on this node."""
        return self.sup.remove_tenant(tenant, root)

    @ray.method(concurrency_group="control")
    def held_tenants(self) -> list:
        """The tenants that hold a uid of this node's (its tenants_root's) record."""
        return sorted(self.sup.uids.tenants())

    @ray.method(concurrency_group="control")
    def close(self) -> None:
        """Stop every worker and the zygote; end the events stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            relays = list(self._relays.values())
        # Calls waiting for the driver give up.
        for relay in relays:
            relay.inbox.put(("abort", "the sandbox supervisor was closed"))
        self.sup.close()
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
        self._outbox.put(None)
