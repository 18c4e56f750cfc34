"""The worker: one process serving one tool library, one call at a time.

    serve(sock) ── [PRIME: environment, sys.path, while nobody waits]
                ── INIT ──► prepare(): environment, confinement, limits
                 ◄── READY (what is in force)
        loop:  CALL ──► enter the workspace ─► lazy load file (import, hooks,
                        init_tools_library) ─► filter params, inject host
                        objects ─► tool(**kwargs) ─► normalize ─► RESULT
               PROMPT / MODCALL / LOAD ─► the same, for a prompt provider,
                        a module function, or the import alone ─► RESULT
               after a CALL's RESULT: poll for the next message for the CALL's
                        spin_us (the host's budget), then sleep in a blocking read
               SHUTDOWN / EOF ─► exit

Everything a tool does to the host (confirm, ask the user, use a host
object) goes through proxies over the same connection while the call is in
flight (see worker/proxies.py).  The soft timeout arrives as SIGUSR1 and is turned
into ``ToolTimeout`` inside the tool's Python code.  What the worker sends is
encoded into the protocol's plain types (protocol.Encoder): an object it
cannot carry reaches the host as a plain equivalent or its repr.
"""
from __future__ import annotations

import atexit
import enum
import importlib.util
import os
import signal
import socket
import sys
import time
import traceback
import types
from typing import Any, Callable, Optional, cast

from .. import protocol as P
from ..core import normalize
from ..core.policy import refused
from ..protocol import LOAD_FAILED, OK, OUT_OF_MEMORY, RAISED, TIMED_OUT, error_value

if sys.platform.startswith("linux"):
    from .confine import prepare, set_environment
# A spawned worker on macOS or Windows (worker/spawned.py): no Linux mechanism.
else:
    from .portable_prepare import prepare, set_environment
from .environment import enter
from .library_code import run_file
from .proxies import Channel, Proxy
from .signature import accepts, positional

PERSISTENT_PREFIX = "lollms_client.tools_bindings.lcp.persistent_"
# Module names the library's template imported before forking us.
PRELOADED: set[str] = set()
HOST_PARAMS = P.HOST_PARAMS
#: What a call method answers: RESULT's fields (value, outcome, detail).
Answer = tuple[Any, int, str]


class ToolTimeout(BaseException):
    """Raised inside a tool when its call ran past the timeout (soft stage)."""


class LoadFailed(Exception):
    pass


class _Entry:
    """A resolved tool: its function and what its signature accepts (computed once)."""
    __slots__ = ("fn", "names", "var_kw", "injectable")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.names, self.var_kw = accepts(fn)
        self.injectable = HOST_PARAMS if self.var_kw else HOST_PARAMS & self.names


def describe(value: Any) -> Any:
    """A plain stand-in for an object the protocol cannot carry.

    Arrays and numpy scalars become lists / numbers, dataclasses dicts, enums
    their value; anything else its repr (and a line on the worker's log)."""
    if type(value) is Proxy:
        return "<host object>"
    try:
        if hasattr(value, "tolist") and callable(value.tolist):
            return value.tolist()
        # A dataclass instance exists only once dataclasses is imported (a spawned worker
        # starts without it).
        dataclasses = sys.modules.get("dataclasses")
        if (dataclasses is not None and dataclasses.is_dataclass(value)
                and not isinstance(value, type)):
            return dataclasses.asdict(value)
        if isinstance(value, enum.Enum):
            return value.value
        text = repr(value)
    except Exception as exc:
        text = f"<{type(value).__name__} object (repr failed: {exc})>"
    print(f"lcp_sandbox: a {type(value).__module__}.{type(value).__qualname__} object cannot be "
          f"sent to the host; it was sent as its repr", file=sys.stderr)
    return text


# A module's handler hooks: (its setter, the config key, the module global it may
# read instead, the handler bit).
_HOOKS = (("set_confirm_handler", "confirm_handler", "_CONFIRM_HANDLER", P.HANDLER_CONFIRM),
          ("set_user_interaction_handler", "user_interaction_handler", None, P.HANDLER_UI))


