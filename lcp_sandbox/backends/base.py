"""The seam between a binding and whatever runs its libraries.

    SandboxedBinding ── run(spec, msg, objects, tool=, timeout_s=) ──► Backend
                     ◄─ the RESULT's value, or SandboxEvent(result) ──┘
                     ── stop / stats / pool_stats / start / close ───►

A binding knows nothing else of its backend: :class:`Backend` is the whole
interface.  The local supervisor (backends/local/supervisor.py) is one implementation; a
backend that places the same engine on other machines (Ray) is another.

What crosses the seam is plain data, so a remote backend can ship it: the
:class:`WorkerSpec` (which worker, with which limits) and the message (a
protocol.Call, Prompt, ModCall or Load).  Two things stay in the host:

* ``objects`` (:class:`Lent`; the binding's HostObjects, binding/objects.py):
  what the call lends the tool (handlers, a client, a discussion).  The backend
  relays the worker's REQUESTs to it and sends its REPLYs back; the objects
  themselves never travel.
* ``spec.init``: called in the host, only when a new worker must start, it
  returns the protocol.Init to start it with (plain data again).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol, TypeVar, Union, runtime_checkable

from .. import protocol as P
from ..core.discovery import Library
from ..core.limits import Limits

_B = TypeVar("_B", bound="Closing")


class Lent(Protocol):
    """What a call lends its tool, as a backend sees it: the worker's REQUESTs are
    handed to ``handle`` on the thread waiting for the call, with ``conn`` (the
    call's connection, for a callback into the tool) and ``deadline`` set while
    it runs; ``release`` drops everything lent when the call ends."""
    # A protocol Connection, or the Ray driver's RemoteConn.
    conn: Any
    deadline: Optional[float]

    def handle(self, req: P.Request, saw_ref: bool) -> tuple[bool, Any]:
        """The REPLY to one REQUEST of the worker."""

    def release(self) -> None:
        """The call ended: nothing lent is reachable any more."""


@dataclass(frozen=True)
class WorkerSpec:
    """The worker a message is for: workers are keyed by (tenant, library,
    confinement root) and ``key`` is that tuple."""
    tenant: str
    library: Library
    limits: Limits
    # Confinement root ("" when not confined)
    root: str
    init: Callable[[], P.Init] = field(compare=False, repr=False)
    # The binding's own secrets (core/secrets.py), by name, over the backend's: values
    # that stay in the host (its egress proxy puts them in requests)
    secrets: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)
    key: tuple = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.tenant, self.library.key, self.root))


@runtime_checkable
class Backend(Protocol):
    """What a binding needs from whatever runs its libraries.

    ``run`` sends ``msg`` to the worker of ``spec`` (starting one with
    ``spec.init()`` if needed), serves its requests against ``objects`` until
    it answers, and returns the answer's value; a call that the sandbox ended
    (death, timeout, memory, quarantine, no room, closed...) raises
    ``SandboxEvent`` carrying the LCP result to return.  Waiting for the
    worker counts against ``timeout_s`` (default: ``spec.limits.timeout_s``)."""

    # The confinement of bindings that do not choose ("best-effort")
    confine: Union[bool, str]
    #: The network of bindings that do not choose: True, False or a policy (core/egress_rules.py)
    network: Union[bool, dict[str, Any]] = True

    @property
    def secret_names(self) -> frozenset[str]:
        """The names of the secrets it holds (core/secrets.py; values never leave it)."""

    def start(self) -> None:
        """Get ready now rather than at the first call."""

    def run(self, spec: WorkerSpec, msg: tuple, objects: Lent, *, tool: str,
            timeout_s: Optional[float] = None) -> Any:
        """Run one message on the worker of ``spec``; its value, or SandboxEvent."""

    def interrupt(self, tenant: str, thread_id: int) -> bool:
        """Interrupt ``tenant``'s call that host thread ``thread_id`` waits for, as
        its soft timeout would; whether a call was signalled."""

    def stop(self, tenant: str, library_key: str) -> bool:
        """Stop the worker(s) of one library of one tenant; whether there were any."""

    def stats(self, tenant: Optional[str] = None) -> list[dict]:
        """One dict per worker (``tenant``'s only when given)."""

    def pool_stats(self) -> dict:
        """The workers as a whole and per tenant."""

    def close(self) -> None:
        """Stop every worker; idempotent."""


def emit(on_event: Optional[Callable[[dict], None]], event: dict) -> None:
    """A lifecycle event: logged on ``lcp_sandbox.events`` and given to ``on_event``
    (whose failure is logged, never raised into the engine)."""
    logging.getLogger("lcp_sandbox.events").info("%s", event)
    if on_event is not None:
        try:
            on_event(event)
        except Exception:
            logging.getLogger("lcp_sandbox").exception("on_event callback failed")


class Closing:
    """``with backend: ...`` closes it at the end."""

    def close(self) -> None:
        # The backend's own.
        raise NotImplementedError

    def __enter__(self: _B) -> _B:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