class Worker:
    def __init__(self, conn: Optional[P.Connection], init: P.Init) -> None:
        # None: a worker that only runs calls (benchmarks)
        self.conn = conn
        self.ch = Channel(conn, describe)
        # Results: callables are described, not lent.
        self.encoder = P.Encoder(describe)
        self.library = init.library
        self.files: list[str] = init.files
        self.source = init.source
        self.code = init.code
        self.configs: dict = init.configs or {}
        self.max_result = int(init.limits.get("max_result_mb", 64) * 1024 * 1024)
        self.modules: list[Optional[types.ModuleType]] = [None] * max(1, len(self.files))
        self.entries: dict[str, _Entry] = {}
        self.handlers = init.handlers
        self.in_tool = False
        # Entered before the first import.
        self.environment = init.environment
        self.entered = False
        if init.sys_path:
            sys.path[:] = init.sys_path
        self.relays = {P.HANDLER_CONFIRM: Proxy(self.ch, P.REF_CONFIRM, None),
                       P.HANDLER_UI: Proxy(self.ch, P.REF_UI, None)}

    # ------------------------------------------------------------ loading
    def _stem(self, index: int) -> str:
        if not self.files:
            return self.library
        return os.path.splitext(os.path.basename(self.files[index]))[0]

    def _relay(self, bit: int) -> Optional[Proxy]:
        return self.relays[bit] if self.handlers & bit else None

    def _config(self, stem: str) -> dict:
        """host_tool_configs[stem] with host callables as relays and handlers injected."""
        cfg = dict(self.ch.wrap(self.configs.get(stem) or {}))
        for key, bit in (("confirm_handler", P.HANDLER_CONFIRM),
                         ("user_interaction_handler", P.HANDLER_UI)):
            if self.handlers & bit and key not in cfg:
                cfg[key] = self.relays[bit]
        return cfg

    def _hooks(self, mod: types.ModuleType, cfg: Optional[dict]) -> None:
        """Give a module the host's handlers through its set_*_handler hooks, as
        in-process: at load (from its config) and whenever the handlers change."""
        for hook, key, attr, bit in _HOOKS:
            relay = cfg.get(key, self._relay(bit)) if cfg is not None else self._relay(bit)
            fn = getattr(mod, hook, None)
            try:
                if callable(fn):
                    fn(relay)
                if cfg is None and attr and hasattr(mod, attr):
                    setattr(mod, attr, relay)
            except Exception:
                # As in-process: a failing hook does not stop the load.
                pass

    def _load(self, index: int) -> types.ModuleType:
        stem = self._stem(index)
        name = (PERSISTENT_PREFIX + stem) if self.files else f"lcp_dynamic_{self.library}"
        try:
            if not self.entered:
                # Its own packages first; pipmaster.
                enter(self.environment)
                self.entered = True
            if self.files and name in PRELOADED:
                # Imported by the template (worker/template.py)
                PRELOADED.discard(name)
                mod = sys.modules[name]
            elif self.files:
                spec = importlib.util.spec_from_file_location(name, self.files[index])
                if spec is None or spec.loader is None:
                    raise ImportError(f"cannot import {self.files[index]}")
                mod = importlib.util.module_from_spec(spec)
                sys.modules[name] = mod
                run_file(mod, spec.loader, self.files[index], self.code, index)
            else:
                mod = types.ModuleType(name)
                sys.modules[name] = mod
                code = compile(self.source or "", f"<dynamic tool {self.library}>", "exec")
                exec(code, mod.__dict__)
            cfg = self._config(stem)
            self._hooks(mod, cfg)
            init_fn = getattr(mod, "init_tools_library", None)
            if callable(init_fn):
                if positional(init_fn):
                    init_fn(cfg)
                else:
                    init_fn()
        except BaseException as exc:
            sys.modules.pop(name, None)
            if isinstance(exc, SystemExit):
                what = f"called sys.exit({exc.code!r})"
            else:
                what = f"raised {type(exc).__name__}: {exc}"
            where = self.files[index] if self.files else "its code"
            raise LoadFailed(f"{what} while loading {where}\n" + traceback.format_exc()) from None
        self.modules[index] = mod
        return mod

    def _module(self, index: int) -> types.ModuleType:
        return self.modules[index] or self._load(index)

    def _entry(self, tool: str, index: int) -> Optional[_Entry]:
        entry = self.entries.get(tool)
        if entry is None:
            fn = getattr(self._module(index), tool, None)
            if not callable(fn):
                return None
            entry = self.entries[tool] = _Entry(fn)
        return entry

    def _enter(self, cwd: str, handlers: int) -> None:
        if handlers != self.handlers:
            self.handlers = handlers
            for mod in self.modules:
                if mod is not None:
                    self._hooks(mod, None)
        # Already there?  getcwd() is the kernel's path of the current directory, equal to
        # ``cwd`` only while that path leads to it: a removed workspace raises, a renamed one
        # (or one under a renamed parent) differs, and a recreated one is entered anew.
        # Half the cost of a chdir.
        try:
            if os.getcwd() == cwd:
                return
        except OSError:
            pass
        os.chdir(cwd)

    # ------------------------------------------------------------ calling
    # Each answers RESULT's fields: (value, outcome, detail).
    # (The warm call's path, kept in one frame: a call of a helper costs more than its branches.)
    def call(self, msg: P.Call) -> Answer:  # noqa: C901
        # Unpacked once.
        tool, file_index, params, cwd, injected, handlers, _ = msg
        try:
            self._enter(cwd, handlers)
        except OSError as exc:
            return (normalize.failure(f"[{self.library}] tool '{tool}' not run: cannot enter the "
                                      f"workspace {cwd!r} ({exc.strerror})."), OK, "")
        try:
            entry = self.entries.get(tool) or self._entry(tool, file_index)
        except LoadFailed as exc:
            return self._load_failure(tool, exc), LOAD_FAILED, ""
        if entry is None:
            return (normalize.failure(f"[{self.library}] Function '{tool}' not found in module."),
                    OK, "")

        if entry.var_kw:
            kwargs = {k: v for k, v in params.items() if k not in HOST_PARAMS}
        # A loop: a local read by a comprehension would be a cell made on every call.
        else:
            names = entry.names
            kwargs = {}
            for k, v in params.items():
                if k in names and k not in HOST_PARAMS:
                    kwargs[k] = v
        if entry.injectable:
            if injected:
                for k, v in injected.items():
                    if k in entry.injectable:
                        kwargs[k] = self.ch.wrap(v)
            if self.handlers & P.HANDLER_UI and "user_interaction_handler" in entry.injectable:
                kwargs["user_interaction_handler"] = self.relays[P.HANDLER_UI]

        self.in_tool = True
        try:
            # Signalled while the library loaded.
            if self.ch.interrupt_pending:
                self.ch.interrupt_pending = False
                raise ToolTimeout()
            out = entry.fn(**kwargs)
        except ToolTimeout:
            return None, TIMED_OUT, ""
        except MemoryError as exc:
            return None, OUT_OF_MEMORY, str(exc)
        except BaseException as exc:
            return normalize.crashed(tool, exc, traceback.format_exc()), OK, ""
        finally:
            self.in_tool = False
        try:
            return normalize.normalize(out, cwd), OK, ""
        except Exception as exc:
            return normalize.crashed(tool, exc, traceback.format_exc()), OK, ""

    def _load_failure(self, tool: str, exc: LoadFailed) -> dict:
        msg, _, tb = str(exc).partition("\n")
        return normalize.failure(
            f"Tool initialization failed for '{self.library}': the library {msg}. "
            f"The tool '{tool}' did not run; the library will be loaded again on the next call.",
            traceback=tb)

    def modcall(self, msg: P.ModCall) -> Answer:
        """A module-level function called by the host (e.g. init_tools_library again)."""
        try:
            self._enter(msg.cwd, msg.handlers)
            fn = getattr(self._module(msg.file_index), msg.fn)
            return fn(*self.ch.wrap(list(msg.args)), **self.ch.wrap(msg.kwargs)), OK, ""
        except LoadFailed as exc:
            why = f"library {self.library} failed to load: {exc}"
            return ["RuntimeError", [why]], LOAD_FAILED, ""
        except BaseException as exc:
            return error_value(exc), RAISED, ""

    def prompt(self, msg: P.Prompt) -> Answer:
        """A dynamic prompt provider; None when it is missing or fails (as in-process)."""
        try:
            self._enter(msg.cwd, msg.handlers)
            fn = getattr(self._module(msg.file_index), msg.fn, None)
            return str(fn()) if callable(fn) else None, OK, ""
        except Exception:
            return None, OK, ""

    def load(self, msg: P.Load) -> Answer:
        """Import every file of the library; the tool names each one defines."""
        try:
            self._enter(msg.cwd, msg.handlers)
            for i in range(len(self.modules)):
                self._module(i)
        except LoadFailed as exc:
            text, _, tb = str(exc).partition("\n")
            return [text, tb], LOAD_FAILED, ""
        except OSError as exc:
            return [f"cannot enter the workspace {msg.cwd!r} ({exc.strerror})", ""], LOAD_FAILED, ""
        return None, OK, ""

    def result(self, msg: tuple[Any, ...], value: Any, outcome: int, detail: str) -> bytes:
        """The RESULT frame answering ``msg``; a result the protocol cannot carry, or
        one over the cap, becomes a failure that says so (the worker is kept)."""
        try:
            frame = self.encoder.encode(P.RESULT, [value, outcome, detail])
        except P.Unsendable as exc:
            frame = self._failure(msg, f"its result could not be sent to the host ({exc}). "
                                       "The worker was kept.")
        if len(frame) > self.max_result:
            frame = self._failure(msg, f"its result is {len(frame) / 1048576:.1f} MB, over the "
                                       f"{self.max_result / 1048576:g} MB cap (max_result_mb); "
                                       "it was dropped and the worker was kept.")
        return frame

    def _failure(self, msg: tuple[Any, ...], what: str) -> bytes:
        """A RESULT saying ``what`` went wrong with the answer to ``msg``."""
        if type(msg) is P.Call:
            where = f"tool '{msg.tool}'"
        elif type(msg) is P.ModCall:
            where = f"function '{msg.fn}'"
        elif type(msg) is P.Prompt:
            where = f"prompt provider '{msg.fn}'"
        else:
            where = f"load '{self.library}'"
        return self.encoder.encode(P.RESULT, [normalize.failure(
            f"[{self.library}] {where}: {what}"), OK, ""])


# What this process's rehearsal ran (worker/rehearsal.py); READY says it.
REHEARSED: list[str] = []
# The worker of the session running (worker/spawned.py reads it)
ACTIVE: list[Worker] = []


def prime(msg: P.Prime) -> None:
    """A worker forked ahead sets its host's environment and sys.path while nobody
    waits: a fresh process pays for every putenv (page faults), so INIT only compares."""
    set_environment(msg.env)
    sys.path[:] = msg.sys_path


def session(conn: P.Connection, prepared: Optional[Callable[[], Any]] = None) -> None:
    """[PRIME,] INIT, READY, then calls until SHUTDOWN or EOF; raises what broke it.
    ``prepared`` runs once the worker is confined (a spawned worker's control thread:
    started earlier, it would keep what prepare() drops, per thread)."""
    kind, payload = conn.recv_frame()
    # Forked ahead: set now what INIT will say again.
    if kind == P.PRIME:
        prime(cast(P.Prime, P.loads_from_host(kind, payload)))
        kind, payload = conn.recv_frame()
    init = cast(P.Init, P.loads_from_host(kind, payload))
    report = prepare(init)
    if init.confine and init.confine.get("pid_guard"):
        # the host's guard of processes: its listener (or word of none) before READY
        from .confine.guard import hand_over
        hand_over(conn.sock)
    if prepared is not None:
        prepared()
    if REHEARSED:
        report["rehearsed"] = ", ".join(REHEARSED)
    worker = Worker(conn, init)
    ACTIVE[:] = [worker]
    ch = worker.ch

    def on_soft_timeout(signum: int, frame: Any) -> None:
        if worker.in_tool and not ch.waiting_host:
            raise ToolTimeout()
        # Loading the library, or waiting for the host: raised once.
        if ch.in_call:
            # The tool runs, or has the host's answer.
            ch.interrupt_pending = True
    # Before READY: the host may signal then.
    signal.signal(P.SOFT_TIMEOUT_SIGNAL, on_soft_timeout)
    conn.send_encoded(worker.ch.encoder.encode(P.READY, [report]))
    if refused(report, init.limits, init.confine is not None):
        # Fail closed: no call of this worker runs (the host says why)
        return
    serve_calls(conn, worker)


def serve_calls(conn: P.Connection, worker: Worker) -> None:
    """Answer the host's messages until SHUTDOWN or EOF (or a library that failed to load)."""
    ch, result, send = worker.ch, worker.result, conn.send_encoded
    recv, loads, spin, monotonic = conn.recv_frame, P.loads_from_host, conn.spin, time.monotonic
    ops: dict[int, Callable[[Any], Answer]] = {P.CALL: worker.call, P.MODCALL: worker.modcall,
                                               P.PROMPT: worker.prompt, P.LOAD: worker.load}
    while True:
        try:
            kind, payload = recv()
        except EOFError:
            return
        op = ops.get(kind)
        # SHUTDOWN
        if op is None:
            return
        msg: Any = loads(kind, payload)
        ch.call_seq += 1
        ch.in_call = True
        try:
            value, outcome, detail = op(msg)
        finally:
            ch.end_call()
        send(result(msg, value, outcome, detail))
        # The library failed to load: start afresh.
        if outcome == LOAD_FAILED:
            return
        # The host expects the next call soon.
        if kind == P.CALL and msg.spin_us:
            spin(monotonic() + msg.spin_us * 1e-6)


def serve(sock: socket.socket, connection: type[P.Connection] = P.Connection,
          prepared: Optional[Callable[[], Any]] = None) -> None:
    """Run the worker loop on a connected socket; never returns."""
    code = 0
    try:
        session(connection(sock), prepared)
    except BaseException:
        code = 70
        try:
            traceback.print_exc()
        except Exception:
            pass
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        pass
    os._exit(code)
